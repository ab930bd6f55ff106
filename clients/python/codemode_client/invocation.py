"""What a tool handler learns about the call it serves (its optional second parameter)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class InvocationContext:
    call_id: str
    """`<call_id>:code:<n>` for a call from a `run_code` program."""
    root_call_id: str
    """The model's call id."""
    agent: str
    tool_name: str
    timeout: float | None
    """Seconds the caller had left when the invocation was sent; None: no deadline."""
    traceparent: str
    tracestate: str
    cancelled: asyncio.Event
    """Set when the registry cancels the call (a sync handler may poll `is_set()`)."""
