"""The per-run scheduler for nested calls: *when* each call's stages may enter.

Every nested call runs the one pipeline driver (`Executor.run`) in a task of its own, through a
`Gate` from this scheduler. The scheduler keeps one ordered lane: a call's start section
(start record, create, pre-execute, approval, guards) and its commit section (post-execute,
result observers, context forwarding, program resolution, settle-record launch) hold the lane,
one call at a time, starts in submission order and commits in submission order; only dispatch
(around wrappers + body) overlaps, at most `max_parallel` at a time. A call that is not
concurrency-safe waits for the pool to drain, runs alone and holds the barrier through its own
commit. Classification is re-read from the live registry right before a call starts.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Any, cast

from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.events import ObservedCall
from registry_service.domain.execution import Emit, ExecutionInput, Executor, Gate
from registry_service.domain.results import ToolResult
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
    observed: ObservedCall  # the call as its observers see it (records, span)
    submitted_at: float = field(default_factory=time.time)
    started_at: float = 0.0
    exclusive: bool = True
    # pending → started → (flying →) committing → committed | abandoned
    stage: str = "pending"
    start_record: asyncio.Future[Any] | None = None  # the durable dispatch-start write
    holds_lane: bool = False
    start_turn: asyncio.Future[None] | None = None  # set when a parked call may start
    commit_turn: asyncio.Future[None] | None = None  # set when a parked call may commit


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


class _LaneGate(Gate):
    """One nested call's gate: its stage boundaries, as the run's lane allows them."""

    def __init__(self, scheduler: RunScheduler, call: NestedCall) -> None:
        self._scheduler = scheduler
        self._call = call

    async def start(self) -> None:
        await self._scheduler._await_start(self._call)
        await self._scheduler._hooks.started(self._call)

    async def dispatch(self) -> None:
        self._scheduler._fly(self._call)
        record = self._call.start_record
        if record is not None and not record.done():
            # The start record is durable before the body runs. SQLite commits it in the next
            # loop turn (queued by the `started` hook, it goes first): one turn is enough, and
            # cheaper than waiting on the future. A server database commits later: wait.
            await asyncio.sleep(0)
            if not record.done():
                await asyncio.wait((record,))  # its failure is the commit's to report

    async def commit(self) -> None:
        await self._scheduler._await_commit(self._call)

    async def done(self, result: ToolResult) -> ToolResult:
        await self._scheduler._committed(self._call, result)
        return result


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
        self._commits: collections.deque[NestedCall] = collections.deque()  # started, in order
        self._flying = 0  # calls in dispatch (around wrappers + body)
        self._lane_busy = False
        self._exclusive_active = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self._log_work: set[asyncio.Future[None]] = set()
        self.peak_parallel = 0

    # -- submission ----------------------------------------------------------------------------

    def submit(self, call: NestedCall) -> None:
        """Queues the call; its task starts it as soon as the lane allows. Calls submitted in
        one loop turn start in one turn: each start section runs as its task first runs, when
        the call is the head of the queue and the lane is free (no hand-off per call)."""
        self._pending.append(call)
        task = asyncio.create_task(self._run(call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def quiesce(self) -> None:
        """After the run settled: abandon queued calls, settle in-flight ones, write records."""
        while True:
            self._pump()
            if not self._tasks:
                break
            await asyncio.wait(set(self._tasks))
        while self._log_work:
            await asyncio.gather(*list(self._log_work), return_exceptions=True)
        if self._failure is not None:
            raise self._failure

    # -- the ordered lane ----------------------------------------------------------------------

    def _pump(self) -> None:
        """Hands the free lane to the next stage that may enter: the head commit once it is
        ready, else the head of the queue once it may start."""
        while not self._lane_busy:
            head = self._commits[0] if self._commits else None
            if head is not None and head.stage == "settled":
                self._commits.popleft()
                self._take_lane(head)
                head.stage = "committing"
                _wake(head.commit_turn)
                return
            if not self._pending:
                return
            call = self._pending[0]
            if self._signal.aborted:
                self._pending.popleft()
                self._abandon(call)
                _wake(call.start_turn)
                continue
            # The head starts itself when its task runs: the pump only wakes a parked one, and
            # leaves the lane free meanwhile (commits landing in this turn go on inline).
            turn = call.start_turn
            if turn is not None and not turn.done() and self._can_start(call):
                turn.set_result(None)
            return

    async def _await_start(self, call: NestedCall) -> None:
        while call.stage == "pending":
            if self._may_start_now(call):
                self._pending.popleft()
                self._start(call)
                return
            call.start_turn = asyncio.get_running_loop().create_future()
            self._pump()  # may wake it at once, or abandon it
            await call.start_turn
        if call.stage == "abandoned":
            raise _Abandoned

    def _may_start_now(self, call: NestedCall) -> bool:
        if self._lane_busy or not self._pending or self._pending[0] is not call:
            return False
        if self._signal.aborted or (self._commits and self._commits[0].stage == "settled"):
            return False  # the pump abandons it, or commits first
        return self._can_start(call)

    def _take_lane(self, call: NestedCall) -> None:
        self._lane_busy = True
        call.holds_lane = True

    def _release_lane(self, call: NestedCall) -> None:
        if call.holds_lane:
            call.holds_lane = False
            self._lane_busy = False

    def _can_start(self, call: NestedCall) -> bool:
        defn = self._executor.catalog.resolve_execution(
            call.name, call.inp.agent or "", nested=True
        )
        # The bridge submits parsed (lossless) JSON, so the arguments are a JsonValue.
        call.exclusive = not is_parallel(defn, cast(JsonValue, call.inp.arguments))
        if self._exclusive_active:
            return False
        if call.exclusive:
            return not self._flying
        return self._flying < self._max

    def _start(self, call: NestedCall) -> None:
        if call.exclusive:
            self._exclusive_active = True
        self._commits.append(call)
        self._take_lane(call)
        call.stage = "started"
        call.started_at = time.time()

    async def _run(self, call: NestedCall) -> None:
        try:
            with call.inp.trace.activated():
                await self._executor.run(call.inp, self._emit, _LaneGate(self, call))
        except _Abandoned:
            return
        except BaseException as exc:
            # A failed record write (or a bug) fails the run once it is quiescent; the lane
            # moves on so that the other calls still settle.
            if call.stage == "pending":  # cancelled while it waited to start
                self._pending.remove(call)
                self._pump()
            else:
                if call.stage == "flying":
                    self._flying -= 1
                if call in self._commits:
                    self._commits.remove(call)
                self._leave(call)
            if not isinstance(exc, Exception):
                raise
            if self._failure is None:
                self._failure = exc

    def _fly(self, call: NestedCall) -> None:
        """The call's start section is over and its body begins: the lane is free."""
        call.stage = "flying"
        self._flying += 1
        self.peak_parallel = max(self.peak_parallel, self._flying)
        self._release_lane(call)
        self._pump()

    async def _await_commit(self, call: NestedCall) -> None:
        if call.stage == "flying":
            self._flying -= 1
        call.stage = "settled"
        self._release_lane(call)  # a call that ran no body still holds it from its start
        self._pump()
        if call.stage != "committing":
            call.commit_turn = asyncio.get_running_loop().create_future()
            await call.commit_turn

    async def _committed(self, call: NestedCall, result: ToolResult) -> None:
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
        self._leave(call)

    def _leave(self, call: NestedCall) -> None:
        """The call is done with the lane: an exclusive one lifts its barrier here, after its
        own commit."""
        if call.exclusive:
            self._exclusive_active = False
        self._release_lane(call)
        self._pump()

    def _abandon(self, call: NestedCall) -> None:
        call.stage = "abandoned"
        self._hooks.abandoned(call)


class _Abandoned(Exception):
    """A queued call's run ended before it started: its pipeline never runs."""


def _wake(turn: asyncio.Future[None] | None) -> None:
    if turn is not None and not turn.done():
        turn.set_result(None)
