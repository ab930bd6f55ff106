"""Observers of calls: what turns the pipeline's events (registry_service/domain/events.py) into
history records and telemetry, attached around `Executor.run`, so that the pipeline itself
calls neither a store nor a tracer.

An observer may answer an event with a *write* (an awaitable): a history record on its way to
the store. Who emitted the event decides what the write means, as the call's durability rules
say: a model-direct call's `tool/call` is durable before anything of the call runs and its
`tool/result` before its result is returned (`begin`, `end`: a failed write ends the call with
the store's error, and nothing after it runs); a nested call's start record is durable before
its body runs, and a failed nested record ends its run with the store's error
(registry_service/codemode/bridge.py).

An observer that *raises* is a bug in the observer, not a fact about the call: it is logged and
the call goes on with the same result; the other observers still see the event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from registry_service.domain.events import Observed

log = logging.getLogger(__name__)

Write = Awaitable[Any]


class Observer(Protocol):
    def observe(self, event: Observed) -> Write | None:
        """Sees one event, in the order the call's events happen; may answer with a write."""
        ...


class Observers:
    """The observers of an executor, in order: `begin` events go through them first to last,
    `end` events last to first (each wraps the ones after it, as an around wrapper does)."""

    def __init__(self, observers: Sequence[Observer]) -> None:
        self._observers = tuple(observers)
        self._reversed = self._observers[::-1]

    @property
    def members(self) -> tuple[Observer, ...]:
        """The observers, outermost first."""
        return self._observers

    def notify(self, event: Observed) -> list[Write]:
        """Tells every observer; returns the writes they answered with, for the caller."""
        writes: list[Write] = []
        for observer in self._observers:
            write = _observe(observer, event)
            if write is not None:
                writes.append(write)
        return writes

    def tell(self, event: Observed) -> None:
        """Tells every observer an event whose writes no call waits for (their failures are
        logged)."""
        for write in self.notify(event):
            asyncio.ensure_future(write).add_done_callback(_log_failure)

    async def begin(self, event: Observed) -> None:
        """First to last, each observer's write durable before the next one sees the event;
        a failed write raises, and the observers after it never see the event."""
        for observer in self._observers:
            write = _observe(observer, event)
            if write is not None:
                await write

    async def end(self, event: Observed) -> None:
        """Last to first, each observer's write durable before the next one sees the event; a
        failed write raises once every observer has seen the event."""
        failure: BaseException | None = None
        for observer in self._reversed:
            write = _observe(observer, event)
            if write is None:
                continue
            try:
                await write
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure


def _observe(observer: Observer, event: Observed) -> Write | None:
    try:
        return observer.observe(event)
    except Exception:
        log.exception("observer %s failed on %s", type(observer).__name__, type(event).__name__)
        return None


def _log_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and (error := future.exception()) is not None:
        log.error("an observer's write failed: %s", error)
