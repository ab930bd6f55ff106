"""Telemetry shared by both services and the Python client.

This package depends on the OpenTelemetry *API* only, so domain code and the client may import it:

- `propagation`: W3C `traceparent`/`tracestate` <-> OpenTelemetry contexts, for the trace context
  carried inside stream messages (`RunStart`, `BindingCall`, `Invocation`);
- `resolve_tracer_provider`: the provider a component should use (an explicit one, else the
  global), or None when tracing is off, so that "off" costs nothing at all.

The SDK side (exporters, the JSON-lines trace file, OTLP, log correlation, gRPC interceptors)
lives in the servers' `codemode_common.telemetry` (`.setup`, `.jsonl`, `.logs`,
`.interceptors`), imported only by process entry points and server set-up code.
"""

from __future__ import annotations

from opentelemetry import metrics, trace

from codemode_wire.telemetry.propagation import (
    context_from,
    span_traceparent,
)

__all__ = [
    "LATENCY_BUCKETS_S",
    "Instrumented",
    "context_from",
    "resolve_tracer_provider",
    "span_traceparent",
]

# Histogram boundaries for latencies recorded in seconds (the SDK's defaults suit milliseconds).
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
)  # fmt: skip


def resolve_tracer_provider(
    provider: trace.TracerProvider | None = None,
) -> trace.TracerProvider | None:
    """`provider`, else the global one; None when that is the API's no-op (tracing off).

    Components take their provider explicitly (tests pass their own and never touch the global,
    which OpenTelemetry lets a process set only once) and fall back to the global one.
    """
    resolved = provider if provider is not None else trace.get_tracer_provider()
    if isinstance(resolved, trace.NoOpTracerProvider | trace.ProxyTracerProvider):
        return None
    return resolved


class Instrumented:
    """Base of a component's telemetry: its tracer (None when tracing is off) and meter."""

    def __init__(
        self,
        instrumentation: str,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.tracer_provider = resolve_tracer_provider(tracer_provider)
        self._tracer = (
            None
            if self.tracer_provider is None
            else self.tracer_provider.get_tracer(instrumentation)
        )
        self._meter = (meter_provider or metrics.get_meter_provider()).get_meter(instrumentation)

    def _latency_histogram(self, name: str, description: str) -> metrics.Histogram:
        """A histogram of durations in seconds, with bucket boundaries that suit seconds."""
        return self._meter.create_histogram(
            name,
            unit="s",
            description=description,
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S,
        )
