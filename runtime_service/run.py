"""One program run driven to exactly one terminal outcome (the first one observed wins).

Pure asyncio; never imports grpc. The worker is a hostile peer: every message is rebuilt by
``protocol.parse_worker_message``, junk is dropped, each call id is answered at most once,
and everything it says -- real or forged -- is charged to the same output ledger.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from runtime_service.budgets import Budgets
from runtime_service.outcome import (
    BindingCall,
    BindingHandler,
    BindingResult,
    FailureKind,
    LogListener,
    RunFailure,
    RunResult,
)
from runtime_service.protocol import (
    CallMessage,
    DoneMessage,
    LogMessage,
    OutputLimitMessage,
    parse_worker_message,
)
from runtime_service.worker import flatwire
from runtime_service.worker.framing import EXIT_OUT_OF_MEMORY
from runtime_service.worker.ledger import OutputLedger
from runtime_service.worker_process import WorkerLaunchError, WorkerProcess

__all__ = ["CPU_POLL_INTERVAL_S", "DRAIN_TIMEOUT_S", "Run", "RunRequest"]

CPU_POLL_INTERVAL_S = 0.025  # a compute timeout may overshoot the budget by one interval
DRAIN_TIMEOUT_S = 1.0  # pipes held open by escaped descendants stop being drained after this
_EXIT_GRACE_S = 0.2  # lets the channel deliver a completion already sent before the exit


@dataclass(frozen=True, slots=True)
class RunRequest:
    program: str
    bindings: frozenset[str]
    budgets: Budgets
    wall_ms: int
    """Effective wall-clock ceiling: the budget, lowered by the caller's deadline."""


@dataclass(frozen=True, slots=True)
class _Terminal:
    error: RunFailure | None
    has_value: bool = False
    value: object = None


class Run:
    """Drives one program in one never-used worker."""

    def __init__(
        self,
        request: RunRequest,
        acquire: Callable[[], Awaitable[WorkerProcess]],
        handler: BindingHandler,
        on_log: LogListener | None = None,
    ) -> None:
        self.request = request
        self._acquire = acquire
        self._handler = handler
        self._on_log = on_log
        self._ledger = OutputLedger(request.budgets.max_output_bytes)
        self._overflowed = False
        self._terminal: _Terminal | None = None
        self._settled: asyncio.Event | None = None
        self._worker: WorkerProcess | None = None
        self._seen_ids: set[int] = set()
        self._next_seq = 1
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._started = False
        self.spawned = False

    # -- public ------------------------------------------------------------------------------
    @property
    def settled(self) -> bool:
        return self._terminal is not None

    def abort(self, reason: str) -> None:
        """End the run with ``abort`` unless another outcome already won."""
        self._settle(_Terminal(RunFailure("abort", reason)))

    async def execute(self) -> RunResult:
        """Run the program and return its result. Never raises for program outcomes."""
        if self._started:
            raise RuntimeError("a run executes once")
        self._started = True
        self._settled = asyncio.Event()
        if self._terminal is not None:  # aborted before it started: spawn nothing
            return self._materialize()
        try:
            worker = await self._acquire()
        except WorkerLaunchError as exc:
            self._settle(_Terminal(RunFailure("worker-exit", str(exc))))
            return self._materialize()
        self.spawned = True
        self._worker = worker
        if self._terminal is not None:  # aborted while the worker was being acquired
            await worker.kill()
            return self._materialize()
        return await self._drive(worker)

    # -- driving -----------------------------------------------------------------------------
    async def _drive(self, worker: WorkerProcess) -> RunResult:
        budgets = self.request.budgets
        loop = asyncio.get_running_loop()
        baseline = worker.cpu_seconds() or 0.0
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
        channel_eof = asyncio.Event()
        pipes = [
            asyncio.create_task(self._read_pipe(stream))
            for stream in (worker.process.stdout, worker.process.stderr)
            if stream is not None
        ]
        watchers = [
            asyncio.create_task(self._read_channel(worker, channel_eof)),
            asyncio.create_task(self._watch_exit(worker, channel_eof)),
            asyncio.create_task(self._poll_cpu(worker, baseline)),
        ]
        wall = loop.call_later(
            self.request.wall_ms / 1000,
            self._settle,
            _Terminal(
                RunFailure("timeout", f"wall-clock ceiling reached ({self.request.wall_ms}ms)")
            ),
        )
        try:
            assert self._settled is not None
            await self._settled.wait()
        finally:
            wall.cancel()
            for task in watchers:
                task.cancel()
            for call in self._calls.values():
                call.cancel()
            # Let bytes already queued on the pipes arrive, then kill and drain.
            await asyncio.sleep(0)
            await asyncio.shield(worker.kill())
            _, stuck = await asyncio.wait(pipes, timeout=DRAIN_TIMEOUT_S)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*watchers, *stuck, *self._calls.values(), return_exceptions=True)
        return self._materialize()

    def _settle(self, terminal: _Terminal) -> None:
        if self._terminal is not None:
            return
        self._terminal = terminal
        if self._settled is not None:
            self._settled.set()

    async def _read_channel(self, worker: WorkerProcess, eof: asyncio.Event) -> None:
        try:
            while True:
                data = await worker.reader.read(1 << 16)
                if not data:
                    return
                for payload in worker.frames.feed(data):
                    if self._terminal is not None:
                        return
                    self._handle(worker, payload)
        except (ConnectionError, OSError):
            return
        finally:
            eof.set()

    async def _watch_exit(self, worker: WorkerProcess, channel_eof: asyncio.Event) -> None:
        status = await worker.process.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(channel_eof.wait(), _EXIT_GRACE_S)
        self._settle(_Terminal(RunFailure("worker-exit", self._exit_message(status))))

    def _exit_message(self, status: int) -> str:
        if status == EXIT_OUT_OF_MEMORY:
            mib = self.request.budgets.memory_bytes / (1 << 20)
            return f"worker exceeded its memory budget ({mib:g} MiB)"
        if status < 0:
            return f"worker killed by signal {_signal_name(-status)} before completing"
        return f"worker exited with code {status} before completing"

    async def _poll_cpu(self, worker: WorkerProcess, baseline: float) -> None:
        budget_ms = self.request.budgets.compute_ms
        while True:
            await asyncio.sleep(CPU_POLL_INTERVAL_S)
            used = worker.cpu_seconds()
            if used is not None and (used - baseline) * 1000 > budget_ms:
                message = f"compute budget exhausted ({budget_ms}ms busy)"
                self._settle(_Terminal(RunFailure("timeout", message)))
                return

    async def _read_pipe(self, stream: asyncio.StreamReader) -> None:
        """Raw writes to fds 1/2 become log entries, charged like any other log."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            data = await stream.read(1 << 16)
            text = decoder.decode(data, final=not data)
            if text:
                self._admit_log(text)
            if not data:
                return

    # -- messages ----------------------------------------------------------------------------
    def _handle(self, worker: WorkerProcess, payload: bytes) -> None:
        message = parse_worker_message(payload)
        if isinstance(message, LogMessage):
            self._admit_log(message.text)
        elif isinstance(message, CallMessage):
            self._start_call(worker, message)
        elif isinstance(message, DoneMessage):
            self._settle(self._completion(message))
        elif isinstance(message, OutputLimitMessage):
            self._overflowed = True
            self._settle(_Terminal(RunFailure("output-limit", "")))

    def _completion(self, done: DoneMessage) -> _Terminal:
        if done.error is not None:
            kind, text = done.error
            if kind == "output-limit":
                self._overflowed = True
            return _Terminal(RunFailure(_failure_kind(kind), text))
        if not done.has_value:
            return _Terminal(None)
        try:
            value = flatwire.decode(done.value)
        except flatwire.WireError:
            return _Terminal(
                RunFailure("invalid-output", "program completion must be lossless JSON")
            )
        return _Terminal(None, True, value)

    def _admit_log(self, text: str) -> None:
        if self._overflowed:
            return
        if self._ledger.admit_log(text):
            if self._on_log is not None and self._terminal is None:
                self._on_log(text)
            return
        self._overflowed = True
        self._settle(_Terminal(RunFailure("output-limit", "")))

    def _start_call(self, worker: WorkerProcess, call: CallMessage) -> None:
        if call.call_id in self._seen_ids:
            return  # each worker call id is answered at most once
        self._seen_ids.add(call.call_id)
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
        try:
            arguments = flatwire.decode(call.args)
        except flatwire.WireError:
            self._reply(
                worker,
                call.call_id,
                BindingResult.failure("binding arguments must be lossless JSON"),
            )
            return
        seq = self._next_seq
        self._next_seq += 1
        binding_call = BindingCall(seq, call.name, arguments)
        try:
            pending = self._handler(binding_call)
        except Exception as exc:  # a failing handler is a failed call
            self._reply(worker, call.call_id, _handler_failure(exc))
            return
        # A handler that hands back a plain future is answered from its done callback: one
        # event-loop hop fewer per call than wrapping it in a task.
        future = pending if asyncio.isfuture(pending) else asyncio.ensure_future(pending)
        self._calls[call.call_id] = future
        future.add_done_callback(partial(self._answer, worker, call.call_id))

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
                tokens = flatwire.encode(result.value)
            except flatwire.WireError:
                result = BindingResult.failure("binding resolution must be lossless JSON")
            else:
                worker.send({"t": "reply", "id": call_id, "ok": True, "value": tokens})
                return
        worker.send({"t": "reply", "id": call_id, "ok": False, "message": result.message})

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
            if ledger.fits_value(terminal.value):
                return RunResult(list(ledger.logs), has_value=True, value=terminal.value)
        elif not self._overflowed:
            return RunResult(list(ledger.logs))
        logs, message = ledger.overflow_logs()
        return RunResult(logs, error=RunFailure("output-limit", message))


def _handler_failure(error: BaseException) -> BindingResult:
    return BindingResult.failure(str(error) or type(error).__name__)


def _failure_kind(kind: str) -> FailureKind:
    if kind == "invalid-output":
        return "invalid-output"
    if kind == "output-limit":
        return "output-limit"
    return "exception"


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
