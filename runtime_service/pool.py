"""A pool of pre-spawned, never-used workers.

Each run takes one worker and the worker dies with the run: nothing is ever reused. The pool
keeps ``size`` workers booted up to "waiting for a program" and refills in the background, one
spawn at a time (at the lowest CPU priority) so a burst of runs does not starve running
programs. ``size == 0`` spawns on demand. Every worker the pool ever started is tracked until
it is reaped, so ``close`` returns only when none is left.

With the ``fork-server`` launch the pool owns the fork server its workers come from: started
with the pool, restarted by the next launch after it died (its workers die with it, and the
runs using them end as ``worker-exit``), stopped by ``close`` after the last worker. The pools
of other languages borrow the same fork server (each request names its language); the owner
closes last.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable

from runtime_service.reaper import ChildReaper
from runtime_service.worker_process import (
    WorkerCapacityError,
    WorkerLaunchError,
    WorkerProcess,
    WorkerSpec,
)
from runtime_service.zygote import ForkServer

__all__ = ["WorkerPool"]

_log = logging.getLogger(__name__)
_RETRY_DELAY_S = 1.0
# A refill starts this long after the hand-off that asked for it. Starting a process in the
# same millisecond as the program that just got its worker tripled that run's latency here
# (4 ms instead of 1.3 ms for ``return 1``: exec and page-table work on the other vCPU); one
# millisecond of deferral removed the effect, five leave a margin.
_REFILL_DEFER_S = 0.005


class WorkerPool:
    def __init__(self, spec: WorkerSpec, size: int, fork_server: ForkServer | None = None) -> None:
        if size < 0:
            raise ValueError("pool size must be >= 0")
        self.spec = spec
        self.size = size
        self._idle: collections.deque[WorkerProcess] = collections.deque()
        self._workers: set[WorkerProcess] = set()
        self._wanted = asyncio.Event()
        self._added = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._closed = False
        self.spawn_failures = 0
        self._owns_fork_server = fork_server is None
        if fork_server is None and spec.forks:
            fork_server = ForkServer(spec.python)
        self.fork_server = fork_server if spec.forks else None
        """Where the workers come from (None: each one is spawned)."""

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    @property
    def live_workers(self) -> int:
        """Workers started by this pool and not yet reaped (idle, running, or dying)."""
        return len(self._workers)

    def start(self) -> None:
        # Orphans of the sandbox that reach this process (pid 1, or a subreaper) are reaped:
        # a zombie would hold its sandbox uid (reaper.py).
        ChildReaper.install()
        ChildReaper.watch_uids(self.spec.uid_base, self.spec.uid_count)
        if self.fork_server is not None and self._owns_fork_server:
            self.fork_server.start()
        if self._filler is None and self.size > 0:
            self._filler = asyncio.create_task(self._fill(), name="worker-pool-fill")
            self._wanted.set()

    async def wait_filled(self) -> None:
        """Wait until ``size`` idle workers are ready (for tests and benchmarks)."""
        while len(self._idle) < self.size and not self._closed:
            self._added.clear()
            await self._added.wait()

    def take_idle(self) -> WorkerProcess | None:
        """A ready, never-used worker at once, or None (then `acquire` waits for one)."""
        if self._closed or not self._idle or not self._idle[0].alive:
            return None
        worker = self._idle.popleft()
        self._wanted.set()
        worker.activate()
        return worker

    async def acquire(self) -> WorkerProcess:
        if self._closed:
            raise WorkerLaunchError("worker pool is closed")
        while self._idle:
            worker = self._idle.popleft()
            self._wanted.set()
            if worker.alive:
                worker.activate()
                return worker
            await worker.kill()
        self._wanted.set()
        return await self._spawn(background=False)

    def launcher(
        self, memory_bytes: int
    ) -> tuple[Callable[[], Awaitable[WorkerProcess]], Callable[[], WorkerProcess | None] | None]:
        """How a run with this memory budget gets its worker (``acquire``, ``take_idle``): the
        pool's workers, unless their heap limit is not the run's. An interpreter that reads
        the budget only when it starts (``LanguageBackend.memory_at_boot``: V8's heap limit)
        cannot serve another budget than the one it was booted for: the run gets a worker
        started for its own (booted on demand, never pooled). Where the limits are set at
        the hand-off (Python's), any pooled worker fits."""
        spec = self.spec
        if not spec.backend.memory_at_boot or memory_bytes == spec.boot_memory_bytes:
            return self.acquire, self.take_idle
        spec = dataclasses.replace(spec, boot_memory_bytes=memory_bytes)
        return functools.partial(self._spawn_for_run, spec), None

    async def _spawn_for_run(self, spec: WorkerSpec) -> WorkerProcess:
        if self._closed:
            raise WorkerLaunchError("worker pool is closed")
        return await self._spawn(background=False, spec=spec)

    async def _spawn(self, *, background: bool, spec: WorkerSpec | None = None) -> WorkerProcess:
        worker = await WorkerProcess.spawn(
            spec or self.spec, background=background, fork_server=self.fork_server
        )
        self._workers.add(worker)
        worker.closed.add_done_callback(lambda _: self._workers.discard(worker))
        return worker

    async def _fill(self) -> None:
        full = False  # the last refill found no sandbox free
        while not self._closed:
            await self._wanted.wait()
            await asyncio.sleep(_REFILL_DEFER_S)
            self._wanted.clear()
            while not self._closed and len(self._idle) < self.size:
                try:
                    worker = await self._spawn(background=True)
                except WorkerLaunchError as exc:
                    self.spawn_failures += 1
                    # A full runtime is logged once until a refill works again, not per retry.
                    if not isinstance(exc, WorkerCapacityError) or not full:
                        _log.warning("worker pool refill failed: %s", exc)
                    full = isinstance(exc, WorkerCapacityError)
                    await asyncio.sleep(_RETRY_DELAY_S)
                    continue
                full = False
                if self._closed:
                    await worker.kill()
                    return
                self._idle.append(worker)
                self._added.set()

    async def close(self) -> None:
        """Stop refilling and kill every worker still alive; returns once all are reaped."""
        self._closed = True
        self._added.set()
        if self._filler is not None:
            self._filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._filler
        self._idle.clear()
        workers = list(self._workers)
        await asyncio.gather(*(worker.kill() for worker in workers))
        await asyncio.gather(*(worker.closed for worker in workers))
        if self.fork_server is not None and self._owns_fork_server:
            await self.fork_server.close()
