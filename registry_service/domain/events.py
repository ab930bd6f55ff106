"""What happens to a call, as events: the pipeline (`Executor`) and the `run_code` transport emit
them; observers (registry_service/domain/observers.py) turn them into history records and
telemetry.

Two kinds. *Progress* events (`Event`) also go to the caller's stream (the servicer streams them
as `ExecuteToolCallResponse` progress): a call started, an approval pending and resolved, a
nested call started and settled, a tool's own progress (`ToolProgress`, for a direct call or a
nested one), a program's log line. *Lifecycle* events only observers see:
a call received and finished, a stage timed, a nested call received, refused or abandoned, a run
started and ended. A nested call's events name the nested call (`ObservedCall`), not its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.util.types import AttributeValue

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValueError
from registry_service.domain.approvals import ApprovalOutcome
from registry_service.domain.calls import ExecutionInput
from registry_service.domain.results import ToolResult
from registry_service.domain.telemetry import NO_TRACE, CallTrace


@dataclass(eq=False, slots=True, weakref_slot=True)
class ObservedCall:
    """One call as its observers see it, from its arrival to its end: who, what, and its span.

    The telemetry observer opens the call's span when the call is received and sets `trace`;
    the pipeline carries it (`ExecutionInput.trace`) so that what runs inside continues it."""

    call_id: str  # the sub-call id for a nested call
    root_call_id: str
    name: str
    agent: str  # "" without an agent
    agent_id: str
    parent_call_id: str = ""  # the run_code call of a nested call; "" for a model-direct one
    # The arguments as the call's records carry them: `arguments_json` when known, else
    # `arguments`, encoded when a record needs them ("" when they are not lossless JSON).
    arguments_json: str | None = None
    arguments: object = None
    traceparent: str = ""  # the W3C context the call's span is a child of
    tracestate: str = ""
    trace: CallTrace = NO_TRACE
    received_at: float = field(default_factory=time.time)

    @classmethod
    def direct(cls, inp: ExecutionInput) -> ObservedCall:
        return cls(
            call_id=inp.call_id,
            root_call_id=inp.root_call_id or inp.call_id,
            name=inp.name,
            agent=inp.agent or "",
            agent_id=inp.agent_id,
            arguments_json=inp.arguments_json,
            arguments=inp.arguments,
            traceparent=inp.traceparent,
            tracestate=inp.tracestate,
            trace=inp.trace,
        )

    def recorded_arguments(self) -> str:
        if self.arguments_json is not None:
            return self.arguments_json  # decoded from the wire: no second encoding
        with contextlib.suppress(JsonValueError):
            # Lossy arguments: the execution reports them as its result; the record has none.
            return jsonvalue.dumps(self.arguments)
        return ""


# -- progress: the caller's stream sees these too -------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallStarted:
    call_id: str
    tool_name: str


@dataclass(frozen=True, slots=True)
class ApprovalPending:
    approval_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class ApprovalResolved:
    approval_id: str
    outcome: ApprovalOutcome


@dataclass(frozen=True, slots=True)
class NestedCallStarted:
    """A run_code program's binding call started (scheduler start, before pre-execute)."""

    sub_call_id: str
    tool_name: str
    queue_wait_ms: float  # submission to start, in the run's scheduler queue
    # For observers (the stream carries only the fields above).
    call: ObservedCall | None = field(default=None, compare=False, repr=False)
    started_at: float = field(default=0.0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class NestedCallSettled:
    sub_call_id: str
    tool_name: str
    is_error: bool
    error_code: str
    duration_ms: float
    # For observers (the stream carries only the fields above).
    call: ObservedCall | None = field(default=None, compare=False, repr=False)
    result: ToolResult | None = field(default=None, compare=False, repr=False)
    exclusive: bool = field(default=True, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ProgramLog:
    text: str


@dataclass(frozen=True, slots=True)
class ToolProgress:
    """A tool body's own progress while it runs (an MCP server's `notifications/progress`),
    as `ProgressReporter` lets it through: finite, increasing, its message bounded."""

    call_id: str  # the call reporting: the sub-call id for a nested call
    tool_name: str
    progress: float
    total: float | None
    message: str


Event = (
    CallStarted
    | ApprovalPending
    | ApprovalResolved
    | NestedCallStarted
    | NestedCallSettled
    | ProgramLog
    | ToolProgress
)
Emit = Callable[[Event], None]
PROGRESS = (
    CallStarted,
    ApprovalPending,
    ApprovalResolved,
    NestedCallStarted,
    NestedCallSettled,
    ProgramLog,
    ToolProgress,
)


def no_events(_event: Event) -> None:
    return None


MAX_PROGRESS_MESSAGE = 512
"""Characters of a `ToolProgress` message kept (a longer one is cut, with an ellipsis)."""
PROGRESS_BURST = 8
"""`ToolProgress` events a call may send at once before `PROGRESS_PER_SECOND` applies."""
PROGRESS_PER_SECOND = 20.0


class ProgressReporter:
    """The one gate a tool body's progress passes on its way to its call's observers and
    stream (`Invocation.progress`). A tool server may report as often as it likes; what the
    caller sees is bounded:

    - a value that is not finite, or not above the last one let through, is dropped (MCP's
      progress must increase); a total that is not finite is taken as unknown;
    - the message is cut to `MAX_PROGRESS_MESSAGE` characters;
    - at most `PROGRESS_BURST` events at once, then `PROGRESS_PER_SECOND` (a token bucket):
      a value that comes while the bucket is empty waits, the latest one replacing any
      before it, and goes out when a token is back;
    - `close` (the body returned, its result not yet out) sends a waiting value at once, then
      nothing more: the latest value a call reported is always seen, before its result.

    Counts and order, not timing, are what a caller can rely on: the first `PROGRESS_BURST`
    values of a call and its last one always arrive, in order, before its result; at most
    one event more than the bucket allows."""

    __slots__ = (
        "_at",
        "_closed",
        "_emit",
        "_last",
        "_pending",
        "_timer",
        "_tokens",
        "call_id",
        "tool_name",
    )

    def __init__(self, call_id: str, tool_name: str, emit: Callable[[ToolProgress], None]) -> None:
        self.call_id, self.tool_name, self._emit = call_id, tool_name, emit
        self._last = -math.inf
        self._tokens = float(PROGRESS_BURST)
        self._at = time.monotonic()
        self._pending: ToolProgress | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        if self._closed or not math.isfinite(progress) or progress <= self._last:
            return
        if total is not None and not math.isfinite(total):
            total = None
        text = message or ""
        if len(text) > MAX_PROGRESS_MESSAGE:
            text = text[: MAX_PROGRESS_MESSAGE - 1] + "\u2026"
        self._last = progress
        event = ToolProgress(self.call_id, self.tool_name, progress, total, text)
        if self._timer is not None:  # a value is already waiting: this one replaces it
            self._pending = event
            return
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            self._emit(event)
            return
        self._pending = event
        delay = (1 - self._tokens) / PROGRESS_PER_SECOND
        self._timer = asyncio.get_running_loop().call_later(delay, self._flush)

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(
            float(PROGRESS_BURST), self._tokens + (now - self._at) * PROGRESS_PER_SECOND
        )
        self._at = now

    def _flush(self) -> None:
        self._timer = None
        event, self._pending = self._pending, None
        if event is None or self._closed:
            return
        self._refill()
        self._tokens = max(0.0, self._tokens - 1)
        self._emit(event)

    def close(self) -> None:
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._flush()
        self._closed = True


# -- lifecycle: only observers see these ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallReceived:
    """A model-direct call arrived, before anything of it runs (its `tool/call` record)."""

    call: ObservedCall


@dataclass(frozen=True, slots=True)
class CallFinished:
    """A model-direct call has its result (its `tool/result` record)."""

    call: ObservedCall
    result: ToolResult


@dataclass(frozen=True, slots=True)
class CallFailed:
    """A model-direct call ended without a result (cancelled, or a failure of the registry)."""

    call: ObservedCall
    error: BaseException


@dataclass(frozen=True, slots=True)
class ToolResolved:
    """The call's tool is known (after create)."""

    trace: CallTrace
    description: str


@dataclass(frozen=True, slots=True)
class StageTimed:
    """A pipeline stage ran from `started_ns` to `ended_ns` (epoch ns): `pre_execute`,
    `approval_wait`, `guards`, `body`, `post_execute`, or a nested call's `queue_wait`."""

    trace: CallTrace
    stage: str
    started_ns: int
    ended_ns: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NestedCallReceived:
    """A binding call was admitted as a nested call and queued in its run's scheduler."""

    call: ObservedCall


@dataclass(frozen=True, slots=True)
class NestedCallRefused:
    """A binding call refused before it became a nested call (`reason`: run_over,
    invalid_token, permission_denied, unknown_binding, arguments_too_large, arguments_too_deep,
    invalid_arguments, admission_limit)."""

    reason: str
    tool_name: str


@dataclass(frozen=True, slots=True)
class NestedCallAbandoned:
    """A queued nested call never started: its run ended first."""

    call: ObservedCall
    result: ToolResult


@dataclass(frozen=True, slots=True)
class RunStarted:
    run_call_id: str


@dataclass(frozen=True, slots=True)
class RunEnded:
    run_call_id: str


Observed = (
    Event
    | CallReceived
    | CallFinished
    | CallFailed
    | ToolResolved
    | StageTimed
    | NestedCallReceived
    | NestedCallRefused
    | NestedCallAbandoned
    | RunStarted
    | RunEnded
)
