"""Tool-call telemetry: the `execute_tool {name}` span of every call and the registry's metrics.

OpenTelemetry API only (the SDK is set up by the process entry point, or by a test). Every
component takes its providers explicitly and falls back to the global ones; when tracing is
off the shared `NO_TRACE` stands in for every span, so the pipeline pays nothing for it.

A call's span covers the whole call: for a nested call, from the binding call's arrival (so it
includes the scheduler queue wait) to its commit. Pipeline stages are span events stamped at
the stage's start with its duration (`duration_ms`): `queue_wait` (nested),
`pre_execute`, `approval_wait`, `guards`, `body`, `post_execute`. A tool's own progress, as
its caller is told it (`events.ProgressReporter` bounds how often), is a `tool_progress` event
with `codemode.progress` and, when known, `codemode.progress_total` (never the message: it is
the tool server's free text).
"""

from __future__ import annotations

import time
from types import TracebackType

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Status, StatusCode
from opentelemetry.util.types import AttributeValue

from codemode_wire.telemetry import Instrumented, context_from
from codemode_wire.telemetry.clean_writes import add_clean_event, set_clean_attributes
from codemode_wire.telemetry.propagation import span_traceparent
from registry_service.domain.results import ToolResult

__all__ = ["NO_TRACE", "CallTrace", "RegistryTelemetry", "outcome_of"]

INSTRUMENTATION = "codemode.registry"

# Span attributes (GenAI `execute_tool` conventions where they exist, ours otherwise).
OPERATION = "gen_ai.operation.name"
CALL_ID = "gen_ai.tool.call.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_DESCRIPTION = "gen_ai.tool.description"
ERROR_TYPE = "error.type"  # the general semantic conventions' failure class of an operation
ROOT_CALL_ID = "codemode.root_call_id"
PARENT_CALL_ID = "codemode.parent_call_id"
AGENT = "codemode.agent"
OUTCOME = "codemode.outcome"
EXECUTION_MODE = "codemode.execution_mode"
DURATION_MS = "duration_ms"
REFUSAL = "codemode.refusal"
APPROVAL_OUTCOME = "codemode.approval.outcome"
PROGRESS = "codemode.progress"
PROGRESS_TOTAL = "codemode.progress_total"

# Stage events.
QUEUE_WAIT = "queue_wait"
PRE_EXECUTE = "pre_execute"
APPROVAL_WAIT = "approval_wait"
GUARDS = "guards"
BODY = "body"
POST_EXECUTE = "post_execute"
TOOL_PROGRESS = "tool_progress"

OK = "ok"
ABANDONED = "ABANDONED"


def outcome_of(result: ToolResult) -> str:
    """`ok`, the result's error code, or `error` for a failure without one."""
    if not result.is_error:
        return OK
    return result.error.code if result.error is not None and result.error.code else "error"


class _Activation:
    __slots__ = ("_span", "_token")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self._token: object = None

    def __enter__(self) -> None:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        otel_context.detach(self._token)  # type: ignore[arg-type]


class _NoActivation:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


_NO_ACTIVATION = _NoActivation()


class CallTrace:
    """The span of one tool call. `NO_TRACE` (no span) makes every method a no-op.

    The span's attributes (the call's identity, the tool's description once resolved) are kept
    here and written with the outcome when it ends, in one step: the values are ours and
    already clean, so they and the stage events skip the SDK's per-value cleaning
    (codemode_wire/telemetry/clean_writes.py). The exported span is the same; a sampler sees
    the span's name, kind and parent, not its attributes.
    """

    __slots__ = ("_attributes", "_span")

    def __init__(
        self, span: trace.Span | None = None, attributes: dict[str, AttributeValue] | None = None
    ) -> None:
        self._span = span
        self._attributes = attributes

    @property
    def recording(self) -> bool:
        return self._span is not None

    def stage(
        self, name: str, start_ns: int, end_ns: int = 0, **attributes: AttributeValue
    ) -> None:
        """Records a pipeline stage that started at `start_ns` (epoch ns) and ends now/`end_ns`."""
        span = self._span
        if span is None:
            return
        duration_ms = ((end_ns or time.time_ns()) - start_ns) / 1e6
        attributes[DURATION_MS] = round(duration_ms, 3)
        add_clean_event(span, name, attributes, start_ns)

    def progressed(self, progress: float, total: float | None) -> None:
        """The tool reported progress (what its caller's stream carries, already bounded)."""
        span = self._span
        if span is None:
            return
        attributes: dict[str, AttributeValue] = {PROGRESS: progress}
        if total is not None:
            attributes[PROGRESS_TOTAL] = total
        add_clean_event(span, TOOL_PROGRESS, attributes, time.time_ns())

    def describe(self, description: str) -> None:
        """The called tool's description, once the call has resolved its tool."""
        if self._attributes is not None and description:
            self._attributes[TOOL_DESCRIPTION] = description

    def propagation(self, traceparent: str, tracestate: str) -> tuple[str, str]:
        """The W3C context naming this span as the parent; the given one when not tracing."""
        if self._span is None:
            return traceparent, tracestate
        return span_traceparent(self._span)

    def activated(self) -> _Activation | _NoActivation:
        """Context manager making this span the current one (for code that runs inside it)."""
        return _NO_ACTIVATION if self._span is None else _Activation(self._span)

    def end(self, result: ToolResult, outcome: str | None = None, execution_mode: str = "") -> None:
        span = self._span
        if span is None:
            return
        attributes = self._ending()
        attributes[OUTCOME] = outcome or outcome_of(result)
        if execution_mode:
            attributes[EXECUTION_MODE] = execution_mode
        if result.is_error:
            attributes[ERROR_TYPE] = outcome_of(result)
            message = result.error.message if result.error is not None else ""
            span.set_status(Status(StatusCode.ERROR, message[:512]))
        set_clean_attributes(span, attributes)
        span.end()

    def fail(self, exc: BaseException) -> None:
        """Ends the span of a call that did not produce a result (cancelled, crashed)."""
        span = self._span
        if span is None:
            return
        attributes = self._ending()
        attributes[OUTCOME] = attributes[ERROR_TYPE] = type(exc).__name__
        set_clean_attributes(span, attributes)
        span.set_status(Status(StatusCode.ERROR, str(exc)[:512] or type(exc).__name__))
        span.end()

    def _ending(self) -> dict[str, AttributeValue]:
        """The attributes to write as the span ends (a span ends once: they are taken)."""
        attributes = self._attributes if self._attributes is not None else {}
        self._attributes = None
        return attributes


NO_TRACE = CallTrace()


class RegistryTelemetry(Instrumented):
    """The registry's tracer and instruments."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        super().__init__(INSTRUMENTATION, tracer_provider, meter_provider)
        meter = self._meter
        self._nested_duration = self._latency_histogram(
            "codemode.nested_call.duration",
            "Nested call latency, from the binding call's arrival to its commit",
        )
        self._queue_wait = self._latency_histogram(
            "codemode.scheduler.queue_wait",
            "Time a nested call waited in its run's scheduler before it started",
        )
        self._approval_wait = self._latency_histogram(
            "codemode.approval.wait",
            "Time a call waited for an approval decision",
        )
        self._nested_active = meter.create_up_down_counter(
            "codemode.nested_calls.active",
            description="Nested calls received and not yet committed or abandoned",
        )
        self._runs_active = meter.create_up_down_counter(
            "codemode.runs.active", description="run_code runs in progress"
        )
        self._refused = meter.create_counter(
            "codemode.nested_calls.refused",
            description="Nested calls refused before dispatch (codemode.refusal: run_over, "
            "invalid_token, unknown_binding, invalid_arguments, denied)",
        )

    # -- spans ---------------------------------------------------------------------------------

    def start_call(
        self,
        *,
        call_id: str,
        name: str,
        root_call_id: str,
        agent: str | None,
        parent_call_id: str = "",
        traceparent: str = "",
        tracestate: str = "",
    ) -> CallTrace:
        """Starts `execute_tool {name}`: a child of `traceparent`, else of the current span."""
        tracer = self._tracer
        if tracer is None:
            return NO_TRACE
        attributes: dict[str, AttributeValue] = {
            OPERATION: "execute_tool",
            CALL_ID: call_id,
            TOOL_NAME: name,
            ROOT_CALL_ID: root_call_id,
        }
        if agent:
            attributes[AGENT] = agent
        if parent_call_id:
            attributes[PARENT_CALL_ID] = parent_call_id
        span = tracer.start_span(
            f"execute_tool {name}", context=context_from(traceparent, tracestate)
        )
        return CallTrace(span, attributes)

    # -- metrics -------------------------------------------------------------------------------

    def nested_received(self) -> None:
        self._nested_active.add(1)

    def nested_settled(self, name: str, outcome: str, seconds: float) -> None:
        self._nested_active.add(-1)
        self._nested_duration.record(seconds, {TOOL_NAME: name, OUTCOME: outcome})
        if outcome == "DENIED":
            self._refused.add(1, {REFUSAL: "denied"})

    def nested_abandoned(self) -> None:
        self._nested_active.add(-1)

    def nested_refused(self, reason: str, name: str) -> None:
        """A binding call refused before it became a nested call (no span of its own)."""
        self._refused.add(1, {REFUSAL: reason})
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("nested_call_refused", {REFUSAL: reason, TOOL_NAME: name})

    def queue_waited(self, name: str, seconds: float) -> None:
        self._queue_wait.record(seconds, {TOOL_NAME: name})

    def approval_waited(self, outcome: str, seconds: float) -> None:
        self._approval_wait.record(seconds, {APPROVAL_OUTCOME: outcome})

    def run_started(self) -> None:
        self._runs_active.add(1)

    def run_ended(self) -> None:
        self._runs_active.add(-1)
