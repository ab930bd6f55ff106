"""Direct attribute and event writes into SDK spans, and the trace file's line format."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from codemode_common.telemetry.jsonl import span_line
from codemode_wire.telemetry.clean_writes import (
    add_clean_event,
    direct_writes,
    set_clean_attributes,
)

ATTRIBUTES: dict[str, AttributeValue] = {
    "s": 'text é \u2028 "quoted"',
    "i": 7,
    "f": 1.25,
    "b": True,
}


def _provider(limits: SpanLimits | None = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}), span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _written(direct: bool, limits: SpanLimits | None = None, **extra: Any) -> ReadableSpan:
    """One span given ATTRIBUTES (+extra) and an event, through the direct writes or the API."""
    provider, exporter = _provider(limits)
    span = provider.get_tracer("t").start_span("s", attributes={"start": "x"})
    attributes = {**ATTRIBUTES, **extra}
    if direct:
        set_clean_attributes(span, attributes)
        add_clean_event(span, "stage", dict(attributes), 123)
    else:
        span.set_attributes(attributes)
        span.add_event("stage", dict(attributes), timestamp=123)
    span.end()
    (finished,) = exporter.get_finished_spans()
    return finished


def _contents(span: ReadableSpan) -> tuple[Any, ...]:
    return (
        dict(span.attributes or {}),
        [(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events],
    )


def test_sdk_spans_take_the_direct_writes_and_export_what_the_api_would() -> None:
    provider, _ = _provider()
    assert direct_writes(provider.get_tracer("t").start_span("probe"))
    assert _contents(_written(True)) == _contents(_written(False))
    assert dict(_written(True).attributes or {}) == {"start": "x", **ATTRIBUTES}


def test_values_that_need_cleaning_go_through_the_sdk() -> None:
    # A list is stored as a tuple, a value of another type replaced: as the API does.
    extra: dict[str, Any] = {"seq": ["a", "b"], "bad": object()}
    direct, api = _written(True, **extra), _written(False, **extra)
    assert _contents(direct) == _contents(api)
    assert (direct.attributes or {})["seq"] == ("a", "b")
    bad = extra["bad"]
    assert (direct.attributes or {}).get("bad") is not bad
    assert all(v is not bad for e in direct.events for v in (e.attributes or {}).values())


def test_configured_limits_still_apply() -> None:
    truncating = SpanLimits(max_attribute_length=3)
    direct, api = _written(True, truncating), _written(False, truncating)
    assert _contents(direct) == _contents(api)
    assert (direct.attributes or {})["s"] == "tex"
    assert (direct.events[0].attributes or {})["s"] == "tex"
    counting = SpanLimits(max_span_attributes=3, max_event_attributes=2)
    direct, api = _written(True, counting), _written(False, counting)
    assert _contents(direct) == _contents(api)
    assert len(direct.attributes or {}) == 3 and len(direct.events[0].attributes or {}) == 2


def test_an_ended_span_is_left_alone() -> None:
    provider, exporter = _provider()
    span = provider.get_tracer("t").start_span("s")
    span.end()
    set_clean_attributes(span, {"late": 1})
    add_clean_event(span, "late", {"late": 1}, 1)
    (finished,) = exporter.get_finished_spans()
    assert dict(finished.attributes or {}) == {} and list(finished.events) == []


def test_spans_of_another_implementation_go_through_the_api() -> None:
    assert not direct_writes(INVALID_SPAN)
    set_clean_attributes(INVALID_SPAN, {"a": 1})  # the API's no-op span: no error
    add_clean_event(INVALID_SPAN, "e", {"a": 1}, 1)


def _reference(span: ReadableSpan) -> str:
    """The line format, built the slow obvious way."""
    context, parent = span.context, span.parent
    assert context is not None
    record = {
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent else "",
        "name": span.name,
        "kind": span.kind.name,
        "service": span.resource.attributes["service.name"],
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "status_description": span.status.description or "",
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events
        ],
    }
    return json.dumps(record, separators=(",", ":"), default=str)


def test_span_line_is_the_json_of_the_span() -> None:
    provider, exporter = _provider()
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outer ü", kind=SpanKind.SERVER):
        inner = tracer.start_span("inner", attributes={"seq": ("a", "ß"), "n": 2})
        set_clean_attributes(inner, ATTRIBUTES)
        add_clean_event(inner, "stage", {"duration_ms": 0.5, "decision": "deny"}, 42)
        inner.add_event("api", {"list": [1, 2]})
        inner.set_status(Status(StatusCode.ERROR, 'failed: "x"\n'))
        inner.end()
    other_provider, other = _provider()
    other_provider.get_tracer("t").start_span("another service").end()
    spans = [*exporter.get_finished_spans(), *other.get_finished_spans()]
    assert len(spans) == 3
    for span in spans:
        line = span_line(span)
        assert line == _reference(span)
        assert "\n" not in line
    assert (
        json.loads(span_line(spans[0]))["parent_span_id"]
        == json.loads(span_line(spans[1]))["span_id"]
    )
