"""Reports the history store's health (to the gRPC health service, through a callback), and
probes an unavailable store so that it is seen to recover even when no call writes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from registry_service.history.store import HistoryStore, StoreState

Report = Callable[[bool], Awaitable[None]]  # True: serving


async def keep_reporting(
    store: HistoryStore, report: Report, *, probe_every_s: float = 1.0
) -> None:
    """Runs until cancelled: reports at once, then on every change of the store's state."""
    state = store.state
    while True:
        await report(state is StoreState.OK)
        if state is StoreState.UNAVAILABLE:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(store.state_changed(state), probe_every_s)
            if store.state is state:
                await store.check()
            state = store.state
        else:  # OK until a failure; CORRUPT for good
            state = await store.state_changed(state)
