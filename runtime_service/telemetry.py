"""Run telemetry: the `run_program` span of every run and the runtime's metrics.

OpenTelemetry API only; the servicer and the server set-up use it, the run itself does not.

- A run's span continues the trace context of its `RunStart` (the registry's `run_code` call
  span; without one, the current context: the gRPC server span, if any). Its context is what
  every `BindingCall.trace_context` of the run carries, so the registry parents each nested
  call's span under it. Events: `worker_handoff` (with its duration) and `terminal` (the kind);
  the span ends when the run's outcome is known, with status ERROR for every failure kind.
- Worker hand-off is timed by wrapping the pool's `acquire` (`instrument_pool`); the run the
  hand-off belongs to is found through a context variable the servicer sets around the run.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from codemode_wire.telemetry import Instrumented, context_from
from codemode_wire.telemetry.propagation import span_traceparent
from runtime_service.outcome import RunResult

if TYPE_CHECKING:
    from runtime_service.pool import WorkerPool
    from runtime_service.worker_process import WorkerProcess

__all__ = ["RUN_SPAN", "RunTrace", "RuntimeTelemetry", "budget_of", "terminal_kind"]

INSTRUMENTATION = "codemode.runtime"
RUN_SPAN = "run_program"
OK = "ok"
TERMINAL_KIND = "codemode.run.terminal_kind"
BUDGET = "codemode.budget"
DURATION_MS = "duration_ms"

_CURRENT_RUN: contextvars.ContextVar[RunTrace | None] = contextvars.ContextVar(
    "codemode_runtime_run", default=None
)


def terminal_kind(result: RunResult) -> str:
    """`ok`, or the failure kind (`exception`, `timeout`, `abort`, `worker-exit`, ...)."""
    return OK if result.error is None else result.error.kind


def budget_of(result: RunResult) -> str | None:
    """Which budget killed the run, if one did: compute, wall, output or memory.

    The run reports budgets only in its failure kind and message, so this reads both.
    """
    error = result.error
    if error is None:
        return None
    if error.kind == "output-limit":
        return "output"
    if error.kind == "timeout":
        return "compute" if error.message.startswith("compute budget") else "wall"
    if error.kind == "worker-exit" and "memory budget" in error.message:
        return "memory"
    return None


class RunTrace:
    """One run's span (or none, when tracing is off) and its metrics."""

    __slots__ = ("_clock", "_ended", "_span", "_telemetry", "traceparent", "tracestate")

    def __init__(
        self, telemetry: RuntimeTelemetry, span: trace.Span | None, incoming: tuple[str, str]
    ) -> None:
        self._telemetry = telemetry
        self._span = span
        self._clock = time.perf_counter()
        self._ended = False
        # What each binding call carries: this run's span, else the caller's context unchanged.
        self.traceparent, self.tracestate = span_traceparent(span) if span else incoming

    def activated(self) -> _RunActivation:
        """Makes this run (and its span) current for tasks created inside the block."""
        return _RunActivation(self)

    def handed_off(self, started_ns: int, seconds: float) -> None:
        if self._span is not None:
            self._span.add_event(
                "worker_handoff", {DURATION_MS: round(seconds * 1000, 3)}, timestamp=started_ns
            )

    def refused(self, reason: str, message: str) -> None:
        """The run request was refused before it started (no worker, no terminal)."""
        if self._ended:
            return
        self._ended = True
        self._telemetry._active.add(-1)
        if self._span is not None:
            self._span.set_attribute(TERMINAL_KIND, reason)
            self._span.set_status(Status(StatusCode.ERROR, message[:512]))
            self._span.end()

    def finish(self, execution: asyncio.Future[RunResult]) -> None:
        """Done callback of the run's execution: records the terminal outcome, ends the span."""
        if self._ended:
            return
        self._ended = True
        telemetry = self._telemetry
        seconds = time.perf_counter() - self._clock
        if execution.cancelled():
            kind, message, budget = "abort", "run cancelled", None
        elif execution.exception() is not None:
            kind, message, budget = "error", repr(execution.exception()), None
        else:
            result = execution.result()
            kind = terminal_kind(result)
            message = result.error.message if result.error is not None else ""
            budget = budget_of(result)
        attributes: dict[str, AttributeValue] = {TERMINAL_KIND: kind}
        telemetry._active.add(-1)
        telemetry._terminals.add(1, attributes)
        telemetry._duration.record(seconds, attributes)
        if budget is not None:
            telemetry._budget_kills.add(1, {BUDGET: budget})
        span = self._span
        if span is None:
            return
        span.set_attribute(TERMINAL_KIND, kind)
        event: dict[str, AttributeValue] = {"kind": kind}
        if budget is not None:
            event["budget"] = budget
            span.set_attribute(BUDGET, budget)
        span.add_event("terminal", event)
        if kind != OK:
            span.set_status(Status(StatusCode.ERROR, message[:512] or kind))
        span.end()


class _RunActivation:
    __slots__ = ("_run", "_tokens")

    def __init__(self, run: RunTrace) -> None:
        self._run = run
        self._tokens: tuple[contextvars.Token[RunTrace | None], object] | None = None

    def __enter__(self) -> None:
        span = self._run._span
        otel_token = None if span is None else otel_context.attach(trace.set_span_in_context(span))
        self._tokens = (_CURRENT_RUN.set(self._run), otel_token)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._tokens is not None
        run_token, otel_token = self._tokens
        if otel_token is not None:
            otel_context.detach(otel_token)  # type: ignore[arg-type]
        _CURRENT_RUN.reset(run_token)


class RuntimeTelemetry(Instrumented):
    """The runtime's tracer and instruments (explicit providers, else the global ones)."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        super().__init__(INSTRUMENTATION, tracer_provider, meter_provider)
        meter = self._meter
        self._handoff = self._latency_histogram(
            "codemode.runtime.worker.handoff",
            "Time to hand a run its worker (from the pool, or a fresh spawn)",
        )
        self._duration = self._latency_histogram(
            "codemode.runtime.run.duration",
            "Run duration, from its start message to its terminal outcome",
        )
        self._terminals = meter.create_counter(
            "codemode.runtime.runs.terminal", description="Runs ended, by terminal kind"
        )
        self._budget_kills = meter.create_counter(
            "codemode.runtime.budget_kills",
            description="Runs ended by a budget (codemode.budget: compute, wall, output, memory)",
        )
        self._active = meter.create_up_down_counter(
            "codemode.runtime.runs.active", description="Runs in progress"
        )

    def start_run(
        self, traceparent: str, tracestate: str, *, language: str, bindings: int
    ) -> RunTrace:
        """Starts a run's span, continuing the caller's W3C context (else the current one)."""
        self._active.add(1)
        span = None
        if self._tracer is not None:
            span = self._tracer.start_span(
                RUN_SPAN,
                context=context_from(traceparent, tracestate),
                kind=SpanKind.INTERNAL,
                attributes={"codemode.run.language": language, "codemode.run.bindings": bindings},
            )
        return RunTrace(self, span, (traceparent, tracestate))

    def instrument_pool(self, pool: WorkerPool) -> None:
        """Times every worker hand-off: wraps this pool's `take_idle` and `acquire` (the
        runtime hands runs both); the run it belongs to is the current one."""
        acquire, take_idle = pool.acquire, pool.take_idle

        def handed_off(started_ns: int, clock: float) -> None:
            seconds = time.perf_counter() - clock
            self._handoff.record(seconds)
            run = _CURRENT_RUN.get()
            if run is not None:
                run.handed_off(started_ns, seconds)

        def timed_take_idle() -> WorkerProcess | None:
            started_ns, clock = time.time_ns(), time.perf_counter()
            worker = take_idle()
            if worker is not None:  # else the run waits in `acquire`, timed there
                handed_off(started_ns, clock)
            return worker

        async def timed_acquire() -> WorkerProcess:
            started_ns, clock = time.time_ns(), time.perf_counter()
            worker = await acquire()
            handed_off(started_ns, clock)
            return worker

        # Instance overrides, on purpose.
        setattr(pool, "take_idle", timed_take_idle)  # noqa: B010
        setattr(pool, "acquire", timed_acquire)  # noqa: B010

    def observe_pool(self, pool: WorkerPool) -> None:
        """Reports the pool's idle (pre-spawned, never used) workers as a gauge."""

        def idle(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(pool.idle_count)]

        self._meter.create_observable_gauge(
            "codemode.runtime.pool.idle",
            callbacks=[idle],
            description="Idle pre-spawned workers ready for a run",
        )
