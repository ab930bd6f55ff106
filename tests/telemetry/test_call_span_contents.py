"""The exact attributes and events of a nested call's span, in memory and in the trace file.

The span's attributes and stage events are written straight into the SDK's span (they skip its
per-value cleaning, codemode_wire/telemetry/clean_writes.py): this pins every key, so that a
cut in that path cannot silently drop or change one.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from tests.codemode.conftest import Stack, value_of
from tests.telemetry.conftest import Captured

PROGRAM = """\
first = await tools.lookup({"key": "a"})
errors = []
for name in ("forbidden", "fail_tool"):
    try:
        await getattr(tools, name)({})
    except ToolCallError as e:
        errors.append(name)
return {"key": first["key"], "errors": errors}
"""


def _description(span: ReadableSpan) -> str:
    return str((span.attributes or {})["gen_ai.tool.description"])


def _identity(n: int, tool: str, agent: str) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.call.id": f"pin-1:code:{n}",
        "gen_ai.tool.name": tool,
        "codemode.root_call_id": "pin-1",
        "codemode.agent": agent,
        "codemode.parent_call_id": "pin-1",
    }


def _events(span: ReadableSpan) -> list[tuple[str, list[str]]]:
    return [(e.name, sorted(e.attributes or {})) for e in span.events]


async def test_nested_call_span_attributes_and_events_are_pinned(
    traced_stack: Stack, captured: Captured, provider_process: None
) -> None:
    agent = await traced_stack.code_agent()
    _events_seen, result = await traced_stack.run_code(PROGRAM, agent=agent, call_id="pin-1")
    assert value_of(result)["result"] == {"key": "a", "errors": ["forbidden", "fail_tool"]}

    def done(spans: list[ReadableSpan]) -> bool:
        return sum(s.name.startswith("execute_tool") for s in spans) >= 4

    spans = await captured.wait_for(done)
    nested = {
        s.name.removeprefix("execute_tool "): s
        for s in spans
        if (s.attributes or {}).get("codemode.parent_call_id") == "pin-1"
    }
    assert set(nested) == {"lookup", "forbidden", "fail_tool"}
    lookup, forbidden, failing = nested["lookup"], nested["forbidden"], nested["fail_tool"]

    assert dict(lookup.attributes or {}) == {
        **_identity(1, "lookup", agent),
        "gen_ai.tool.description": _description(lookup),
        "codemode.outcome": "ok",
        "codemode.execution_mode": "parallel",
    }
    assert _description(lookup)
    assert lookup.status.status_code is StatusCode.UNSET
    duration = ["duration_ms"]
    assert _events(lookup) == [
        ("queue_wait", duration),
        ("pre_execute", duration),
        ("guards", duration),
        ("body", duration),
        ("post_execute", duration),
    ]

    assert dict(forbidden.attributes or {}) == {
        **_identity(2, "forbidden", agent),
        "gen_ai.tool.description": _description(forbidden),
        "codemode.outcome": "DENIED",
        "codemode.execution_mode": "exclusive",
        "error.type": "DENIED",
    }
    assert forbidden.status.status_code is StatusCode.ERROR
    assert forbidden.status.description and "forbidden by policy" in forbidden.status.description
    assert _events(forbidden) == [
        ("queue_wait", duration),
        ("pre_execute", ["decision", "duration_ms"]),
        ("post_execute", duration),
    ]
    (decision,) = [e for e in forbidden.events if e.name == "pre_execute"]
    assert (decision.attributes or {})["decision"] == "deny"

    assert dict(failing.attributes or {}) == {
        **_identity(3, "fail_tool", agent),
        "gen_ai.tool.description": _description(failing),
        "codemode.outcome": "BOOM",
        "codemode.execution_mode": "exclusive",
        "error.type": "BOOM",
    }
    assert failing.status.status_code is StatusCode.ERROR

    # The trace file holds the same span, key for key.
    records = await captured.file_spans(
        lambda found: sum(r["name"].startswith("execute_tool") for r in found) >= 4
    )
    by_id = {r["span_id"]: r for r in records}
    for span in nested.values():
        record = by_id[f"{span.context.span_id:016x}"]
        assert record["attributes"] == dict(span.attributes or {})
        assert record["events"] == [
            {"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events
        ]
        assert record["status"] == span.status.status_code.name
        assert record["start_ns"] == span.start_time and record["end_ns"] == span.end_time
