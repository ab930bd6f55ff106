"""Both services traced into in-memory exporters and metric readers, a provider in another
process tracing into a JSON-lines file.

Nothing here touches OpenTelemetry's global providers: every component is handed its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from codemode_common.telemetry.jsonl import JsonLinesSpanExporter, read_spans
from registry_service.config import RegistrySettings
from registry_service.domain.execution import Execution
from registry_service.domain.policy import PostDecision
from registry_service.domain.results import ToolResult
from registry_service.domain.scopes import GLOBAL, Mode
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.codemode.conftest import Stack

ROOT = Path(__file__).resolve().parents[2]
REGISTRY, RUNTIME = "codemode-registry", "codemode-runtime"
POLICY = """\
rules:
  - tool: forbidden
    action: deny
    reason: forbidden by policy
  - tool: secret
    action: ask
"""


@dataclass
class Service:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    reader: InMemoryMetricReader

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        """The data points of metric `name`, keyed by their attribute sets."""
        data = self.reader.get_metrics_data()
        found: dict[frozenset[tuple[str, Any]], Any] = {}
        for resource_metrics in data.resource_metrics if data else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            found[frozenset((point.attributes or {}).items())] = point
        return found

    def by(self, name: str, key: str, field: str = "value") -> dict[str, Any]:
        """Metric `name`'s points as {value of attribute `key`: the point's `field`}."""
        return {dict(k).get(key, ""): getattr(p, field) for k, p in self.points(name).items()}

    def total(self, name: str, field: str = "value") -> list[Any]:
        """`field` of each point of metric `name` (one per attribute set)."""
        return [getattr(p, field) for p in self.points(name).values()]


@dataclass
class Captured:
    exporter: InMemorySpanExporter
    registry: Service
    runtime: Service
    trace_file: Path

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    async def wait_for(
        self, predicate: Callable[[list[ReadableSpan]], bool], within: float = 5.0
    ) -> list[ReadableSpan]:
        deadline = time.monotonic() + within
        while True:
            spans = self.spans()
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            await asyncio.sleep(0.02)

    async def file_spans(
        self, predicate: Callable[[list[dict[str, Any]]], bool], within: float = 5.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + within
        while True:
            spans = list(read_spans(self.trace_file)) if self.trace_file.exists() else []
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            await asyncio.sleep(0.05)


def _service(name: str, exporter: InMemorySpanExporter, trace_file: Path) -> Service:
    resource = Resource.create({"service.name": name})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer_provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(trace_file)))
    reader = InMemoryMetricReader()
    return Service(
        tracer_provider, MeterProvider(resource=resource, metric_readers=[reader]), reader
    )


@pytest.fixture
def captured(tmp_path: Path) -> Iterator[Captured]:
    exporter = InMemorySpanExporter()
    trace_file = tmp_path / "traces.jsonl"
    result = Captured(
        exporter,
        _service(REGISTRY, exporter, trace_file),
        _service(RUNTIME, exporter, trace_file),
        trace_file,
    )
    yield result
    for service in (result.registry, result.runtime):
        service.tracer_provider.shutdown()
        service.meter_provider.shutdown()


@pytest.fixture
def runtime_channel() -> str:
    """How the traced registry reaches its runtime (a test parametrizes it to cover both)."""
    return "multiplexed"


@pytest.fixture
async def traced_stack(
    captured: Captured, tmp_path: Path, runtime_channel: str
) -> AsyncIterator[Stack]:
    """Runtime + registry (code mode by default, the test policy), both traced."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(POLICY)
    runtime = await start_runtime(
        RuntimeSettings(listen="127.0.0.1:0", pool_size=1),
        tracer_provider=captured.runtime.tracer_provider,
        meter_provider=captured.runtime.meter_provider,
    )
    config = RegistrySettings(
        listen="127.0.0.1:0",
        history_path=":memory:",
        default_mode=Mode.CODE,
        runtime_targets=[runtime.address],
        policy_rules=rules,
        runtime_channel=runtime_channel,
    )
    registry = build_registry(
        config,
        tracer_provider=captured.registry.tracer_provider,
        meter_provider=captured.registry.meter_provider,
    )
    # A guard and a post-execute hook that change nothing, so every stage has work to show.
    hooks = registry.catalog.hooks(GLOBAL)
    hooks.guards.append(lambda execution: None)

    async def keep(execution: Execution, result: ToolResult, decision: PostDecision) -> Any:
        return decision

    hooks.post_execute.append(keep)
    running = await start_registry(config, registry)
    channel = grpc.aio.insecure_channel(running.address)
    stack = Stack(running, channel)
    stack.runtime = runtime
    try:
        yield stack
    finally:
        await channel.close()
        await running.stop(0)
        await runtime.stop(0)


@pytest.fixture
async def provider_process(traced_stack: Stack, captured: Captured) -> AsyncIterator[None]:
    """`tests.telemetry.provider_process` serving the test tools, its spans in the trace file."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.telemetry.provider_process",
        traced_stack.running.address,
        str(captured.trace_file),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"ready", line
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()
