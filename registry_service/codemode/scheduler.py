"""The per-run scheduler for nested calls (reference §7).

One ordered lane runs starts (start record, create, pre-execute, approval, guards) and commits
(post-execute, context forwarding, program resolution, settle-record launch) strictly in
submission order; only dispatch (around wrappers + body) overlaps, at most `max_parallel` at a
time. A call that is not concurrency-safe waits for the pool to drain, runs alone and holds the
barrier through its own commit. Classification is re-read from the live registry right before a
call starts.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Any, cast

from codemode_common.jsonvalue import JsonValue
from registry_service.domain.execution import Emit, Execution, ExecutionInput, Executor
from registry_service.domain.results import ToolResult, error_result
from registry_service.domain.signals import AbortSignal
from registry_service.domain.tools import is_parallel


@dataclass(eq=False)
class NestedCall:
    """One binding call of a program, from submission to commit."""

    n: int
    sub_call_id: str
    name: str
    inp: ExecutionInput
    binding_call_id: int  # the runtime's id of the binding call: what the answer names
    arguments_json: str = ""  # the dispatched arguments, encoded once for both records
    submitted_at: float = field(default_factory=time.time)
    started_at: float = 0.0
    exclusive: bool = True
    execution: Execution | None = None
    stage: str = "pending"  # pending → started → (flying →) settled → committed | abandoned
    early: tuple[str, ToolResult] | None = None  # ("final" | "post", result) when prepare decided
    flight: asyncio.Task[ToolResult] | None = None
    start_record: asyncio.Future[Any] | None = None  # the durable dispatch-start write

    @property
    def settled(self) -> bool:
        return self.early is not None or (self.flight is not None and self.flight.done())


class RunHooks:
    """What the bridge plugs into the scheduler (records, events, context forwarding)."""

    async def started(self, call: NestedCall) -> None: ...

    async def committed(self, call: NestedCall, result: ToolResult) -> asyncio.Future[Any] | None:
        """Returns the settle-record write (side work the scheduler tracks), if any."""
        return None

    def abandoned(self, call: NestedCall) -> None:
        """A queued call will never start; the hook answers the program itself."""

    def answer(self, call: NestedCall, result: ToolResult) -> None:
        """Hands the program a committed call's result (once per call, at its commit)."""


class RunScheduler:
    def __init__(
        self,
        executor: Executor,
        run_signal: AbortSignal,
        max_parallel: int,
        hooks: RunHooks,
        emit: Emit,
    ) -> None:
        if max_parallel < 1:
            raise ValueError("maxParallelSubCalls must be a positive integer")
        self._executor = executor
        self._signal = run_signal
        self._max = max_parallel
        self._hooks = hooks
        self._emit = emit
        self._pending: collections.deque[NestedCall] = collections.deque()
        self._commits: collections.deque[NestedCall] = collections.deque()
        self._inflight: set[asyncio.Task[ToolResult]] = set()
        self._exclusive_active = False
        self._log_work: set[asyncio.Future[None]] = set()
        self._wake = asyncio.Event()
        self._closed = False
        self._driver: asyncio.Task[None] | None = None
        self.peak_parallel = 0

    # -- submission ----------------------------------------------------------------------------

    def submit(self, call: NestedCall) -> None:
        self._pending.append(call)
        self._ensure_driver()
        self._wake.set()

    def _ensure_driver(self) -> None:
        if self._driver is None or self._driver.done():
            self._driver = asyncio.create_task(self._drive())

    async def quiesce(self) -> None:
        """After the run settled: abandon queued calls, settle in-flight ones, write records."""
        self._closed = True
        self._wake.set()
        self._ensure_driver()
        assert self._driver is not None
        await self._driver
        while self._log_work:
            await asyncio.gather(*list(self._log_work), return_exceptions=True)

    # -- the ordered lane ----------------------------------------------------------------------

    async def _drive(self) -> None:
        while True:
            # Clear before inspecting state: a wake-up during inspection is never lost.
            self._wake.clear()
            head = self._commits[0] if self._commits else None
            if head is not None and head.settled:
                self._commits.popleft()
                await self._commit(head)
                if head.exclusive:
                    self._exclusive_active = False
                continue
            if self._pending:
                call = self._pending[0]
                if self._signal.aborted:
                    self._pending.popleft()
                    self._abandon(call)
                    continue
                if self._can_start(call):
                    self._pending.popleft()
                    await self._start(call)
                    continue
            if not self._pending and not self._commits and not self._inflight:
                return
            await self._wake.wait()

    def _can_start(self, call: NestedCall) -> bool:
        defn = self._executor.catalog.resolve_execution(
            call.name, call.inp.agent or "", nested=True
        )
        # The bridge submits parsed (lossless) JSON, so the arguments are a JsonValue.
        call.exclusive = not is_parallel(defn, cast(JsonValue, call.inp.arguments))
        if self._exclusive_active:
            return False
        if call.exclusive:
            return not self._inflight
        return len(self._inflight) < self._max

    async def _start(self, call: NestedCall) -> None:
        if call.exclusive:
            self._exclusive_active = True
        self._commits.append(call)
        call.stage = "started"
        call.started_at = time.time()
        await self._hooks.started(call)
        created = self._executor.create(call.inp)
        if isinstance(created, ToolResult):
            call.early = ("final", created)
            return
        call.execution = created
        prepared = await self._executor.prepare(created, self._emit)
        if prepared.action != "dispatch":
            assert prepared.result is not None
            call.early = (prepared.action, prepared.result)
            return
        flight = asyncio.create_task(self._fly(created))
        call.flight = flight
        call.stage = "flying"
        self._inflight.add(flight)
        self.peak_parallel = max(self.peak_parallel, len(self._inflight))
        flight.add_done_callback(self._landed)

    async def _fly(self, execution: Execution) -> ToolResult:
        try:
            return await self._executor.dispatch(execution)
        except Exception as exc:  # an around wrapper threw: final, no post-execute
            return error_result(str(exc) or type(exc).__name__, name=type(exc).__name__)

    def _landed(self, flight: asyncio.Task[ToolResult]) -> None:
        self._inflight.discard(flight)
        self._wake.set()

    async def _commit(self, call: NestedCall) -> None:
        execution = call.execution
        if call.early is not None and call.early[0] == "final":
            result = call.early[1]
            if execution is not None:
                result = self._executor.finish(execution, result)
        else:
            raw = call.early[1] if call.early is not None else _landed_result(call)
            assert execution is not None
            result = await self._executor.finalize(execution, raw)
        call.stage = "committed"
        record = await self._hooks.committed(call, result)
        self._hooks.answer(call, result)
        if record is not None:
            work = asyncio.ensure_future(record)
            self._log_work.add(work)
            work.add_done_callback(self._log_work.discard)
            # Backpressure: the lane waits while too many settle records are still being written.
            while len(self._log_work) > self._max:
                await asyncio.wait(set(self._log_work), return_when=asyncio.FIRST_COMPLETED)

    def _abandon(self, call: NestedCall) -> None:
        call.stage = "abandoned"
        self._hooks.abandoned(call)


def _landed_result(call: NestedCall) -> ToolResult:
    assert call.flight is not None
    return call.flight.result()
