"""Sandbox uids: leased one per live worker, never handed out while the host has a process
with that uid, and reclaimed from what a previous runtime left behind.

Three layers, each for what the others cannot see:

- a set in this process says which uids its workers hold;
- each lease also binds an abstract Unix socket named after the uid, which the kernel frees
  when the lease ends or this process dies: runtimes sharing a network namespace (tests,
  benchmarks, replicas on one host) never lease the same uid at once;
- the host itself: a worker refuses to run when the kernel counts another task of its uid
  (``sandbox_child.uid_is_exclusive``, exact and O(1), checked in every worker after the
  drop); its uid is then marked dirty, skipped by every lease, and reclaimed: what holds it
  is killed, found by scanning /proc (the host's view: every pid namespace). At start the
  runtime reclaims its whole range the same way (``reclaim_range``): processes a SIGKILLed
  runtime left behind die before any of their uids is leased again. A uid leased by a live
  runtime on this host (its socket is bound) is never touched.

Runtimes in other network namespaces (other containers on the host) need disjoint ranges.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import time

from codemode_common import procfs
from runtime_service.reaper import ChildReaper

__all__ = ["UidLeases", "live_processes_of", "processes_in_range"]

_log = logging.getLogger(__name__)
_POLL_S = 0.005
_RECLAIM_TIMEOUT_S = 5.0


class UidLeaseError(RuntimeError):
    """No sandbox uid is free."""


class UidLeases:
    """Leases of sandbox uids: no two live workers ever share one."""

    _held: dict[int, socket.socket | None] = {}  # noqa: RUF012 - shared by every runtime
    _dirty: set[int] = set()  # noqa: RUF012 - a process of ours found it held by another
    _tasks: set[asyncio.Task[None]] = set()  # noqa: RUF012 - reclaims under way
    _cursor = 0

    @classmethod
    def acquire(cls, base: int, count: int) -> int:
        try:
            return cls._acquire(base, count)
        except UidLeaseError:
            if not cls._dirty:
                raise
        # Out of clean uids: one scan tells which dirty ones were freed since (a zombie
        # reaped at last by its parent, say; adopted ones are reaped here first).
        ChildReaper.sweep()
        cls._dirty.intersection_update(processes_in_range(base, base + count))
        return cls._acquire(base, count)

    @classmethod
    def _acquire(cls, base: int, count: int) -> int:
        for step in range(count):
            uid = base + (cls._cursor + step) % count
            if uid in cls._held or uid in cls._dirty:
                continue
            lock = cls._lock(uid)
            if lock is False:
                continue  # leased by another process
            cls._held[uid] = lock if isinstance(lock, socket.socket) else None
            cls._cursor = (cls._cursor + step + 1) % count
            return uid
        raise UidLeaseError(f"no free sandbox uid in [{base}, {base + count})")

    @staticmethod
    def _lock(uid: int) -> socket.socket | bool:
        """The host-wide lock for ``uid``: a bound socket, False if another process holds
        it, True if abstract sockets are unavailable (then only this process coordinates)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"\0codemode-sandbox-uid-{uid}")
        except OSError as exc:
            sock.close()
            return exc.errno != errno.EADDRINUSE
        return sock

    @classmethod
    def release(cls, uid: int) -> None:
        lock = cls._held.pop(uid, None)
        if lock is not None:
            lock.close()

    @classmethod
    def leased(cls) -> frozenset[int]:
        return frozenset(cls._held)

    @classmethod
    def dirty(cls) -> frozenset[int]:
        return frozenset(cls._dirty)

    @classmethod
    def mark_dirty(cls, uid: int) -> asyncio.Task[None]:
        """A worker found another process holding ``uid`` (its own lease just ended): skip
        the uid from now on, until whatever holds it is killed and gone (the task)."""
        cls._dirty.add(uid)
        task = asyncio.create_task(cls._reclaim_dirty(uid))
        cls._tasks.add(task)
        task.add_done_callback(cls._tasks.discard)
        return task

    @classmethod
    async def _reclaim_dirty(cls, uid: int) -> None:
        try:
            if uid in cls._held or await cls._reclaim(uid):
                cls._dirty.discard(uid)
        except Exception:  # a uid left dirty is only one uid less
            _log.exception("reclaiming sandbox uid %d failed", uid)

    @classmethod
    async def reclaim_range(cls, base: int, count: int) -> list[int]:
        """Kill every process in ``[base, base + count)`` that no live runtime leases (what
        a runtime killed outright left behind), and wait until they are gone. Returns the
        uids reclaimed; one that still has processes afterwards stays dirty."""
        found = sorted(processes_in_range(base, base + count))
        # Ours (a live worker, or being reclaimed already) stay as they are.
        candidates = [uid for uid in found if uid not in cls._held and uid not in cls._dirty]
        cls._dirty.update(candidates)
        results = await asyncio.gather(*(cls._reclaim(uid) for uid in candidates))
        reclaimed = [uid for uid, clean in zip(candidates, results, strict=True) if clean]
        cls._dirty.difference_update(reclaimed)
        if reclaimed:
            _log.warning("killed processes left in sandbox uids %s", reclaimed)
        return reclaimed

    @classmethod
    async def _reclaim(cls, uid: int) -> bool:
        """Lock ``uid``, kill its processes, wait until none is left; True when clean.
        False when another live runtime holds it (not ours to kill) or it stayed held."""
        lock = cls._lock(uid)
        if lock is False:
            return not live_processes_of(uid)  # another runtime's worker: not ours to kill
        try:
            deadline = time.monotonic() + _RECLAIM_TIMEOUT_S
            while pids := live_processes_of(uid):
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(_POLL_S)
            # A zombie cannot be killed, only reaped by its parent; it still counts against
            # the uid's process limit (the worker's exclusivity check fails on it), so the
            # uid is free only once no task of it is left, zombies included. One adopted by
            # this process (pid 1, or a subreaper) is reaped here; another's stays dirty
            # until its parent reaps it, and no lease waits for it meanwhile.
            ChildReaper.sweep()
            return not live_processes_of(uid, zombies=True)
        finally:
            if isinstance(lock, socket.socket):
                lock.close()


def processes_in_range(low: int, high: int) -> dict[int, list[int]]:
    """Every process on the host (zombies included) with a uid or gid in ``[low, high)``."""
    found: dict[int, list[int]] = {}
    for pid, facts in procfs.scan_ids():
        for uid in facts.uids | facts.gids:
            if low <= uid < high:
                found.setdefault(uid, []).append(pid)
    return found


def live_processes_of(uid: int, *, zombies: bool = False) -> list[int]:
    """Processes on the host with ``uid`` among their uids or gids (zombies if asked)."""
    return [
        pid
        for pid, facts in procfs.scan_ids()
        if (uid in facts.uids or uid in facts.gids) and (zombies or not facts.ended)
    ]
