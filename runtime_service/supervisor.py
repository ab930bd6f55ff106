"""The one supervisor of a running worker, for program runs and plugin hosts alike.

From the hand-off to its end, a ``WorkerSupervisor`` owns what every worker needs whatever
it runs:

- **the memory budget**, applied to the run's cgroup at the hand-off: every process of the
  run and its shmem/tmpfs pages (``run_cgroup``);
- **the compute budget's meter** (``cpu_meter``), read on a timer whose next reading follows
  what is left of the budget; the owner's check says what is left (a run: of its one budget;
  a plugin host: of its busiest invocation, or of its background credit);
- **its end**: the exit -- or an out-of-memory kill of any other process of the run, seen on
  a CPU reading (a program must not go on with some of its processes missing) -- classified
  once (``exit_classification``), after the frames the worker sent before it and, for an
  interpreter that writes why to stderr just before it aborts, after that stderr;
- **its raw output** (fds 1 and 2): stderr watched for the language's heap-limit line and,
  for an owner that keeps raw output, decoded into log text;
- **its log lines**, charged against the output budget (``log_budget``): the first that does
  not fit ends the worker's output, and the owner hears it once.

The language enters through one seam, ``ExitSigns`` (what its worker says as it dies), given
with the worker. What is specific stays with the owner: a program run (``run.Run``) has one
terminal outcome, a wall-clock ceiling and binding calls; a plugin host (``plugin_host.
PluginHost``) lives on, with invocations that each have a compute budget, background CPU
charging and registrations. Each words the verdicts in its own terms.

Pure asyncio; never imports grpc.
"""

from __future__ import annotations

import asyncio
import codecs
import signal
from collections.abc import Callable

from runtime_service.budgets import Budgets
from runtime_service.cpu_meter import CpuMeter, next_cpu_poll_s
from runtime_service.exit_classification import (
    ExitSigns,
    HeapLimitWatch,
    WorkerExit,
    classify_exit,
)
from runtime_service.frame_reader import FrameLimits
from runtime_service.log_budget import LogAccount
from runtime_service.worker_process import FrameHandler, Listener, WorkerProcess

__all__ = ["CpuCheck", "ExitListener", "WorkerSupervisor"]

ExitListener = Callable[[WorkerExit], None]
CpuCheck = Callable[[float], float | None]
"""Given the busy CPU seconds since the hand-off: the seconds of compute budget left (when
to read again follows from it), or None to stop reading (the owner has ended)."""
TextListener = Callable[[str], None]
# An interpreter that aborts at its heap limit wrote why to stderr just before: this long is
# waited for that stderr to be read before the exit is classified.
_ABORT_STDERR_S = 1.0


class WorkerSupervisor:
    """Supervises one worker for its owner (a run or a plugin host), from ``hand_off`` to
    ``stop``."""

    def __init__(
        self,
        worker: WorkerProcess,
        budgets: Budgets,
        signs: ExitSigns,
        *,
        logs: LogAccount,
        on_exit: ExitListener,
        on_output_exceeded: Listener,
        on_text: TextListener | None = None,
    ) -> None:
        """``logs``: the account log lines are charged to; ``on_exit``: the verdict on the
        worker's end, once; ``on_output_exceeded``: the first line over the output budget,
        once; ``on_text``: what the worker writes to fds 1/2 as text (else it is dropped)."""
        self.worker = worker
        self.budgets = budgets
        self.cpu = CpuMeter(worker)
        self._signs = signs
        self._heap = HeapLimitWatch(signs)
        self._logs = logs
        self._on_exit = on_exit
        self._on_output_exceeded = on_output_exceeded
        self._on_text = on_text
        self._decoders: dict[int, codecs.BufferedIncrementalDecoder] = {}
        self._check: CpuCheck | None = None
        self._cpu_timer: asyncio.TimerHandle | None = None
        self._over = False  # a verdict went out, or the owner stopped: nothing more does
        self.output_exceeded = False
        """Whether the worker's output went over its budget (nothing more is admitted)."""

    # -- the hand-off ------------------------------------------------------------------------
    def hand_off(self) -> str | None:
        """The worker is its owner's from now: its memory budget is applied (it is known only
        now; it covers every process of the run before the program exists) and its CPU counts
        from here. Returns why the budget could not be applied (the owner ends the worker)."""
        problem: str | None = None
        cgroup = self.worker.cgroup
        if cgroup is not None:
            try:
                cgroup.set_memory_limit(self.budgets.memory_bytes)
            except OSError as exc:
                problem = str(exc.strerror or exc)
            cgroup.mark_start(reused=self.worker.runs_served > 0)
        self.cpu.start()
        return problem

    def listen(self, on_frame: FrameHandler, on_channel_eof: Listener, limits: FrameLimits) -> None:
        """Read the worker's channel (within ``limits``) and its pipes; watch for its exit."""
        worker = self.worker
        if self._on_text is not None:
            self._decoders = {
                fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in worker.output_fds
            }
        worker.listen(on_frame, on_channel_eof, self._on_output, limits)
        worker.exited.add_done_callback(self._exited)

    # -- the compute budget ------------------------------------------------------------------
    def meter_cpu(self, check: CpuCheck, remaining_s: float) -> None:
        """Read the worker's CPU from now on, first when ``remaining_s`` of budget could run
        out, then as ``check`` says (it gets the seconds spent since the hand-off)."""
        self._check = check
        self._schedule(remaining_s)

    def _schedule(self, remaining_s: float) -> None:
        if self._cpu_timer is not None:
            self._cpu_timer.cancel()
        delay = next_cpu_poll_s(remaining_s)
        self._cpu_timer = asyncio.get_running_loop().call_later(delay, self._read_cpu)

    def _read_cpu(self) -> None:
        self._cpu_timer = None
        if self._over or self._check is None:
            return
        cgroup = self.worker.cgroup
        if cgroup is not None and cgroup.oom_killed():
            # Another process of the run, perhaps: the worker ends for it all the same.
            self._end(WorkerExit(None, out_of_memory=True, oom_killer=True))
            return
        remaining = self._check(self.cpu.spent_s())
        if remaining is not None and not self._over:
            self._schedule(remaining)

    # -- its end -----------------------------------------------------------------------------
    def _exited(self, exited: asyncio.Future[int]) -> None:
        if self._over:
            return
        status = None if exited.cancelled() else exited.result()
        # Whatever the worker sent before it exited is already queued on the channel.
        self.worker.read_pending()
        if self._over:
            return
        if status == -signal.SIGABRT and self._heap.watching and self.worker.outputs_open:
            drained = asyncio.ensure_future(self.worker.drain_outputs(_ABORT_STDERR_S))
            drained.add_done_callback(lambda _: self._classify(status))
            return
        self._classify(status)

    def _classify(self, status: int | None) -> None:
        if self._over:
            return
        cgroup = self.worker.cgroup
        oom_killed = cgroup is not None and cgroup.oom_killed()
        heap = self._heap.seen
        self._end(
            classify_exit(status, self._signs, oom_killed=oom_killed, heap_limit_reached=heap)
        )

    def _end(self, verdict: WorkerExit) -> None:
        self._finish()
        self._on_exit(verdict)

    def _finish(self) -> None:
        """No more CPU readings or verdicts."""
        self._over = True
        if self._cpu_timer is not None:
            self._cpu_timer.cancel()
            self._cpu_timer = None

    def stop(self) -> None:
        """The owner is done: no more CPU readings or verdicts, the channel is no longer read
        (the pipes drain on, their text still charged)."""
        self._finish()
        self.worker.exited.remove_done_callback(self._exited)
        self.worker.stop_listening()

    def terminate(self) -> None:
        """SIGKILL every process of the worker; it is reaped (and everything it held released)
        in the background once it has exited."""
        self.worker.signal_group()
        self.worker.close_when_exited()

    # -- output ------------------------------------------------------------------------------
    def _on_output(self, fd: int, data: bytes) -> None:
        """Raw writes to fds 1/2 (``data`` empty: the pipe ended)."""
        if fd == self.worker.output_fds[1]:
            self._heap.feed(data)
        if self._on_text is not None:
            # "replace" decoding yields valid UTF-8 text, like ``ledger.valid_text``.
            text = self._decoders[fd].decode(data, final=not data)
            if text:
                self._on_text(text)

    def admit_log(self, text: str) -> bool:
        """Charge one log line against the output budget; True when it fits (deliver it)."""
        if self.output_exceeded:
            return False
        if self._logs.admit_log(text):
            return True
        self.exceed_output()
        return False

    def exceed_output(self) -> None:
        """The worker's output is over its budget: a line that did not fit, or a frame or the
        worker's own count that says so. The owner hears it once; nothing more is admitted."""
        if not self.output_exceeded:
            self.output_exceeded = True
            self._on_output_exceeded()
