"""Process set-up: off / JSON-lines file / OTLP (gRPC and HTTP, to a local fake collector),
settings validation, log correlation, and the global provider left alone."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from pydantic import ValidationError

from codemode_common.telemetry import logs
from codemode_common.telemetry.interceptors import client_interceptors, server_interceptors
from codemode_common.telemetry.jsonl import read_spans
from codemode_common.telemetry.setup import TelemetryConfig, TelemetryConfigError, configure
from codemode_wire.telemetry import resolve_tracer_provider
from registry_service.config import RegistrySettings
from registry_service.domain.telemetry import NO_TRACE, RegistryTelemetry
from runtime_service.config import RuntimeSettings


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    ):
        monkeypatch.delenv(name, raising=False)


def test_off_installs_nothing() -> None:
    telemetry = configure(TelemetryConfig("svc", trace_file="off"))
    assert telemetry.tracer_provider is None and telemetry.meter_provider is None
    # With no provider anywhere, components skip spans and interceptors entirely.
    assert resolve_tracer_provider(None) is None
    telemetry_off = RegistryTelemetry()
    assert telemetry_off.tracer_provider is None
    span = telemetry_off.start_call(call_id="c", name="t", root_call_id="c", agent=None)
    assert span is NO_TRACE
    assert server_interceptors(None) == [] and client_interceptors(None) == []


def test_the_global_provider_is_never_set_by_the_tests() -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_file_export(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "traces.jsonl"
    telemetry = configure(TelemetryConfig("svc-file", trace_file=str(path)))
    assert telemetry.tracer_provider is not None and telemetry.meter_provider is None
    tracer = telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("outer"), tracer.start_as_current_span("inner") as inner:
        inner.add_event("stage", {"duration_ms": 1.5})
    telemetry.shutdown()
    records = {r["name"]: r for r in read_spans(path)}
    assert set(records) == {"outer", "inner"}
    assert records["inner"]["parent_span_id"] == records["outer"]["span_id"]
    assert records["inner"]["trace_id"] == records["outer"]["trace_id"]
    assert records["inner"]["service"] == "svc-file"
    assert records["inner"]["events"][0]["attributes"] == {"duration_ms": 1.5}


class _Collector(
    trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer
):
    def __init__(self) -> None:
        self.spans: list[tuple[str, str]] = []  # (service.name, span name)
        self.metrics: list[str] = []

    def record_traces(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            service = next(
                a.value.string_value
                for a in resource_spans.resource.attributes
                if a.key == "service.name"
            )
            for scope in resource_spans.scope_spans:
                self.spans.extend((service, span.name) for span in scope.spans)

    def record_metrics(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        for resource_metrics in request.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                self.metrics.extend(metric.name for metric in scope.metrics)

    def Export(self, request: Any, context: Any) -> Any:  # both services are named Export
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            self.record_traces(request)
            return trace_service_pb2.ExportTraceServiceResponse()
        self.record_metrics(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def grpc_collector() -> Iterator[tuple[str, _Collector]]:
    collector = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        collector, server
    )
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
        collector, server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", collector
    finally:
        server.stop(0)


@pytest.fixture
def http_collector() -> Iterator[tuple[str, _Collector]]:
    collector = _Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                collector.record_traces(
                    trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                )
            elif self.path == "/v1/metrics":
                request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                collector.record_metrics(request)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", collector
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_export(protocol: str, request: pytest.FixtureRequest) -> None:
    fixture = "grpc_collector" if protocol == "grpc" else "http_collector"
    endpoint, collector = request.getfixturevalue(fixture)
    telemetry = configure(
        TelemetryConfig("svc-otlp", otlp_endpoint=endpoint, otlp_protocol=protocol)
    )
    assert telemetry.destination == f"otlp {protocol} {endpoint}"
    assert telemetry.tracer_provider is not None and telemetry.meter_provider is not None
    telemetry.tracer_provider.get_tracer("test").start_span("exported").end()
    telemetry.meter_provider.get_meter("test").create_counter("codemode.test.count").add(2)
    telemetry.shutdown()
    assert collector.spans == [("svc-otlp", "exported")]
    assert "codemode.test.count" in collector.metrics


def test_otlp_endpoint_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, grpc_collector: tuple[str, _Collector]
) -> None:
    endpoint, collector = grpc_collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    settings = RuntimeSettings(service_name="codemode-runtime-test")
    telemetry = configure(settings.telemetry_config())
    assert telemetry.tracer_provider is not None
    telemetry.tracer_provider.get_tracer("test").start_span("from-env").end()
    telemetry.shutdown()
    assert collector.spans == [("codemode-runtime-test", "from-env")]


def test_settings_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RegistrySettings().telemetry_config().trace_file == "var/traces.jsonl"
    assert RegistrySettings(trace_file="off").telemetry_config().enabled is False
    monkeypatch.setenv("CODEMODE_RUNTIME_TRACE_FILE", "off")
    monkeypatch.setenv("CODEMODE_RUNTIME_SERVICE_NAME", "rt-1")
    runtime = RuntimeSettings()
    assert (runtime.trace_file, runtime.service_name) == ("off", "rt-1")
    with pytest.raises(ValidationError):
        RegistrySettings(otlp_protocol="http/json")
    with pytest.raises(ValidationError):
        RegistrySettings(trace_file="")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-otel")
    assert RegistrySettings().telemetry_config().service_name == "from-otel"
    assert RegistrySettings(service_name="mine").telemetry_config().service_name == "mine"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    with pytest.raises(ValidationError, match="unsupported OTLP protocol"):
        RegistrySettings()
    RegistrySettings(trace_file="off")  # off: the OTLP variables do not matter
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    RegistrySettings(trace_file="")  # no span file, spans over OTLP


def test_an_unwritable_trace_file_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(TelemetryConfigError, match="cannot open trace file"):
        configure(TelemetryConfig("svc", trace_file=str(blocker / "traces.jsonl")))


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_logs_carry_trace_and_span_ids(log_format: str) -> None:
    stream = io.StringIO()
    logger = logging.getLogger(f"codemode.test.{log_format}")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(stream))
    logger.setLevel(logging.INFO)
    logs.install(log_format, logger=logger)
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("logged") as span:
        logger.info("inside")
    logger.info("outside")
    inside, outside = stream.getvalue().splitlines()
    context = span.get_span_context()
    trace_id, span_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
    if log_format == "json":
        assert json.loads(inside)["trace_id"] == trace_id
        assert json.loads(inside)["span_id"] == span_id
        assert json.loads(inside)["message"] == "inside"
        assert "trace_id" not in json.loads(outside)
    else:
        assert f"[trace={trace_id} span={span_id}] inside" in inside
        assert "[trace=- span=-] outside" in outside
