"""Process set-up: builds the SDK providers a service exports through (SDK code lives here).

- `trace_file = "off"`: nothing is installed; the OpenTelemetry API stays a no-op and every
  component skips its spans entirely.
- an OTLP endpoint (`otlp_endpoint`, else `OTEL_EXPORTER_OTLP_ENDPOINT` /
  `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`): spans and metrics are exported over OTLP, gRPC or
  HTTP/protobuf per `otlp_protocol`, else `OTEL_EXPORTER_OTLP_PROTOCOL` (default
  `http/protobuf`, as the OpenTelemetry specification says).
- otherwise (the embedded default): spans are appended to the JSON-lines `trace_file`
  (`var/traces.jsonl`), which `codemode trace` reads; metrics have no sink and are not collected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from codemode_common.telemetry.config import OFF, TelemetryConfig, TelemetryConfigError
from codemode_common.telemetry.jsonl import JsonLinesSpanExporter

__all__ = ["OFF", "Telemetry", "TelemetryConfig", "TelemetryConfigError", "configure"]

_FILE_SCHEDULE_DELAY_MS = 1000  # the trace file is read by people: flush it promptly


@dataclass
class Telemetry:
    """The providers a process exports through; None where nothing is collected."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    destination: str = OFF
    """Where spans go, for the start-up log line: "off", the trace file path, or "otlp ..."."""

    def install_global(self) -> None:
        """Makes these the process-wide providers (entry points only; tests never do this)."""
        if self.tracer_provider is not None:
            trace.set_tracer_provider(self.tracer_provider)
        if self.meter_provider is not None:
            metrics.set_meter_provider(self.meter_provider)

    def shutdown(self) -> None:
        """Flushes and stops the exporters."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def configure(config: TelemetryConfig) -> Telemetry:
    """Builds the providers for `config` (validating it); installs nothing globally."""
    if not config.enabled:
        return Telemetry()
    resource = Resource.create({"service.name": config.service_name})
    tracer_provider = TracerProvider(resource=resource)
    endpoint = config.endpoint()
    if endpoint:
        protocol = config.protocol()
        span_exporter, metric_exporter = _otlp_exporters(protocol, config.otlp_endpoint)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        reader = PeriodicExportingMetricReader(metric_exporter)
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        return Telemetry(tracer_provider, meter_provider, f"otlp {protocol} {endpoint}")
    try:
        exporter = JsonLinesSpanExporter(config.trace_file)
    except OSError as exc:
        raise TelemetryConfigError(
            f"cannot open trace file {config.trace_file}: {exc} (set trace_file to a writable "
            'path, to "off", or configure an OTLP endpoint)'
        ) from exc
    delay = None if os.environ.get("OTEL_BSP_SCHEDULE_DELAY") else _FILE_SCHEDULE_DELAY_MS
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=delay))
    return Telemetry(tracer_provider, None, str(exporter.path))


def _otlp_exporters(protocol: str, endpoint: str) -> tuple[SpanExporter, MetricExporter]:
    """OTLP exporters; with no explicit endpoint they read the standard OTEL_* variables."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )

        if endpoint:
            return GrpcSpanExporter(endpoint=endpoint), GrpcMetricExporter(endpoint=endpoint)
        return GrpcSpanExporter(), GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    if endpoint:
        base = endpoint.rstrip("/")
        return (
            HttpSpanExporter(endpoint=f"{base}/v1/traces"),
            HttpMetricExporter(endpoint=f"{base}/v1/metrics"),
        )
    return HttpSpanExporter(), HttpMetricExporter()
