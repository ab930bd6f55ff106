"""One call's trajectory as a file: its history records (the call and every nested call) and
its spans, written by `codemode history export` and read back by `codemode replay`.

Two encodings:

- `jsonl`: a header line `{"type": "trajectory", "version": 1, "call_id", "agent",
  "language"}`, then a line per history record `{"type": "record", ...}` (the fields of
  `codemode history --json`), then a line per span `{"type": "span", ...}` (the fields of the
  services' trace file, codemode_common/telemetry/jsonl.py).
- `otlp-json`: the OTLP JSON encoding, one request per line as OTLP JSON files hold them (an
  OpenTelemetry Collector's `otlpjsonfile` receiver reads it): an `ExportTraceServiceRequest`
  with the spans, then an `ExportLogsServiceRequest` with a log record per history record
  (body: the record's JSON; the header's fields are resource attributes).

Nothing here does I/O or RPC: the commands read and write the text.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORMATS",
    "RecordedCall",
    "Trajectory",
    "TrajectoryError",
    "dumps",
    "loads",
]

FORMATS = ("jsonl", "otlp-json")
VERSION = 1
_SCOPE = "codemode"
_HEADER_KEYS = {
    "codemode.trajectory.version": "version",
    "codemode.call_id": "call_id",
    "codemode.agent": "agent",
    "codemode.code_language": "language",
}
_KINDS = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
_STATUS = {"UNSET": 0, "OK": 1, "ERROR": 2}


class TrajectoryError(ValueError):
    """A file that is not a trajectory this version can read; the message says what is wrong."""


@dataclass(frozen=True)
class RecordedCall:
    """One nested call of the program, as its dispatch records tell it."""

    index: int
    """Its place in the program's call order: n of its sub-call id `<call_id>:code:<n>`."""
    call_id: str
    tool_name: str
    arguments: Any
    content: list[Any]
    """The result's content blocks (`{"text": ...}`, `{"json": ...}`, `{"image": ...}`)."""
    is_error: bool
    error_code: str


@dataclass(frozen=True)
class Trajectory:
    call_id: str
    agent: str
    language: str
    """The agent's program language when it was exported (the program is in it)."""
    records: list[dict[str, Any]]
    spans: list[dict[str, Any]]

    def program(self) -> tuple[str, str]:
        """The `code` and `description` arguments of the call's `run_code`; TrajectoryError
        if the file has no such call."""
        for record in self.records:
            if record.get("kind") == "tool/call" and record.get("call_id") == self.call_id:
                arguments = record.get("arguments")
                if record.get("tool_name") == "run_code" and isinstance(arguments, dict):
                    code, description = arguments.get("code"), arguments.get("description")
                    if isinstance(code, str):
                        return code, description if isinstance(description, str) else ""
                raise TrajectoryError(
                    f"call {self.call_id} is a {record.get('tool_name')!r} call, not run_code "
                    "with a program: there is nothing to replay"
                )
        raise TrajectoryError(f"the file has no tool/call record of call {self.call_id}")

    def nested_calls(self) -> list[RecordedCall]:
        """The program's own nested calls in call order, each with its settled result (a call
        that never settled has is_error and error code INTERRUPTED)."""
        prefix = f"{self.call_id}:code:"
        started: dict[str, dict[str, Any]] = {}
        settled: dict[str, dict[str, Any]] = {}
        for record in self.records:
            call_id = str(record.get("call_id", ""))
            if record.get("parent_call_id") != self.call_id or not call_id.startswith(prefix):
                continue
            if record.get("kind") == "tool/code-dispatch-start":
                started[call_id] = record
            elif record.get("kind") == "tool/code-dispatch":
                settled[call_id] = record
        calls = []
        for call_id, start in started.items():
            suffix = call_id.removeprefix(prefix)
            if not suffix.isdigit():
                continue
            end = settled.get(call_id, {})
            calls.append(
                RecordedCall(
                    index=int(suffix),
                    call_id=call_id,
                    tool_name=str(start.get("tool_name", "")),
                    arguments=start.get("arguments"),
                    content=list(end.get("content") or []),
                    is_error=bool(end.get("is_error", True)),
                    error_code=str(end.get("error_code", "INTERRUPTED" if not end else "")),
                )
            )
        return sorted(calls, key=lambda c: c.index)


def dumps(trajectory: Trajectory, fmt: str) -> str:
    """The trajectory in `fmt` (one of FORMATS), newline-terminated lines."""
    if fmt == "jsonl":
        header = {
            "type": "trajectory",
            "version": VERSION,
            "call_id": trajectory.call_id,
            "agent": trajectory.agent,
            "language": trajectory.language,
        }
        lines = [header]
        lines += [{"type": "record", **r} for r in trajectory.records]
        lines += [{"type": "span", **s} for s in trajectory.spans]
        return "".join(_line(line) for line in lines)
    if fmt == "otlp-json":
        return _line(_otlp_traces(trajectory.spans)) + _line(_otlp_logs(trajectory))
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def loads(text: str) -> Trajectory:
    """A trajectory from either encoding (told apart by its first line)."""
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise TrajectoryError(f"line {number} is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise TrajectoryError(f"line {number} is not a JSON object")
        lines.append(value)
    if not lines:
        raise TrajectoryError("the file is empty")
    if lines[0].get("type") == "trajectory":
        return _from_jsonl(lines)
    if any("resourceLogs" in line or "resourceSpans" in line for line in lines):
        return _from_otlp(lines)
    raise TrajectoryError(
        "not a trajectory: expected `codemode history export` output (jsonl or otlp-json)"
    )


def _line(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n"


def _from_jsonl(lines: list[dict[str, Any]]) -> Trajectory:
    header = lines[0]
    if header.get("version") != VERSION:
        raise TrajectoryError(f"trajectory version {header.get('version')!r}; this reads {VERSION}")
    records, spans = [], []
    for line in lines[1:]:
        kind = line.pop("type", None)
        if kind == "record":
            records.append(line)
        elif kind == "span":
            spans.append(line)
    return _trajectory(header, records, spans)


def _trajectory(
    header: Mapping[str, Any], records: list[dict[str, Any]], spans: list[dict[str, Any]]
) -> Trajectory:
    call_id = header.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise TrajectoryError("the header names no call_id")
    return Trajectory(
        call_id, str(header.get("agent", "")), str(header.get("language", "")), records, spans
    )


# --- OTLP JSON -------------------------------------------------------------------------------


def _any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _key_values(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in attributes.items()]


def _plain(value: Mapping[str, Any]) -> Any:
    """An OTLP AnyValue as a plain value."""
    if "arrayValue" in value:
        return [_plain(v) for v in value["arrayValue"].get("values", [])]
    if "intValue" in value:
        return int(value["intValue"])
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    return None


def _attributes(key_values: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {kv["key"]: _plain(kv.get("value", {})) for kv in key_values}


def _otlp_span(span: Mapping[str, Any]) -> dict[str, Any]:
    encoded: dict[str, Any] = {
        "traceId": span.get("trace_id", ""),
        "spanId": span.get("span_id", ""),
        "name": span.get("name", ""),
        "kind": _KINDS.get(str(span.get("kind", "")), 0),
        "startTimeUnixNano": str(span.get("start_ns", 0)),
        "endTimeUnixNano": str(span.get("end_ns", 0)),
        "attributes": _key_values(span.get("attributes", {})),
        "events": [
            {
                "timeUnixNano": str(e.get("time_ns", 0)),
                "name": e.get("name", ""),
                "attributes": _key_values(e.get("attributes", {})),
            }
            for e in span.get("events", [])
        ],
        "status": {"code": _STATUS.get(str(span.get("status", "")), 0)},
    }
    if span.get("parent_span_id"):
        encoded["parentSpanId"] = span["parent_span_id"]
    if span.get("status_description"):
        encoded["status"]["message"] = span["status_description"]
    return encoded


def _otlp_traces(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """An ExportTraceServiceRequest: a resource per service, its spans in one scope."""
    by_service: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_service.setdefault(str(span.get("service", "")), []).append(_otlp_span(span))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _key_values({"service.name": service})},
                "scopeSpans": [{"scope": {"name": _SCOPE}, "spans": encoded}],
            }
            for service, encoded in by_service.items()
        ]
    }


def _record_ns(record: Mapping[str, Any]) -> str:
    try:
        when = datetime.datetime.fromisoformat(str(record.get("time", "")))
    except ValueError:
        return "0"
    return str(int(when.timestamp() * 1_000_000) * 1000)


def _otlp_logs(trajectory: Trajectory) -> dict[str, Any]:
    """An ExportLogsServiceRequest: a log record per history record, in the call's trace."""
    trace_id = next((s.get("trace_id", "") for s in trajectory.spans), "")
    header = {
        "codemode.trajectory.version": VERSION,
        "codemode.call_id": trajectory.call_id,
        "codemode.agent": trajectory.agent,
        "codemode.code_language": trajectory.language,
    }
    logs = []
    for record in trajectory.records:
        log: dict[str, Any] = {
            "timeUnixNano": _record_ns(record),
            "body": {"stringValue": json.dumps(record, ensure_ascii=False)},
            "attributes": _key_values(
                {
                    "codemode.history.kind": record.get("kind", ""),
                    "gen_ai.tool.call.id": record.get("call_id", ""),
                }
            ),
        }
        if trace_id:
            log["traceId"] = trace_id
        logs.append(log)
    return {
        "resourceLogs": [
            {
                "resource": {"attributes": _key_values(header)},
                "scopeLogs": [{"scope": {"name": "codemode.history"}, "logRecords": logs}],
            }
        ]
    }


def _from_otlp(lines: list[dict[str, Any]]) -> Trajectory:
    header: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    spans: list[dict[str, Any]] = []
    for line in lines:
        for resource_logs in line.get("resourceLogs", []):
            attributes = _attributes(resource_logs.get("resource", {}).get("attributes", []))
            header.update({_HEADER_KEYS[k]: v for k, v in attributes.items() if k in _HEADER_KEYS})
            for scope in resource_logs.get("scopeLogs", []):
                for log in scope.get("logRecords", []):
                    body = _plain(log.get("body", {}))
                    try:
                        records.append(json.loads(body))
                    except (TypeError, ValueError) as exc:
                        raise TrajectoryError(
                            f"a log record's body is not a record: {exc}"
                        ) from exc
        for resource_spans in line.get("resourceSpans", []):
            for scope in resource_spans.get("scopeSpans", []):
                spans.extend(scope.get("spans", []))
    if header.get("version") != VERSION:
        raise TrajectoryError(
            f"trajectory version {header.get('version')!r} in the logs' resource; this reads "
            f"{VERSION}"
        )
    return _trajectory(header, records, spans)
