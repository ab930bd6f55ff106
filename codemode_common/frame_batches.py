"""Batches of frames of many runs for one stream, fair between the runs.

Both ends of the runtime's `Multiplex` stream (`registry_service/runtime_mux.py`,
`runtime_service/multiplex.py`) send through one of these. Frames put in the same event-loop
turn leave as one batch; a lone frame leaves at once (the sender wakes on the first put, it
never waits for a batch to fill). Each batch takes at most `per_run` frames from each run, in
rotation, and stops at `max_bytes`: so a run with thousands of frames queued (a flood of log
lines) delays another run's frames by at most one batch. `room` lets a producer hold its own
frames back while it has `per_run` of them queued here, so what one run queues is bounded and
the rest waits upstream, in that run's own (budgeted) buffer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["FrameBatches"]

Frame = TypeVar("Frame")


class FrameBatches(Generic[Frame]):
    def __init__(self, size: Callable[[Frame], int], *, per_run: int, max_bytes: int) -> None:
        self._size = size
        self._per_run = per_run
        self._max_bytes = max_bytes
        self._queued: dict[int, deque[Frame]] = {}  # runs with frames, in rotation order
        self._rooms: dict[int, asyncio.Event] = {}
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, run_id: int, frame: Frame) -> None:
        if self._closed:
            return
        queue = self._queued.get(run_id)
        if queue is None:
            queue = self._queued[run_id] = deque()
        queue.append(frame)
        if len(queue) >= self._per_run and (room := self._rooms.get(run_id)) is not None:
            room.clear()
        self._ready.set()

    def has_room(self, run_id: int) -> bool:
        """Whether `run_id` has fewer than `per_run` frames queued (a put would not fill it)."""
        queue = self._queued.get(run_id)
        return queue is None or len(queue) < self._per_run

    async def room(self, run_id: int) -> None:
        """Returns once `run_id` has fewer than `per_run` frames queued."""
        queue = self._queued.get(run_id)
        if queue is None or len(queue) < self._per_run:
            return
        room = self._rooms.setdefault(run_id, asyncio.Event())
        room.clear()
        await room.wait()

    def forget(self, run_id: int) -> None:
        """The run is over: nobody waits for its room any more."""
        room = self._rooms.pop(run_id, None)
        if room is not None:
            room.set()

    def close(self) -> None:
        """`next` returns None once what is queued has gone; later puts are dropped."""
        self._closed = True
        self._ready.set()
        for room in self._rooms.values():
            room.set()

    async def next(self) -> list[tuple[int, Frame]] | None:
        """The next batch (at least one frame), waiting for one; None once closed and empty."""
        while not self._queued:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self.take()

    def take(self) -> list[tuple[int, Frame]]:
        """The frames of one batch (none when nothing is queued), without waiting."""
        batch: list[tuple[int, Frame]] = []
        used = 0
        for run_id in list(self._queued):
            queue = self._queued[run_id]
            taken = 0
            while queue and taken < self._per_run:
                frame = queue[0]
                size = self._size(frame)
                if batch and used + size > self._max_bytes:
                    self._make_room(run_id, queue)
                    return batch  # full: this run (and those after it) lead the next batch
                queue.popleft()
                batch.append((run_id, frame))
                used += size
                taken += 1
            # Served: to the back of the rotation, or out of it when it has nothing left.
            del self._queued[run_id]
            if queue:
                self._queued[run_id] = queue
            self._make_room(run_id, queue)
        return batch

    def _make_room(self, run_id: int, queue: deque[Frame]) -> None:
        if len(queue) < self._per_run and (room := self._rooms.get(run_id)) is not None:
            room.set()
