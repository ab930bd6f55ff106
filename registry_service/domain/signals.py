"""Abort signals: how cancellation reaches every stage of a tool call.

A signal aborts at most once and remembers why. Only its controller aborts it: a tool body is
handed its call's own signal (the read side), so no wrapper or body can detach the caller's
cancellation, and no per-call signal is derived from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class AbortSignal:
    """Read side of an abort: observed by stages and tool bodies."""

    def __init__(self) -> None:
        self._reason: str | None = None
        self._event = asyncio.Event()
        self._listeners: list[Callable[[str], None]] = []

    @property
    def aborted(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        return self._reason

    async def wait(self) -> str:
        await self._event.wait()
        assert self._reason is not None
        return self._reason

    def add_listener(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Calls `listener(reason)` on abort (at once if already aborted); returns a remover."""
        if self._reason is not None:
            listener(self._reason)
            return lambda: None
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def _abort(self, reason: str) -> None:
        if self._reason is not None:
            return
        self._reason = reason
        self._event.set()
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(reason)


class AbortController:
    """Write side of an abort."""

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: str) -> None:
        self.signal._abort(reason)


def never() -> AbortSignal:
    return AbortSignal()
