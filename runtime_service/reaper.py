"""Reaping the children this process adopts: orphans the kernel reparents to it.

A process adopts orphans when it is pid 1 of its pid namespace (a container's entry point) or
a child subreaper (``PR_SET_CHILD_SUBREAPER``; the test process is one, see
``tests/runtime/conftest.py``). The runtime's own subtree sends it orphans whenever a process
between it and a run dies first: a fork server killed outright leaves its runs' inits (and
whatever else it had not reaped yet) to the nearest reaper above it. Each such zombie keeps
its pid and counts against its uid's process limit -- a sandbox uid with a zombie fails every
later worker's exclusivity check (``worker/sandbox_child.py``, ``uid_is_exclusive``), so an
unreaped orphan is a uid lost for good.

Who waits for what, so that this never takes a status another waiter expects:

- the runtime waits for its own children by pid: a spawned worker (``worker_process.py``,
  ``waitpid`` in ``close``) and each fork server (``zygote.py``, ``Popen.wait``). They
  *claim* their pid here from the moment the ``Popen`` returns until they have reaped it;
- anything else in the process (``subprocess``, asyncio's child watcher, a test's helper)
  waits for the children it started and never claims them.

So the rule, by what this process is:

- pid 1 (``init``): every zombie child nobody claimed is an orphan (the runtime starts no
  child it does not claim), and is reaped: an init must reap what reaches it;
- a child subreaper: whoever made it one starts children of its own and waits for them (a
  test's helper may even run as a sandbox uid), so only orphans of the runtime's sandbox are
  reaped -- the fork server, a run's init or a worker, by the names those processes give
  themselves (``PR_SET_NAME``), any process the fork server said it forked (``adopt``), any
  process in a spawned worker's process group (``adopt_group``), and a process with a
  sandbox uid (``watch_uids``) in a session of its own -- a worker of another runtime on
  this host that was this process's descendant (a runtime subprocess killed outright);
- neither: no orphan ever reaches it, and nothing is installed.

A sweep runs on ``SIGCHLD`` (deferred to the event loop's next turn when one runs, so that a
launcher's ``Popen`` and its claim are never split by it), when asked (``sweep``), and needs
no thread. It first asks the kernel for a waitable child without reaping it
(``waitid(WNOWAIT)``, one call); only when that child is not one to reap does it read
``/proc`` for the rest (a claimed zombie's owner sweeps again once it reaped it).

The module is stdlib only and never imports grpc.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from codemode_common import procfs

__all__ = ["ChildReaper"]

_log = logging.getLogger(__name__)
_PR_GET_CHILD_SUBREAPER = 37
_SANDBOX_NAMES = frozenset(
    {b"codemode-forksv", b"codemode-init", b"codemode-worker", b"codemode-inits"}
)
"""What the fork server, its nursery and their children name themselves (``PR_SET_NAME`` in
``worker/zygote.py`` and ``worker/nursery.py``)."""
INIT = "init"
SUBREAPER = "subreaper"


class ChildReaper:
    """The one reaper of adopted children in this process (class-level, like ``UidLeases``:
    every runtime of the process shares it)."""

    _claimed: set[int] = set()  # noqa: RUF012 - pids whose owner waits for them itself
    _adoptable: set[int] = set()  # noqa: RUF012 - the sandbox's processes by pid
    _groups: set[int] = set()  # noqa: RUF012 - the sandbox's process groups (spawned workers)
    _uid_ranges: set[tuple[int, int]] = set()  # noqa: RUF012 - sandbox uid ranges seen here
    _mode: str | None = None
    _installed = False
    _previous: Any = None
    _loop: asyncio.AbstractEventLoop | None = None
    _scheduled: asyncio.AbstractEventLoop | None = None
    """The loop a sweep is scheduled on (a closed loop's never runs: then one is due again)."""
    reaped: list[tuple[int, int]] = []  # noqa: RUF012 - (pid, status) of the last orphans, newest last
    """The orphans reaped lately (at most 64), for diagnostics and tests."""

    # -- set-up -----------------------------------------------------------------------------
    @classmethod
    def mode(cls) -> str | None:
        """``init``, ``subreaper`` or None: whether (and which) orphans reach this process."""
        if os.getpid() == 1:
            return INIT
        flag = ctypes.c_int(0)
        libc = _libc()
        if libc is None or libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0):
            return None
        return SUBREAPER if flag.value else None

    @classmethod
    def install(cls, loop: asyncio.AbstractEventLoop | None = None) -> str | None:
        """Reap adopted orphans from now on (a no-op where none can reach this process);
        sweeps run on ``loop`` (the running one by default) while it runs. Returns the mode."""
        mode = cls.mode()
        cls._mode = mode
        if mode is None:
            return None
        if loop is None:
            with contextlib.suppress(RuntimeError):
                loop = asyncio.get_running_loop()
        if loop is not None:
            cls._loop = loop
        if not cls._installed and threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGCHLD)
            if previous is not cls._on_sigchld:
                cls._previous = previous
                # SA_RESTART: a blocking call elsewhere never sees EINTR because of it.
                signal.signal(signal.SIGCHLD, cls._on_sigchld)
                signal.siginterrupt(signal.SIGCHLD, False)
            cls._installed = True
        cls.sweep()  # what came before
        return mode

    @classmethod
    def adopt(cls, pid: int) -> None:
        """``pid`` is a process of the sandbox that another process of ours reaps (a worker
        the fork server forked): should it come here, it is ours to reap whatever its name
        (a TypeScript worker is named ``node`` once it exec'd)."""
        cls._adoptable.add(pid)

    @classmethod
    def watch_uids(cls, base: int, count: int) -> None:
        """Sandbox uids are ``[base, base + count)`` (a pool's range, kept for as long as
        this process lives: what a runtime leaves behind may arrive after it stopped)."""
        if len(cls._uid_ranges) < 64:
            cls._uid_ranges.add((base, base + count))

    @classmethod
    def adopt_group(cls, pgid: int) -> None:
        """Every process of group ``pgid`` is the sandbox's: a spawned worker's descendants
        (seccomp keeps them in its group), reparented here when the worker dies first."""
        cls._groups.add(pgid)

    @classmethod
    def forget_group(cls, pgid: int) -> None:
        """No live process is left in group ``pgid`` (its worker released its uid): what
        is left of it is reaped now, and the group id is no longer watched."""
        cls.sweep()
        cls._groups.discard(pgid)

    @classmethod
    def forget(cls, pid: int) -> None:
        """``pid`` was reaped where it was meant to be (the fork server reported its exit)."""
        cls._adoptable.discard(pid)

    # -- claims -----------------------------------------------------------------------------
    @classmethod
    def claim(cls, pid: int) -> None:
        """``pid`` is a child this process waits for itself: never reap it here."""
        cls._claimed.add(pid)

    @classmethod
    def release(cls, pid: int) -> None:
        """The owner of ``pid`` reaped it (or gave up on it): a sweep may go on past it."""
        cls._claimed.discard(pid)
        if cls._mode is not None:
            cls.sweep()

    @classmethod
    def claimed(cls) -> frozenset[int]:
        return frozenset(cls._claimed)

    # -- sweeping ---------------------------------------------------------------------------
    @classmethod
    def _on_sigchld(cls, signum: int, frame: FrameType | None) -> None:
        loop = cls._loop
        if loop is not None and not loop.is_closed() and loop.is_running():
            if cls._scheduled is not loop:
                cls._scheduled = loop
                # The next turn: a launcher between its Popen and its claim finishes first
                # (threadsafe: it wakes a loop that waits in its selector).
                loop.call_soon_threadsafe(cls._scheduled_sweep)
        else:
            cls.sweep()
        previous = cls._previous
        if callable(previous):
            previous(signum, frame)

    @classmethod
    def _scheduled_sweep(cls) -> None:
        cls._scheduled = None
        cls.sweep()

    @classmethod
    def sweep(cls) -> int:
        """Reap every adopted zombie that is ours to reap now; returns how many."""
        if cls._mode is None:
            return 0
        count = 0
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return count
            if info is None:
                return count
            if info.si_pid in cls._claimed:
                # Its owner reaps it and sweeps again then (``release``): no scan now.
                return count
            if not cls._ours(info.si_pid):
                # Another waiter's child is first in line: look at every zombie instead.
                return count + cls._sweep_procfs()
            if cls._reap(info.si_pid):
                count += 1

    @classmethod
    def _sweep_procfs(cls) -> int:
        count = 0
        me = os.getpid()
        for pid in procfs.children(me, ended=True):
            if cls._ours(pid) and cls._reap(pid):
                count += 1
        return count

    @classmethod
    def _ours(cls, pid: int) -> bool:
        if pid in cls._claimed:
            return False
        if cls._mode == INIT:
            return True
        return pid in cls._adoptable or _is_sandbox_process(pid, cls._groups, cls._uid_ranges)

    @classmethod
    def _reap(cls, pid: int) -> bool:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return False
        if info is None:
            return False
        status = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        cls.reaped.append((pid, status))
        del cls.reaped[:-64]
        _log.debug("reaped orphan %d (status %d)", pid, status)
        return True


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _is_sandbox_process(pid: int, groups: set[int], ranges: set[tuple[int, int]]) -> bool:
    """Whether ``pid`` (a zombie child, which keeps its name, ids and session) is the
    sandbox's: a name the fork server's processes give themselves, one of the sandbox's
    process groups, or a sandbox uid in a session of its own (every worker, spawned or
    forked, starts one: a helper this process started under a sandbox uid, in its session,
    is not taken)."""
    found = procfs.stat(pid)
    if found is None:
        return False
    if found.name in _SANDBOX_NAMES:
        return True
    if found.pgid in groups:
        return True
    if not ranges or found.sid == os.getsid(0):
        return False
    facts = procfs.ids(pid)
    return facts is not None and any(
        low <= uid < high for low, high in ranges for uid in facts.uids
    )
