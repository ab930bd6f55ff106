"""codemode_cli/trajectory.py: both encodings read back to what was written, nested calls come
out in the program's call order, and a file that is not a trajectory is refused by name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from codemode_cli.trajectory import RecordedCall, Trajectory, TrajectoryError, dumps, loads


def _record(kind: str, call_id: str, parent: str, tool: str, **extra: Any) -> dict[str, Any]:
    return {
        "seq": 0,
        "time": "2026-01-02T03:04:05.678Z",
        "kind": kind,
        "agent": "agents/a",
        "call_id": call_id,
        "root_call_id": "c",
        "parent_call_id": parent,
        "tool_name": tool,
        "arguments": None,
        "content": [],
        "is_error": False,
        "error_code": "",
        "spill_locator": "",
        **extra,
    }


SPAN = {
    "trace_id": "ab" * 16,
    "span_id": "cd" * 8,
    "parent_span_id": "",
    "name": "execute_tool run_code",
    "kind": "INTERNAL",
    "service": "codemode-registry",
    "start_ns": 10,
    "end_ns": 20,
    "status": "ERROR",
    "status_description": "two\nlines",
    "attributes": {"gen_ai.tool.call.id": "c", "codemode.run.bindings": 2, "ok": True},
    "events": [{"name": "queued", "time_ns": 12, "attributes": {"duration_ms": 1.5}}],
}

TRAJECTORY = Trajectory(
    "c",
    "agents/a",
    "python",
    [
        _record("tool/call", "c", "", "run_code", arguments={"code": "x", "description": "d"}),
        # settled out of order, started in order: the call order is the sub-call number
        _record("tool/code-dispatch-start", "c:code:10", "c", "b", arguments={"n": 10}),
        _record("tool/code-dispatch-start", "c:code:2", "c", "a", arguments={"n": 2}),
        _record("tool/code-dispatch", "c:code:2", "c", "a", content=[{"text": "2"}]),
        _record(
            "tool/code-dispatch",
            "c:code:10",
            "c",
            "b",
            content=[{"text": "Error: no"}],
            is_error=True,
            error_code="E",
        ),
        _record("tool/result", "c", "", "run_code", content=[{"text": "done"}]),
    ],
    [SPAN],
)


@pytest.mark.parametrize("fmt", ["jsonl", "otlp-json"])
def test_each_encoding_reads_back_to_the_same_trajectory(fmt: str) -> None:
    back = loads(dumps(TRAJECTORY, fmt))
    assert (back.call_id, back.agent, back.language) == ("c", "agents/a", "python")
    assert back.records == TRAJECTORY.records
    assert back.program() == ("x", "d")
    assert back.nested_calls() == [
        RecordedCall(2, "c:code:2", "a", {"n": 2}, [{"text": "2"}], False, ""),
        RecordedCall(10, "c:code:10", "b", {"n": 10}, [{"text": "Error: no"}], True, "E"),
    ]


def test_otlp_json_spans_use_the_otlp_field_names_and_types() -> None:
    traces, logs = (json.loads(line) for line in dumps(TRAJECTORY, "otlp-json").splitlines())
    (resource,) = traces["resourceSpans"]
    assert resource["resource"]["attributes"] == [
        {"key": "service.name", "value": {"stringValue": "codemode-registry"}}
    ]
    (span,) = resource["scopeSpans"][0]["spans"]
    assert span["traceId"] == "ab" * 16 and "parentSpanId" not in span
    assert (span["kind"], span["startTimeUnixNano"], span["endTimeUnixNano"]) == (1, "10", "20")
    assert span["status"] == {"code": 2, "message": "two\nlines"}
    assert {"key": "codemode.run.bindings", "value": {"intValue": "2"}} in span["attributes"]
    assert {"key": "ok", "value": {"boolValue": True}} in span["attributes"]
    assert span["events"][0]["attributes"] == [
        {"key": "duration_ms", "value": {"doubleValue": 1.5}}
    ]
    log = logs["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    assert log["timeUnixNano"] == "1767323045678000000" and log["traceId"] == "ab" * 16


@pytest.mark.parametrize(
    ("text", "wording"),
    [
        ("", "the file is empty"),
        ("not json\n", "line 1 is not JSON"),
        ("[1]\n", "line 1 is not a JSON object"),
        ('{"a": 1}\n', "not a trajectory"),
        ('{"type": "trajectory", "version": 9, "call_id": "c"}\n', "trajectory version 9"),
        ('{"type": "trajectory", "version": 1}\n', "names no call_id"),
    ],
)
def test_a_file_that_is_not_a_trajectory_is_refused(text: str, wording: str) -> None:
    with pytest.raises(TrajectoryError, match=wording):
        loads(text)


def test_a_call_that_is_not_a_program_has_nothing_to_replay() -> None:
    direct = Trajectory("c", "a", "python", [_record("tool/call", "c", "", "read")], [])
    with pytest.raises(TrajectoryError, match="not run_code"):
        direct.program()
    with pytest.raises(TrajectoryError, match="no tool/call record of call c"):
        Trajectory("c", "a", "python", [], []).program()
