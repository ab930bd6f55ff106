"""The loop behind `ToolProvider.serve()` and `Approver.serve()`: open a stream, serve it until
it ends, open it again, until the owner closes."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

_FIRST_DELAY_S = 0.05


async def serve_until_closed(
    *,
    open_stream: Callable[[], Awaitable[None]],
    stream_ended: Callable[[], Awaitable[None]],
    drop_stream: Callable[[], None],
    closing: Callable[[], bool],
    transient: tuple[type[BaseException], ...],
    max_delay: float,
) -> None:
    """`open_stream` opens with wait_for_ready (reaching a registry again is the channel's
    business); errors of the `transient` types drop the half-open stream and try again, any
    other error ends the loop. Only a stream that failed at once is retried after a pause
    (jittered, doubling up to `max_delay`), so a refusing registry is not hammered."""
    delay = _FIRST_DELAY_S
    while not closing():
        try:
            await open_stream()
        except transient:
            drop_stream()  # e.g. a registry refusing new RPCs while it stops
        else:
            delay = _FIRST_DELAY_S
            await stream_ended()
        if closing():
            return
        await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, max_delay)
