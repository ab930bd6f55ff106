"""One program run driven to exactly one terminal outcome (the first one observed wins).

Pure asyncio; never imports grpc. The worker is a hostile peer: every message is rebuilt by
``protocol.parse_worker_message``, junk is dropped, each call id is answered at most once
(ids must increase), and everything it says -- real or forged -- is charged to the same output
ledger.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from codemode_wire import jsonvalue
from runtime_service.budgets import Budgets
from runtime_service.exit_classification import ExitSigns, WorkerExit
from runtime_service.frame_decoding import (
    LARGE_FRAME_BYTES,
    Decoded,
    decode,
    decode_frame,
    decoding_pool,
)
from runtime_service.frame_reader import FrameEvent, FrameLimits, Oversized
from runtime_service.kept_hosts import HostKeeper
from runtime_service.outcome import (
    BindingCall,
    BindingHandler,
    BindingResult,
    FailureKind,
    LogListener,
    PendingCall,
    RunFailure,
    RunResult,
)
from runtime_service.protocol import (
    CallMessage,
    DoneMessage,
    LogMessage,
    OutputLimitMessage,
    parse_worker_message,
    partial_log_text,
)
from runtime_service.supervisor import WorkerSupervisor
from runtime_service.worker import flatwire
from runtime_service.worker.framing import LOSSY_ARGUMENTS, LOSSY_COMPLETION
from runtime_service.worker.ledger import OutputLedger
from runtime_service.worker_process import WorkerCapacityError, WorkerLaunchError, WorkerProcess

__all__ = [
    "DEFAULT_MAX_CALL_BYTES",
    "DRAIN_TIMEOUT_S",
    "EXPIRED_MESSAGE",
    "Run",
    "RunRequest",
]

_log = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 1.0  # a safety net: pipes still open this long after the kill are cut
EXPIRED_MESSAGE = "deadline passed before the run started"
DEFAULT_MAX_CALL_BYTES = 96 << 20  # the gRPC message limit's default (max_message_bytes)


@dataclass(frozen=True, slots=True)
class RunRequest:
    program: str
    bindings: frozenset[str]
    budgets: Budgets
    wall_ms: int
    """Effective wall-clock ceiling: the budget, lowered by the caller's deadline (0 when
    that deadline has already passed: the run then times out without taking a worker)."""
    max_call_bytes: int = DEFAULT_MAX_CALL_BYTES
    """The most JSON bytes of one call's arguments the caller can be sent (its message
    limit): a call frame beyond it fails unread."""

    def frame_limits(self) -> FrameLimits:
        budgets = self.budgets
        return FrameLimits(budgets.max_output_bytes, self.max_call_bytes, budgets.memory_bytes)


@dataclass(frozen=True, slots=True)
class _Terminal:
    error: RunFailure | None
    has_value: bool = False
    value: object = None
    value_size: int | None = None
    """The value's ledger size, when measured off the loop (large frames)."""
    value_json: str | None = None


class Run:
    """Drives one program in one never-used worker."""

    def __init__(
        self,
        request: RunRequest,
        acquire: Callable[[], Awaitable[WorkerProcess]],
        handler: BindingHandler,
        on_log: LogListener | None = None,
        take_idle: Callable[[], WorkerProcess | None] | None = None,
        *,
        exit_signs: ExitSigns,
        keeper: HostKeeper | None = None,
    ) -> None:
        """``exit_signs``: what the worker's language says as it dies (``ExitSigns``);
        ``keeper``: the tenant's kept hosts, for a language that keeps one (``kept_hosts``):
        the run takes one of them first, and gives its worker back after a clean end."""
        self.request = request
        self._keeper = keeper
        self._ended_clean = False  # the worker's own completion settled it: success, exception
        self._parked = False  # the worker lives on as its tenant's kept host
        self._exit_signs = exit_signs
        self._acquire = acquire
        self._take_idle = take_idle  # a ready worker at once, if the pool has one
        self._wall_deadline = 0.0  # loop time: the wall budget counts from execute()
        self._handler = handler
        self._on_log = on_log
        self._ledger = OutputLedger(request.budgets.max_output_bytes)
        self._terminal: _Terminal | None = None
        self._settled: asyncio.Future[None] | None = None
        self._worker: WorkerProcess | None = None
        self._supervisor: WorkerSupervisor | None = None
        self._last_call_id = 0
        self._next_seq = 1
        self._calls: dict[int, asyncio.Future[Any] | PendingCall] = {}
        # Frames waiting behind a large one that is being decoded off the loop, in order.
        self._backlog: collections.deque[FrameEvent] = collections.deque()
        self._draining: asyncio.Task[None] | None = None
        self._exit: WorkerExit | None = None  # an exit seen while the backlog drained
        self._started = False
        self.spawned = False

    # -- public ------------------------------------------------------------------------------
    @property
    def settled(self) -> bool:
        return self._terminal is not None

    async def worker_gone(self) -> None:
        """Wait until the run's worker (if any) and all its descendants have exited."""
        if self._worker is not None and not self._parked:
            await asyncio.shield(self._worker.closed)

    def abort(self, reason: str) -> None:
        """End the run with ``abort`` unless another outcome already won."""
        self._settle(_Terminal(RunFailure("abort", reason)))

    async def execute(self) -> RunResult:
        """Run the program and return its result. Never raises for program outcomes."""
        if self._started:
            raise RuntimeError("a run executes once")
        self._started = True
        loop = asyncio.get_running_loop()
        self._settled = loop.create_future()
        self._wall_deadline = loop.time() + self.request.wall_ms / 1000
        if self.request.wall_ms <= 0:
            self._settle(_Terminal(RunFailure("timeout", EXPIRED_MESSAGE)))
        if self._terminal is not None:  # aborted or expired before it started: spawn nothing
            return self._materialize()
        keeper = self._keeper
        worker = keeper.take() if keeper is not None else None
        if worker is None and keeper is not None:
            # Every host the tenant may keep is busy: one given back soon serves this run
            # (``kept_hosts.py``), within its wall budget; an abort ends the wait.
            assert self._settled is not None
            worker = await keeper.wait(self._settled, self._wall_deadline)
            if worker is None and self._terminal is not None:
                return self._materialize()
        kept = worker is not None
        if worker is None and self._take_idle is not None:
            worker = self._take_idle()
        if worker is None:
            try:
                worker = await self._boot()
            except WorkerCapacityError:
                raise  # no sandbox is free: not the program's outcome, nothing ran
            except WorkerLaunchError as exc:
                self._settle(_Terminal(RunFailure("worker-exit", str(exc))))
                return self._materialize()
            if worker is None:  # aborted or out of time while the worker booted
                return self._materialize()
        self.spawned = not kept
        self._worker = worker
        if keeper is not None and not kept:
            keeper.adopt(worker)  # kept after the run if the tenant may hold one more host
        if self._terminal is not None:  # aborted while the worker was being acquired
            if keeper is not None:
                keeper.give_back(worker, clean=False)
            worker.signal_group()
            worker.close_when_exited()
            return self._materialize()
        return await self._drive(worker)

    async def _boot(self) -> WorkerProcess | None:
        """A worker that has to be waited for (spawned, or a pool refill): an abort or the
        run's wall deadline ends the wait, and the half-booted worker is killed (None)."""
        assert self._settled is not None
        loop = asyncio.get_running_loop()
        wall = loop.call_at(self._wall_deadline, self._settle, self._wall_terminal())
        booting = asyncio.ensure_future(self._acquire())
        try:
            waits: set[asyncio.Future[Any]] = {booting, self._settled}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wall.cancel()
        if booting.done():
            return booting.result()
        booting.cancel()  # a cancelled spawn kills its process
        with contextlib.suppress(asyncio.CancelledError, WorkerLaunchError):
            await booting
        return None

    def _wall_terminal(self) -> _Terminal:
        ceiling = f"wall-clock ceiling reached ({self.request.wall_ms}ms)"
        return _Terminal(RunFailure("timeout", ceiling))

    # -- driving -----------------------------------------------------------------------------
    async def _drive(self, worker: WorkerProcess) -> RunResult:
        budgets = self.request.budgets
        loop = asyncio.get_running_loop()
        assert self._settled is not None
        supervisor = self._supervisor = WorkerSupervisor(
            worker,
            budgets,
            self._exit_signs,
            logs=self._ledger,
            on_exit=self._on_worker_exit,
            on_output_exceeded=self._output_exceeded,
            on_text=self._on_output_text,
        )
        problem = supervisor.hand_off()
        if problem is not None:
            message = f"cannot apply the run's memory budget: {problem}"
            self._settle(_Terminal(RunFailure("worker-exit", message)))
        supervisor.listen(
            partial(self._handle, worker), self._on_channel_eof, self.request.frame_limits()
        )
        wall = loop.call_at(self._wall_deadline, self._settle, self._wall_terminal())
        supervisor.meter_cpu(self._check_cpu, budgets.compute_ms / 1000)
        # The program starts last: the worker runs on at once (often on this CPU), so nothing
        # of ours should be left to do between this send and waiting for its messages.
        if self._terminal is None:
            worker.send(
                {
                    "t": "start",
                    "program": self.request.program,
                    "bindings": sorted(self.request.bindings),
                    "max_output_bytes": budgets.max_output_bytes,
                    "memory_bytes": budgets.memory_bytes,
                    "cpu_seconds": budgets.compute_ms / 1000,
                }
            )
        try:
            await self._settled
        finally:
            wall.cancel()
            supervisor.stop()
            for call in self._calls.values():
                call.cancel()
            clean = self._ended_clean and not self._overflowed and self._draining is None
            keeper = self._keeper
            self._parked = keeper is not None and keeper.give_back(worker, clean)
            if not self._parked:
                # Terminate: SIGKILL the whole group (the worker can run no more code), then
                # drain the pipes to their end -- every byte written before the kill is
                # charged -- and only then materialize. Reaping and cleanup follow in the
                # background; the pool tracks the worker until it is gone. (A worker kept for
                # its tenant's next run lives on: its channel and pipes are that run's.)
                supervisor.terminate()
                if worker.outputs_open:  # usually already ended: the worker closes them first
                    await asyncio.shield(worker.drain_outputs(DRAIN_TIMEOUT_S))
        if self._ledger.used > LARGE_FRAME_BYTES:
            # Cutting megabytes of logs to the budget is seconds of work for some texts: off
            # the loop, like a large frame's decoding. Nothing touches the ledger any more.
            return await loop.run_in_executor(decoding_pool(), self._materialize)
        return self._materialize()

    def _settle(self, terminal: _Terminal) -> None:
        if self._terminal is not None:
            return
        self._terminal = terminal
        if self._settled is not None and not self._settled.done():
            self._settled.set_result(None)

    def _on_channel_eof(self) -> None:
        return None  # the exit (or a budget) settles the run

    def _on_worker_exit(self, verdict: WorkerExit) -> None:
        if self._draining is not None and verdict.status is not None:
            self._exit = verdict  # settled once the frames before the exit count
            return
        self._settle(_Terminal(RunFailure("worker-exit", self._exit_message(verdict))))

    def _exit_message(self, verdict: WorkerExit) -> str:
        mib = self.request.budgets.memory_bytes / (1 << 20)
        if verdict.oom_killer:
            return (
                f"run exceeded its memory budget ({mib:g} MiB, all its processes and their "
                "shared-memory and /tmp pages together): the kernel's out-of-memory killer "
                "ended it"
            )
        if verdict.out_of_memory:
            return f"worker exceeded its memory budget ({mib:g} MiB)"
        if verdict.crashed:
            return "the worker's interpreter process crashed before completing"
        if verdict.signal_name is not None:
            return f"worker killed by signal {verdict.signal_name} before completing"
        return f"worker exited with code {verdict.status} before completing"

    def _check_cpu(self, spent_s: float) -> float | None:
        """The run's one compute budget (``WorkerSupervisor.meter_cpu``)."""
        if self._terminal is not None:
            return None
        budget_ms = self.request.budgets.compute_ms
        if spent_s * 1000 > budget_ms:
            message = f"compute budget exhausted ({budget_ms}ms busy)"
            self._settle(_Terminal(RunFailure("timeout", message)))
            return None
        return budget_ms / 1000 - spent_s

    def _on_output_text(self, text: str) -> None:
        """Raw writes to fds 1/2 become log entries, charged like any other log."""
        try:
            self._admit_log(text)
        except Exception as exc:
            self._handling_failed(exc)

    def _handling_failed(self, exc: Exception) -> None:
        """A bug of ours (or of a listener) while handling worker output: end the run with
        a clear outcome now rather than drop the frame -- and perhaps the completion read
        with it -- and leave the run to its wall-clock ceiling."""
        _log.error("run failed while handling worker output", exc_info=exc)
        message = f"the runtime could not handle the worker's output ({type(exc).__name__})"
        self._settle(_Terminal(RunFailure("invalid-output", message)))

    # -- messages ----------------------------------------------------------------------------
    def _handle(self, worker: WorkerProcess, event: FrameEvent) -> None:
        if self._terminal is not None:
            return  # nothing the worker says after the outcome counts
        if self._draining is not None or _is_large(event):
            # Off the loop, in order: everything behind a large frame waits for it.
            self._backlog.append(event)
            if self._draining is None:
                self._draining = asyncio.get_running_loop().create_task(self._drain(worker))
            return
        try:
            self._dispatch(worker, event)
        except Exception as exc:
            self._handling_failed(exc)

    async def _drain(self, worker: WorkerProcess) -> None:
        loop = asyncio.get_running_loop()
        max_output = self.request.budgets.max_output_bytes
        try:
            while self._backlog and self._terminal is None:
                event = self._backlog.popleft()
                if isinstance(event, Oversized) and _is_large(event):
                    # A hostile worker's frame can make the fitting prefix of its log cost as
                    # much to find as a large frame to decode.
                    text = await loop.run_in_executor(
                        decoding_pool(), partial_log_text, event.head, self._log_room_spelled()
                    )
                    if self._terminal is None:
                        self._overflowing_log(text)
                elif _is_large(event):
                    assert type(event) is bytes
                    decoded = await loop.run_in_executor(
                        decoding_pool(), decode_frame, event, max_output
                    )
                    if self._terminal is None:
                        self._dispatch_decoded(worker, decoded)
                else:
                    self._dispatch(worker, event)
        except Exception as exc:
            self._handling_failed(exc)
        finally:
            self._draining = None
            self._backlog.clear()
            if self._exit is not None:
                self._on_worker_exit(self._exit)

    def _dispatch(self, worker: WorkerProcess, event: FrameEvent) -> None:
        if isinstance(event, Oversized):
            self._oversized(worker, event)
            return
        message = parse_worker_message(event)
        if isinstance(message, CallMessage | DoneMessage):
            max_output = self.request.budgets.max_output_bytes
            self._dispatch_decoded(worker, decode(message, max_output, spell=False))
        else:
            self._dispatch_decoded(worker, Decoded(message))

    def _dispatch_decoded(self, worker: WorkerProcess, decoded: Decoded) -> None:
        message = decoded.message
        if isinstance(message, CallMessage):
            self._start_call(worker, message, decoded)
        elif isinstance(message, DoneMessage):
            terminal = self._completion(message, decoded)
            if self._terminal is None:
                error = terminal.error
                self._ended_clean = error is None or error.kind == "exception"
            self._settle(terminal)
        elif isinstance(message, LogMessage):
            self._admit_log(message.text)
        elif isinstance(message, OutputLimitMessage):
            self._exceed_output()  # the worker's own count

    def _oversized(self, worker: WorkerProcess, frame: Oversized) -> None:
        """A frame over its bound, given up on unread (``frame_reader``)."""
        if frame.kind == "output":
            self._overflowing_log(partial_log_text(frame.head, self._log_room_spelled()))
            return
        if self._new_call_id(frame.call_id):
            limit = self.request.max_call_bytes
            message = (
                f"binding arguments are too large to send: more than {limit} bytes of JSON, "
                f"over the runtime's limit (max_message_bytes {limit})"
            )
            self._reply(worker, frame.call_id, BindingResult.failure(message))

    def _log_room_spelled(self) -> int:
        """How much of an overflowing log's spelled text is enough to cross the room left (a
        ledger byte is at most 3 spelled bytes)."""
        return 3 * max(self._ledger.remaining_for_entry() + 1, 0) + 12

    def _overflowing_log(self, text: str | None) -> None:
        """A log over the room left keeps its fitting prefix, as any overflowing log does, and
        ends the run ``output-limit``."""
        if text is not None:
            self._admit_log(text)
        self._exceed_output()

    def _completion(self, done: DoneMessage, decoded: Decoded) -> _Terminal:
        if done.error is not None:
            kind, text = done.error
            if kind == "output-limit":
                self._exceed_output()
            return _Terminal(RunFailure(_failure_kind(kind), text))
        if not done.has_value:
            return _Terminal(None)
        if decoded.problem is not None:
            detail = f": {decoded.problem}" if decoded.problem else ""
            return _Terminal(RunFailure("invalid-output", f"{LOSSY_COMPLETION}{detail}"))
        size = decoded.value_size or None  # measured off the loop (large frames only)
        return _Terminal(None, True, decoded.value, size, decoded.value_json)

    def _admit_log(self, text: str) -> None:
        assert self._supervisor is not None
        admitted = self._supervisor.admit_log(text)
        if admitted and self._on_log is not None and self._terminal is None:
            self._on_log(text)

    def _exceed_output(self) -> None:
        assert self._supervisor is not None
        self._supervisor.exceed_output()

    def _output_exceeded(self) -> None:
        """The output budget is spent (``WorkerSupervisor.exceed_output``): ``output-limit``."""
        self._settle(_Terminal(RunFailure("output-limit", "")))

    @property
    def _overflowed(self) -> bool:
        return self._supervisor is not None and self._supervisor.output_exceeded

    def _new_call_id(self, call_id: int) -> bool:
        # The worker numbers its calls 1, 2, 3, ...: an id not above the last one is a
        # duplicate (or forged) and is ignored. One number, not a set of every id seen,
        # keeps each id answered at most once in constant memory however long the run.
        if call_id <= self._last_call_id:
            return False
        self._last_call_id = call_id
        return True

    def _start_call(self, worker: WorkerProcess, call: CallMessage, decoded: Decoded) -> None:
        if not self._new_call_id(call.call_id):
            return
        limit = self.request.budgets.max_outstanding_calls
        if len(self._calls) >= limit:
            self._reply(
                worker,
                call.call_id,
                BindingResult.failure(f"too many outstanding binding calls (limit {limit})"),
            )
            return
        if call.name not in self.request.bindings:
            self._reply(
                worker, call.call_id, BindingResult.failure(f'unknown binding "tools.{call.name}"')
            )
            return
        if decoded.problem is not None:
            detail = f": {decoded.problem}" if decoded.problem else ""
            self._reply(worker, call.call_id, BindingResult.failure(LOSSY_ARGUMENTS + detail))
            return
        arguments = decoded.value
        seq = self._next_seq
        self._next_seq += 1
        binding_call = BindingCall(seq, call.name, arguments, decoded.value_json)
        try:
            pending = self._handler(binding_call)
        except Exception as exc:  # a failing handler is a failed call
            self._reply(worker, call.call_id, _handler_failure(exc))
            return
        if isinstance(pending, PendingCall):
            # Answered synchronously from the handler's resolve: no event-loop hop at all.
            self._calls[call.call_id] = pending
            pending.on_result(partial(self._answer_now, worker, call.call_id))
            return
        # A handler that hands back a plain future is answered from its done callback: one
        # event-loop hop fewer per call than wrapping it in a task.
        future = pending if asyncio.isfuture(pending) else asyncio.ensure_future(pending)
        self._calls[call.call_id] = future
        future.add_done_callback(partial(self._answer, worker, call.call_id))

    def _answer_now(self, worker: WorkerProcess, call_id: int, result: BindingResult) -> None:
        self._calls.pop(call_id, None)
        if type(result) is not BindingResult:
            result = BindingResult.failure("binding handler returned no result")
        self._reply(worker, call_id, result)

    def _answer(self, worker: WorkerProcess, call_id: int, future: asyncio.Future[Any]) -> None:
        self._calls.pop(call_id, None)
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            result = _handler_failure(error)
        else:
            result = future.result()
            if type(result) is not BindingResult:
                result = BindingResult.failure("binding handler returned no result")
        self._reply(worker, call_id, result)

    def _reply(self, worker: WorkerProcess, call_id: int, result: BindingResult) -> None:
        if self._terminal is not None:
            return  # replies are suppressed once the run is over
        if result.ok:
            try:
                tokens = _reply_tokens(result)
                worker.queue({"t": "reply", "id": call_id, "ok": True, "value": tokens}, "value")
                return
            except (flatwire.WireError, ValueError):  # ValueError: the text is not lossless
                # JSON, or framing refused it (an integer beyond int_max_str_digits, a frame
                # over the size cap)
                result = BindingResult.failure("binding resolution must be lossless JSON")
        # Replies ready in the same loop turn (a batch of results, the refusals of a batch of
        # calls) reach the worker in one write (``WorkerProcess.queue``).
        worker.queue({"t": "reply", "id": call_id, "ok": False, "message": result.message})

    # -- result ------------------------------------------------------------------------------
    def _materialize(self) -> RunResult:
        terminal = self._terminal
        assert terminal is not None
        ledger = self._ledger
        if not self._overflowed and terminal.error is not None:
            if terminal.error.kind != "output-limit" and ledger.fits_message(
                terminal.error.message
            ):
                return RunResult(list(ledger.logs), error=terminal.error)
        elif not self._overflowed and terminal.has_value:
            size = terminal.value_size
            if ledger.fits_value(terminal.value) if size is None else ledger.fits_size(size):
                return RunResult(
                    list(ledger.logs),
                    has_value=True,
                    value=terminal.value,
                    value_json=terminal.value_json,
                )
        elif not self._overflowed:
            return RunResult(list(ledger.logs))
        logs, message = ledger.overflow_logs()
        return RunResult(logs, error=RunFailure("output-limit", message))


def _reply_tokens(result: BindingResult) -> list[Any]:
    """A success's value as flat-wire tokens. The caller's JSON text goes to the worker unread
    where the worker's reading of it is provably the runtime's (``flatwire.json_token``): a
    large value costs no parse and no re-spelling here."""
    text = result.value_json
    if text is None:
        return flatwire.encode(result.value)
    tokens = flatwire.json_token(text)
    return flatwire.encode(jsonvalue.loads(text)) if tokens is None else tokens


def _handler_failure(error: BaseException) -> BindingResult:
    return BindingResult.failure(str(error) or type(error).__name__)


def _failure_kind(kind: str) -> FailureKind:
    if kind == "invalid-output":
        return "invalid-output"
    if kind == "output-limit":
        return "output-limit"
    return "exception"


def _is_large(event: FrameEvent) -> bool:
    """Whether handling ``event`` is big work, done on the decoding threads and in order."""
    if isinstance(event, Oversized):
        return len(event.head) > LARGE_FRAME_BYTES
    return type(event) is bytes and len(event) > LARGE_FRAME_BYTES
