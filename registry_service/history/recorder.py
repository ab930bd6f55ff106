"""History recording as an observer of calls: the one writer of the tool-call records.

- `tool/call` when a model-direct call is received, `tool/result` when it has its result;
- `tool/code-dispatch-start` when a nested call starts, `tool/code-dispatch` when it settles.

Only calls of an agent are recorded (a call without one has no history). The writes go back to
whoever emitted the event, which decides what durability the call waits for
(registry_service/domain/observers.py). A nested call whose start record failed gets no settle
record: its run ends with the store's error instead.

The other record kinds have one writer each, where their event happens: `admin/audit` the
servicer's administrative RPCs (registry_service/servicer.py), `access/denied` the tool
authority (registry_service/domain/tool_access.py), `agent/steer` and `agent/inject` Cordis
steering (registry_service/domain/cordis/steering.py).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from registry_service.domain import records
from registry_service.domain.events import (
    CallFinished,
    CallReceived,
    NestedCallSettled,
    NestedCallStarted,
    Observed,
    ObservedCall,
)
from registry_service.domain.observers import Write
from registry_service.domain.records import Record
from registry_service.domain.results import ToolResult
from registry_service.history.store import HistoryStore


class HistoryRecorder:
    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        # Each started nested call's start-record write, until the call settles.
        self._starts: weakref.WeakKeyDictionary[ObservedCall, asyncio.Future[Any]] = (
            weakref.WeakKeyDictionary()
        )

    def observe(self, event: Observed) -> Write | None:
        if isinstance(event, CallReceived) and event.call.agent:
            return self.store.append(_outer(records.TOOL_CALL, event.call))
        if isinstance(event, CallFinished) and event.call.agent:
            return self.store.append(_outer(records.TOOL_RESULT, event.call, event.result))
        if isinstance(event, NestedCallStarted) and event.call is not None and event.call.agent:
            # Not awaited by the call: queued ahead of its body, which waits until it is durable.
            written = self.store.submit(_nested(records.DISPATCH_START, event.call))
            self._starts[event.call] = written
            return written
        if isinstance(event, NestedCallSettled) and event.call is not None and event.call.agent:
            start = self._starts.pop(event.call) if event.call in self._starts else None
            if start is not None and (not start.done() or start.cancelled() or start.exception()):
                return None  # its call was never recorded as started: nothing to settle
            assert event.result is not None
            return self.store.append(_nested(records.DISPATCH, event.call, event.result))
        return None


def _outer(kind: str, call: ObservedCall, result: ToolResult | None = None) -> Record:
    """A model-direct call's record: its arguments on `tool/call` only."""
    arguments = call.recorded_arguments() if result is None else ""
    return _record(kind, call, "", arguments, result)


def _nested(kind: str, call: ObservedCall, result: ToolResult | None = None) -> Record:
    """A nested call's record: under its parent, its arguments on both."""
    return _record(kind, call, call.parent_call_id, call.recorded_arguments(), result)


def _record(
    kind: str, call: ObservedCall, parent: str, arguments: str, result: ToolResult | None
) -> Record:
    return records.record(
        kind,
        agent=call.agent,
        agent_id=call.agent_id,
        call_id=call.call_id,
        root_call_id=call.root_call_id,
        parent_call_id=parent,
        name=call.name,
        arguments_json=arguments,
        result=result,
    )
