"""W3C trace context in stream messages: `traceparent`/`tracestate` strings <-> OpenTelemetry.

OpenTelemetry API only. Parsing goes through the W3C propagator (it validates the header);
formatting is done directly from the span context (the hot path of every nested call).
"""

from __future__ import annotations

import re

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["context_from", "span_traceparent"]

_PROPAGATOR = TraceContextTextMapPropagator()
# Version 00, the form every OpenTelemetry SDK sends: parsed directly (the hot path).
_V00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


# Every nested call of a run names the same parent (the run's span): the context built for the
# last `traceparent` is kept (contexts are immutable), so a run's calls parse it once.
_last: list[tuple[str, str, Context | None]] = [("", "", None)]


def context_from(traceparent: str, tracestate: str = "") -> Context | None:
    """The context whose current span is the remote parent named by `traceparent`.

    None when `traceparent` is empty or invalid: the caller then uses its own current context.
    """
    if not traceparent:
        return None
    last_parent, last_state, last_context = _last[0]
    if traceparent == last_parent and tracestate == last_state:
        return last_context
    context = _parse(traceparent, tracestate)
    _last[0] = (traceparent, tracestate, context)
    return context


def _parse(traceparent: str, tracestate: str) -> Context | None:
    match = _V00.fullmatch(traceparent)
    if match is None:  # another version, odd spacing...: the W3C propagator's full rules
        return _extract(traceparent, tracestate)
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    parent = SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=TraceFlags(int(match[3], 16)),
        trace_state=TraceState.from_header([tracestate]) if tracestate else None,
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def _extract(traceparent: str, tracestate: str) -> Context | None:
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = _PROPAGATOR.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def span_traceparent(span: trace.Span) -> tuple[str, str]:
    """(`traceparent`, `tracestate`) naming `span` as the parent; ("", "") for an invalid span."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return "", ""
    traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    return traceparent, ctx.trace_state.to_header() if ctx.trace_state else ""
