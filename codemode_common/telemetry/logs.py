"""Log correlation: every log record carries the trace and span id current when it was made.

`TraceContextFilter` adds `trace_id` and `span_id` (hex; "-" outside any span) to records;
`JsonLogFormatter` writes one JSON object per record with them; `install` puts both on the root
logger's handlers. OpenTelemetry API only.
"""

from __future__ import annotations

import json
import logging
import time

from opentelemetry import trace

__all__ = ["TEXT_FORMAT", "JsonLogFormatter", "TraceContextFilter", "install"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [trace=%(trace_id)s span=%(span_id)s] %(message)s"


class TraceContextFilter(logging.Filter):
    """Adds `trace_id`/`span_id` of the current span to each record (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = f"{context.trace_id:032x}"
            record.span_id = f"{context.span_id:016x}"
        else:
            record.trace_id = record.span_id = "-"
        return True


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, trace_id, span_id, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace_id = getattr(record, "trace_id", "-")
        if trace_id != "-":
            entry["trace_id"] = trace_id
            entry["span_id"] = getattr(record, "span_id", "-")
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def install(log_format: str = "text", logger: logging.Logger | None = None) -> None:
    """Adds the filter to every handler of `logger` (root) and sets the text or JSON format."""
    target = logger or logging.getLogger()
    if not target.handlers:
        target.addHandler(logging.StreamHandler())
    formatter = JsonLogFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    for handler in target.handlers:
        if not any(isinstance(f, TraceContextFilter) for f in handler.filters):
            handler.addFilter(TraceContextFilter())
        handler.setFormatter(formatter)
