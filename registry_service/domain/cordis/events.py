"""Events a plugin observes (`ctx.on` / `ctx.once`): its owner's history records as they are
written (docs/cordis.md, the `Event.listEvents` provider).

Once an owner has activated a plugin, one watch follows that owner's history; each record of an
observable kind written after the watch began goes to every running plugin of the owner that
listens for its kind, in the order the records were written. `agent/*` records (steering, panel
context) and Cordis's own bookkeeping are not observable."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain import records
from registry_service.domain.records import Record

__all__ = ["OBSERVABLE", "OwnerEvents", "Watch", "payload"]

log = logging.getLogger(__name__)

OBSERVABLE = frozenset(
    {records.TOOL_CALL, records.TOOL_RESULT, records.DISPATCH_START, records.DISPATCH}
)
Watch = Callable[[str, int], AsyncIterator[Record]]  # the history store's `watch`


def payload(record: Record) -> dict[str, JsonValue]:
    """What a listener receives: the record's fields as JSON (content as rendered blocks)."""
    out: dict[str, JsonValue] = {
        "kind": record.kind,
        "callId": record.call_id,
        "rootCallId": record.root_call_id,
        "parentCallId": record.parent_call_id,
        "name": record.name,
        "seq": record.seq,
    }
    for key, text in (("arguments", record.arguments_json), ("content", record.content_json)):
        if text:
            with contextlib.suppress(ValueError):
                out[key] = jsonvalue.loads(text)
    if record.kind in records.END_OF.values():
        out["isError"] = record.is_error
        if record.error_code:
            out["errorCode"] = record.error_code
    return out


class OwnerEvents:
    """One history watch per owner that has activated a plugin; `deliver(owner, record)` hands
    each new observable record on."""

    def __init__(self, watch: Watch | None, deliver: Callable[[str, Record], None]) -> None:
        self._watch = watch
        self._deliver = deliver
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def follow(self, owner: str, agent_id: str) -> None:
        """Starts following ``owner``, whose history is kept under ``agent_id`` (idempotent).
        Records written from now on count: the moment is taken here, synchronously, so a
        record written after the caller's next step is never missed."""
        if self._watch is None or owner in self._tasks:
            return
        task = asyncio.ensure_future(self._follow(self._watch, owner, agent_id, time.time()))
        self._tasks[owner] = task
        task.add_done_callback(lambda _t: self._tasks.pop(owner, None))

    def forget(self, owner: str) -> None:
        task = self._tasks.pop(owner, None)
        if task is not None:
            task.cancel()

    async def _follow(self, watch: Watch, owner: str, agent_id: str, since: float) -> None:
        try:
            async for record in watch(agent_id, 0):
                if record.kind in OBSERVABLE and record.time >= since:
                    self._deliver(owner, record)
        except asyncio.CancelledError:
            raise
        except Exception:  # the store failed: events stop, nothing else does
            log.exception("cordis: following the history of %s failed", owner)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
