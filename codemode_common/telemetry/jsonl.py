"""The embedded default trace sink: one JSON object per finished span, appended to a file.

Both services may append to the same file (the default `var/traces.jsonl`): every export batch
is one `write(2)` on an `O_APPEND` descriptor, so lines from different processes never
interleave. `codemode trace` reads the file back (`read_spans`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

__all__ = ["JsonLinesSpanExporter", "read_spans", "span_line"]

_string = json.encoder.encode_basestring_ascii
# The C encoder `json.dumps(..., separators=(",", ":"), default=str)` builds on every call,
# built once (no circular check: attribute values are flat).
_encode = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, str, _string, None, ":", ",", False, False, True
)
_KINDS = {kind: f'"{kind.name}"' for kind in SpanKind}
# Every span of a process has the same resource: its service name is encoded once. One slot
# holding a pair, so that exporters on other threads never see one resource with another's name.
_service: list[tuple[object, str]] = [(None, '""')]


def span_line(span: ReadableSpan) -> str:
    """One span as a JSON object on one line: hex ids, epoch nanoseconds, attributes, events.

    Keys: trace_id, span_id, parent_span_id ("" for a root), name, kind, service, start_ns,
    end_ns, status (UNSET/OK/ERROR), status_description, attributes, events [{name, time_ns,
    attributes}]. Written by hand around the C JSON encoder: the export thread shares the GIL
    with the service's event loop, so this is on every traced call's budget.
    """
    context, parent, status = span.context, span.parent, span.status
    trace_id = f"{context.trace_id:032x}" if context else ""
    span_id = f"{context.span_id:016x}" if context else ""
    parent_id = f"{parent.span_id:016x}" if parent else ""
    events = ",".join(
        [
            f'{{"name":{_string(e.name)},"time_ns":{e.timestamp},'
            f'"attributes":{_attributes(e.attributes)}}}'
            for e in span.events
        ]
    )
    return (
        f'{{"trace_id":"{trace_id}","span_id":"{span_id}","parent_span_id":"{parent_id}",'
        f'"name":{_string(span.name)},"kind":{_KINDS[span.kind]},"service":{_service_of(span)},'
        f'"start_ns":{span.start_time or 0},"end_ns":{span.end_time or 0},'
        f'"status":"{status.status_code.name}",'
        f'"status_description":{_string(status.description or "")},'
        f'"attributes":{_attributes(getattr(span, "_attributes", None) or span.attributes)},'
        f'"events":[{events}]}}'
    )


def _service_of(span: ReadableSpan) -> str:
    resource = span.resource
    cached, encoded = _service[0]
    if cached is not resource:
        encoded = _string(str(resource.attributes.get("service.name", "")))
        _service[0] = (resource, encoded)
    return encoded


def _attributes(attributes: Mapping[str, object] | None) -> str:
    if not attributes:
        return "{}"
    # The SDK's own dict when there: its Mapping wrapper is slow to walk.
    inner = getattr(attributes, "_dict", None)
    if not isinstance(inner, dict):
        inner = attributes if isinstance(attributes, dict) else dict(attributes)
    return "".join(_encode(inner, 0))


class JsonLinesSpanExporter(SpanExporter):
    """Appends finished spans to `path` as JSON lines (the directory is created if needed)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        data = "".join([span_line(span) + "\n" for span in spans]).encode()
        with self._lock:
            if self._fd is None:
                return SpanExportResult.FAILURE
            try:
                view = memoryview(data)
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
            except OSError:
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def read_spans(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The span records in a JSON-lines trace file, in file order (malformed lines skipped)."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            text = line.strip()
            if not text:
                continue
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict) and "span_id" in record:
                yield record
