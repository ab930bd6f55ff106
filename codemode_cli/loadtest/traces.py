"""The scheduler's own queue wait, when the started services were traced (--trace-file).

The registry records each nested call's `queue_wait` stage (submission to start, measured inside
the scheduler) as a span event; no RPC exposes it, so without a trace file the report derives
queue wait from history records instead (see losscheck.queue_waits).
"""

from __future__ import annotations

from pathlib import Path

from codemode_common.telemetry.jsonl import read_spans

QUEUE_WAIT = "queue_wait"


def scheduler_queue_waits(path: str, agent: str) -> list[float] | None:
    """Milliseconds per nested call of this agent's load programs (`lt-*`); None if unreadable."""
    if not Path(path).is_file():
        return None
    waits = []
    try:
        for span in read_spans(path):
            attributes = span.get("attributes") or {}
            nested = bool(attributes.get("codemode.parent_call_id"))
            root = str(attributes.get("codemode.root_call_id", ""))
            # Only this agent's nested calls of load programs: not outer calls, not the warm-up.
            if (
                attributes.get("codemode.agent") != agent
                or not nested
                or not root.startswith("lt-")
            ):
                continue
            for event in span.get("events") or []:
                if event.get("name") == QUEUE_WAIT:
                    waits.append(float(event["attributes"]["duration_ms"]))
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return waits
