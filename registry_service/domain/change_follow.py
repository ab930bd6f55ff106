"""Following what other registries sharing the store change (the catalog's scopes, Cordis
plugins): the store says which names changed, or that anything may have changed, and the
follower reloads them through `refresh`.

Notifications that arrive while a reload runs are merged into the next one, so a burst of
changes costs a few reloads, not one each. A reload that fails (the store unavailable) is not
dropped: everything is reloaded once the store answers again, so a missed change cannot leave
this registry stale for good. Records other registries answer (approvals, Cordis run requests,
pages) are also polled (`poll`): a notification the store lost then only delays."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection

from codemode_wire.errors import CodemodeError

log = logging.getLogger(__name__)

RETRY_S = 1.0


class ChangeFollower:
    def __init__(
        self,
        refresh: Callable[[Collection[str] | None], Awaitable[None]],
        what: str,
        *,
        retry_s: float = RETRY_S,
    ) -> None:
        self._refresh = refresh
        self._what = what  # for the log
        self._retry_s = retry_s
        self._names: set[str] = set()
        self._everything = False
        self._task: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._closed = False
        self.reloads = 0  # completed reloads, for tests and metrics

    def changed(self, names: Collection[str] | None) -> None:
        """Another registry changed `names` (None: anything); runs on the event loop."""
        if self._closed:
            return
        if names is None:
            self._everything = True
        else:
            self._names.update(names)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while self._everything or self._names:
            names = None if self._everything else frozenset(self._names)
            self._everything, self._names = False, set()
            try:
                await self._refresh(names)
            except CodemodeError as exc:
                log.warning(
                    "%s: cannot reload other registries' changes: %s", self._what, exc.message
                )
                self._everything = True
                await asyncio.sleep(self._retry_s)
            except Exception:
                log.exception("%s: reloading other registries' changes failed", self._what)
                self._everything = True
                await asyncio.sleep(self._retry_s)
            else:
                self.reloads += 1

    def poll(self, every_s: float, after: Callable[[], None] | None = None) -> None:
        """Reload everything now and every `every_s` until closed, calling `after` (if given)
        after each wait; runs on the event loop."""
        if self._poller is None and not self._closed:
            self._poller = asyncio.ensure_future(self._poll(every_s, after))

    async def _poll(self, every_s: float, after: Callable[[], None] | None) -> None:
        while True:
            self.changed(None)
            await asyncio.sleep(every_s)
            if after is not None:
                after()

    async def close(self) -> None:
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
