"""Hosts kept between one tenant's runs, for engines whose worker can serve run after run.

A worker is never reused by default: each run gets a never-used one (``pool.py``). A language
whose backend says ``keeps_host`` (Monty: its bridge serves each run on a fresh interpreter
session, ``worker_monty/bridge.py``) may instead have the worker of a run that ended cleanly
kept, sandbox and all, for the next run of the **same tenant** (the opaque key the registry
sends with the run: its agent and principal) and of no one else's. What is kept is bounded:

- per tenant: at most ``hosts_per_tenant`` kept hosts alive at once (busy or idle); a run
  that finds all of them busy waits for one to be given back (the first given back goes to
  the run that waited longest) as long as one of them is given back every ``wait_s``, then
  gets a worker used once, as every other language's (for Monty a fresh sandboxed bridge and
  ``monty`` process cost about 100 ms of CPU, a kept host's run a few: a burst of one
  tenant's runs is served far cheaper by its kept hosts one after the other);
- per host: recycled (killed, never handed out again) after ``runs_per_host`` runs, after any
  run that did not end cleanly (a timeout, an out-of-memory end, a crash, a protocol error,
  an abort, an output over its budget: ``Run`` decides), when it dies while idle, and when
  it has been idle ``idle_s``;
- over all tenants: at most ``max_idle`` idle hosts (the least recently used goes first), and
  a launch that finds no sandbox free (every uid held) ends the least recently used idle host
  and tries again, so kept hosts never take capacity a run needs.

A run without a tenant, or of a language that keeps no host, is served as before.

Pure asyncio; never imports grpc.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runtime_service.worker_process import WorkerCapacityError, WorkerProcess

__all__ = ["HostKeeper", "KeptHostLimits", "KeptHosts"]

Key = tuple[str, str]
"""(language, tenant)."""


@dataclass(frozen=True, slots=True)
class KeptHostLimits:
    runs_per_host: int = 100
    """Runs one kept host serves before it is recycled (1: never reused)."""
    idle_s: float = 30.0
    """How long a kept host may wait for its tenant's next run before it is ended."""
    hosts_per_tenant: int = 4
    """Kept hosts one tenant may hold at once, busy or idle (0: none kept)."""
    max_idle: int = 64
    """Idle kept hosts over all tenants (the least recently used is ended beyond it)."""
    wait_s: float = 0.5
    """A run that finds all its tenant's kept hosts busy waits for one while one of them is
    given back every ``wait_s`` (to any waiting run), and takes a worker used once when none
    was for that long (0: it never waits)."""


@dataclass(eq=False, slots=True)
class _Host:
    key: Key
    worker: WorkerProcess
    timer: asyncio.TimerHandle | None = None


class KeptHosts:
    """The runtime's kept hosts, by (language, tenant)."""

    def __init__(self, limits: KeptHostLimits) -> None:
        self.limits = limits
        self._idle: collections.OrderedDict[WorkerProcess, _Host] = collections.OrderedDict()
        """Idle hosts, least recently used first."""
        self._held: collections.Counter[Key] = collections.Counter()
        """Kept hosts alive per key, busy or idle."""
        self._busy: dict[WorkerProcess, Key] = {}
        self._waiting: dict[Key, collections.deque[asyncio.Future[WorkerProcess | None]]] = {}
        """Runs waiting for a host of their key's to be given back, longest waiting first."""
        self._given: collections.Counter[Key] = collections.Counter()
        """Hosts given back per key (the waiting runs' sign that their queue moves)."""
        self._closed = False
        self.recycled = 0
        """Hosts ended by this keeper (recycled, idle, evicted, or died while idle)."""

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    def held(self, language: str, tenant: str) -> int:
        """Kept hosts alive for this tenant's runs of ``language`` (busy or idle)."""
        return self._held[(language, tenant)]

    def waiting(self, language: str, tenant: str) -> int:
        """Runs of this tenant's waiting for one of its kept hosts to be given back."""
        queue = self._waiting.get((language, tenant), ())
        return sum(1 for waiter in queue if not waiter.done())

    def workers(self, language: str, tenant: str) -> list[WorkerProcess]:
        """The kept hosts of this tenant's runs of ``language``, busy ones first."""
        key = (language, tenant)
        busy = [worker for worker, of in self._busy.items() if of == key]
        return busy + [worker for worker, host in self._idle.items() if host.key == key]

    def keeper(self, language: str, tenant: str) -> HostKeeper | None:
        """What a run of this tenant uses to take and give back a kept host (None: no tenant,
        or nothing is kept)."""
        if not tenant or self.limits.hosts_per_tenant <= 0 or self.limits.runs_per_host <= 1:
            return None
        return HostKeeper(self, (language, tenant))

    # -- a run's side -------------------------------------------------------------------------
    def take(self, key: Key) -> WorkerProcess | None:
        """An idle host of ``key``'s, the most recently used, now busy; None if none."""
        for worker in reversed(self._idle):
            host = self._idle[worker]
            if host.key != key:
                continue
            del self._idle[worker]
            if host.timer is not None:
                host.timer.cancel()
            if not worker.alive:
                self._forget(key)
                continue
            self._busy[worker] = key
            return worker
        return None

    async def wait(
        self, key: Key, ended: asyncio.Future[None], deadline: float
    ) -> WorkerProcess | None:
        """When every kept host of ``key``'s is busy and the key may hold no more: the first
        of them given back to this run (now busy, its), while the queue moves. None at once
        when the key is below its cap (a fresh worker may be adopted), and None when no host
        of the key's was given back for ``wait_s`` (its hosts are held by long runs: waiting
        on would not be served soon), a slot opened (one was recycled instead), ``ended``
        (the run's end: an abort) came first, or the loop reached ``deadline`` (the run's).

        Not one timeout for the whole wait: under a burst the queue is long, and runs that
        gave up on it would each boot a host used once (for Monty about 100 ms of CPU, where
        a kept host's run costs a few), slowing every run on the machine, so that more of
        them give up: the kept hosts would serve the burst far faster than that."""
        limits = self.limits
        if self._closed or limits.wait_s <= 0 or self._held[key] < limits.hosts_per_tenant:
            return None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[WorkerProcess | None] = loop.create_future()
        queue = self._waiting.setdefault(key, collections.deque())
        queue.append(waiter)
        try:
            while True:
                given = self._given[key]
                timeout = min(limits.wait_s, deadline - loop.time())
                if timeout <= 0:
                    break
                await asyncio.wait(
                    (waiter, ended), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if waiter.done() or ended.done() or self._given[key] == given:
                    break
        finally:
            if not waiter.done():
                waiter.cancel()
            self._unqueue(key, waiter)
        worker = None if waiter.cancelled() else waiter.result()
        if worker is None:
            return None
        if ended.done() or not worker.alive:
            # Handed over as the run ended (it ran nothing: the next one may have it), or dead.
            self._busy.pop(worker, None)
            if worker.alive:
                self._free(worker, key)
            else:
                self._forget(key)
                self.recycled += 1
            return None
        return worker

    def _unqueue(self, key: Key, waiter: asyncio.Future[WorkerProcess | None]) -> None:
        queue = self._waiting.get(key)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(waiter)
        if not queue:
            del self._waiting[key]

    def _free(self, worker: WorkerProcess, key: Key) -> None:
        """A parked host of ``key``'s no run holds: the longest waiting run's, else idle."""
        self._given[key] += 1
        for waiter in self._waiting.get(key, ()):
            if not waiter.done():
                self._busy[worker] = key
                waiter.set_result(worker)
                return
        host = _Host(key, worker)
        host.timer = asyncio.get_running_loop().call_later(
            self.limits.idle_s, self._end_idle, worker
        )
        self._idle[worker] = host
        while len(self._idle) > self.limits.max_idle:
            self._end_idle(next(iter(self._idle)))

    def adopt(self, key: Key, worker: WorkerProcess) -> bool:
        """A fresh worker a run of ``key`` got: kept after the run if the tenant may hold one
        more host (True), else used once."""
        if self._closed or self._held[key] >= self.limits.hosts_per_tenant:
            return False
        self._held[key] += 1
        self._busy[worker] = key
        worker.exited.add_done_callback(lambda _: self._died(worker))
        return True

    def give_back(self, worker: WorkerProcess, clean: bool) -> bool:
        """The run on ``worker`` is over: True when the host is kept idle for its tenant (the
        run leaves it running), False when the run must end it (not kept, not clean, used up,
        dead, or the keeper is closed)."""
        key = self._busy.pop(worker, None)
        if key is None:
            return False
        keep = (
            clean
            and not self._closed
            and worker.alive
            and worker.runs_served + 1 < self.limits.runs_per_host  # this run counts too
            and worker.park()
        )
        if not keep:
            self._forget(key)
            self.recycled += 1
            return False
        self._free(worker, key)
        return True

    # -- capacity -----------------------------------------------------------------------------
    def evict_idle(self) -> WorkerProcess | None:
        """End the least recently used idle host (a launch found no sandbox free): the ended
        worker, to wait for, or None when there is none."""
        if not self._idle:
            return None
        worker = next(iter(self._idle))
        self._end_idle(worker)
        return worker

    def acquiring(
        self, acquire: Callable[[], Awaitable[WorkerProcess]]
    ) -> Callable[[], Awaitable[WorkerProcess]]:
        """``acquire``, which ends idle kept hosts (least recently used first) while it finds
        no sandbox free."""

        async def acquire_evicting() -> WorkerProcess:
            while True:
                try:
                    return await acquire()
                except WorkerCapacityError:
                    evicted = self.evict_idle()
                    if evicted is None:
                        raise
                    await asyncio.shield(evicted.closed)

        return acquire_evicting

    # -- ends ---------------------------------------------------------------------------------
    def _end_idle(self, worker: WorkerProcess) -> None:
        host = self._idle.pop(worker, None)
        if host is None:
            return
        if host.timer is not None:
            host.timer.cancel()
        self._forget(host.key)
        self.recycled += 1
        worker.signal_group()
        worker.close_when_exited()

    def _died(self, worker: WorkerProcess) -> None:
        """A kept host exited: idle, it is forgotten here (a busy one is its run's to end)."""
        if worker in self._idle:
            self._end_idle(worker)

    def _forget(self, key: Key) -> None:
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]
            self._given.pop(key, None)  # nothing of a tenant's is kept once it holds no host
        # A slot opened: the longest waiting run stops waiting, and its fresh worker may be kept.
        for waiter in self._waiting.get(key, ()):
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Keep nothing more; end every idle host and wait until they are gone."""
        self._closed = True
        for queue in self._waiting.values():
            for waiter in queue:
                if not waiter.done():
                    waiter.set_result(None)
        ending = list(self._idle)
        for worker in ending:
            self._end_idle(worker)
        with contextlib.suppress(Exception):
            await asyncio.gather(*(worker.closed for worker in ending))


@dataclass(frozen=True, slots=True)
class HostKeeper:
    """One run's handle on its tenant's kept hosts."""

    hosts: KeptHosts
    key: Key

    def take(self) -> WorkerProcess | None:
        return self.hosts.take(self.key)

    async def wait(self, ended: asyncio.Future[None], deadline: float) -> WorkerProcess | None:
        return await self.hosts.wait(self.key, ended, deadline)

    def adopt(self, worker: WorkerProcess) -> bool:
        return self.hosts.adopt(self.key, worker)

    def give_back(self, worker: WorkerProcess, clean: bool) -> bool:
        return self.hosts.give_back(worker, clean)
