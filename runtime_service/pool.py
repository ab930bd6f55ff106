"""A pool of pre-spawned, never-used workers.

Each run takes one worker and the worker dies with the run: nothing is ever reused. The pool
keeps ``size`` workers booted up to "waiting for a program" and refills in the background, one
spawn at a time so a burst of runs does not starve the event loop. ``size == 0`` spawns on
demand.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging

from runtime_service.worker_process import WorkerLaunchError, WorkerProcess, WorkerSpec

__all__ = ["WorkerPool"]

_log = logging.getLogger(__name__)
_RETRY_DELAY_S = 1.0


class WorkerPool:
    def __init__(self, spec: WorkerSpec, size: int) -> None:
        if size < 0:
            raise ValueError("pool size must be >= 0")
        self.spec = spec
        self.size = size
        self._idle: collections.deque[WorkerProcess] = collections.deque()
        self._wanted = asyncio.Event()
        self._added = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._closed = False
        self.spawn_failures = 0

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    def start(self) -> None:
        if self._filler is None and self.size > 0:
            self._filler = asyncio.create_task(self._fill(), name="worker-pool-fill")
            self._wanted.set()

    async def wait_filled(self) -> None:
        """Wait until ``size`` idle workers are ready (for tests and benchmarks)."""
        while len(self._idle) < self.size and not self._closed:
            self._added.clear()
            await self._added.wait()

    async def acquire(self) -> WorkerProcess:
        if self._closed:
            raise WorkerLaunchError("worker pool is closed")
        while self._idle:
            worker = self._idle.popleft()
            self._wanted.set()
            if worker.alive:
                return worker
            await worker.kill()
        self._wanted.set()
        return await WorkerProcess.spawn(self.spec)

    async def _fill(self) -> None:
        while not self._closed:
            await self._wanted.wait()
            self._wanted.clear()
            while not self._closed and len(self._idle) < self.size:
                try:
                    worker = await WorkerProcess.spawn(self.spec)
                except WorkerLaunchError as exc:
                    self.spawn_failures += 1
                    _log.warning("worker pool refill failed: %s", exc)
                    await asyncio.sleep(_RETRY_DELAY_S)
                    continue
                if self._closed:
                    await worker.kill()
                    return
                self._idle.append(worker)
                self._added.set()

    async def close(self) -> None:
        """Stop refilling and kill every idle worker; returns once all of them exited."""
        self._closed = True
        self._added.set()
        if self._filler is not None:
            self._filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._filler
        idle, self._idle = list(self._idle), collections.deque()
        await asyncio.gather(*(worker.kill() for worker in idle))
