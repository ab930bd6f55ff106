"""History retention: whole calls older than the configured age are deleted in the background
(in small batches, so the event loop is never held for long)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

log = logging.getLogger(__name__)

# How often the store is pruned: a tenth of the retention period, within these bounds.
_MIN_EVERY_S = 1.0
_MAX_EVERY_S = 3600.0


class Prunable(Protocol):
    async def prune(self, before: float, *, limit: int = 500) -> int: ...


async def keep_pruning(history: Prunable, retention_s: float, what: str = "calls") -> None:
    """Runs until cancelled: deletes what is older than `retention_s` (the history's whole
    calls, or the approval records that ended)."""
    every = min(max(retention_s / 10, _MIN_EVERY_S), _MAX_EVERY_S)
    while True:
        before = time.time() - retention_s
        deleted = 0
        try:
            while pruned := await history.prune(before):
                deleted += pruned
                await asyncio.sleep(0)  # let calls in flight go on between batches
        except Exception:  # a failed pass is retried at the next one, never fatal
            log.exception("history retention: pruning %s failed", what)
        if deleted:
            log.info(
                "history retention: deleted %d %s older than %.0f s", deleted, what, retention_s
            )
        await asyncio.sleep(every)
