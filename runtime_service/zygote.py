"""Host side of the fork server: start it, ask it for workers, learn when they exit.

The fork server (``worker/zygote.py``) is a child of the runtime started with
``subprocess.Popen`` like a spawned worker (``python -I -S``, empty environment, ``/`` as cwd,
its own session, stdin/stdout on /dev/null, stderr shared with the runtime for its own
diagnostics, the control socket as the only other descriptor). It is started lazily by the
first fork (a pool starts it at once), restarted by the fork after it died, and stopped by
``close``.

The control socket is a ``SOCK_SEQPACKET`` pair: one JSON message per packet, descriptors
alongside with ``SCM_RIGHTS``. Everything is driven by event-loop callbacks: the socket and a
pidfd of the fork server are watched with ``add_reader``. The runtime is not the parent of a
forked worker, so it cannot ``waitid`` it: the exit status is the one the fork server reports
after reaping it, and the worker's pidfd (made by the fork server before it could reap it,
so never a stranger's) is what kills it.

When the fork server dies, every worker dies with it (their parent-death signal): pending
forks fail with ``WorkerLaunchError`` at once, and each live worker's exit resolves as
``SIGKILL`` as soon as its pidfd says it is gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime_service.reaper import ChildReaper

__all__ = ["ForkServer", "ForkedChild"]

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
# ``ssl`` is kept out of the fork server's imports (asyncio imports it only to offer TLS,
# which no worker can use: it has no network): with it came OpenSSL, 25 more mappings and
# ~1.3 MiB more heap that every fork copies and every worker's exit tears down (~0.3 ms of
# CPU per run here). The fork server drops the marker once its imports are done, so that a
# program may still import ``ssl`` itself.
_LOADER = (
    "import sys;sys.modules.setdefault('ssl',None);sys.path.insert(0,sys.argv[1]);"
    "from runtime_service.worker.zygote import main;main()"
)
_MAX_MESSAGE = 1 << 16
_CLOSE_TIMEOUT_S = 5.0


class ForkServerError(RuntimeError):
    """The fork server could not fork a worker (it is gone, or it refused)."""


@dataclass(eq=False, slots=True)
class ForkedChild:
    """One run's processes forked by the fork server (pids as the host sees them)."""

    pid: int
    """The worker (the process that runs the program)."""
    init_pid: int
    """The run's init, pid 1 of its pid namespace (the worker itself without one)."""
    pidfd: int
    """A pidfd of the init."""
    exited: asyncio.Future[int] = field(repr=False)
    """Resolves with the worker's exit status (negative: the signal) once the fork server
    reaped the init."""

    def kill(self) -> None:
        """SIGKILL the run's init: the kernel kills every other process of its namespace."""
        if self.pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


class ForkServer:
    def __init__(self, python: str) -> None:
        self.python = python
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._pidfd = -1
        self._pending: dict[int, asyncio.Future[ForkedChild]] = {}
        self._children: dict[int, ForkedChild] = {}
        self._outbox: collections.deque[tuple[bytes, list[int]]] = collections.deque()
        self._next_id = 1
        self._closed = False
        self._gone: asyncio.Future[None] | None = None
        self._started_once = False
        self._dying: list[asyncio.Future[int]] = []
        self.restarts = 0
        """How often the fork server had to be started again after it died."""

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the fork server unless it runs (it boots while the caller goes on)."""
        if self._process is not None or self._closed:
            return
        loop = asyncio.get_running_loop()
        # Its children are this process's if it dies first (pid 1, or a subreaper): reaped.
        ChildReaper.install(loop)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Synchronous, like worker spawns: vfork + exec, no Python code in the child.
            process = subprocess.Popen(
                [
                    self.python, "-I", "-S", "-c", _LOADER, _PACKAGE_ROOT,
                    str(child.fileno()), str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(child.fileno(),),
                env={},
                cwd="/",
                start_new_session=True,
                close_fds=True,
            )  # fmt: skip
        except OSError as exc:
            parent.close()
            raise ForkServerError(f"cannot start the fork server: {exc}") from exc
        finally:
            child.close()
        ChildReaper.claim(process.pid)  # reaped by _on_died, never by a sweep
        parent.setblocking(False)
        self._started_once = True
        self._process = process
        self._control = parent
        self._gone = loop.create_future()
        self._pidfd = os.pidfd_open(process.pid)
        loop.add_reader(parent.fileno(), self._on_readable)
        loop.add_reader(self._pidfd, self._on_died)

    async def close(self) -> None:
        """Stop the fork server (workers it forked die with it) and reap it."""
        self._closed = True
        process, gone = self._process, self._gone
        if process is not None and gone is not None:
            await self._stop(gone)
        # Also when it died before close: its workers (killed by their parent-death signal)
        # may still be on their way out.
        if self._dying:
            await asyncio.wait(self._dying, timeout=_CLOSE_TIMEOUT_S)

    async def _stop(self, gone: asyncio.Future[None]) -> None:
        # End of requests ends it cleanly (SIGKILL if it does not go); what it still sends
        # is read to the end, so that a worker forked at the last moment is known and
        # awaited too (it dies with the fork server).
        if self._control is not None:
            with contextlib.suppress(OSError):
                self._control.shutdown(socket.SHUT_WR)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(gone), _CLOSE_TIMEOUT_S)
        if not gone.done():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            await gone

    # -- forking ----------------------------------------------------------------------------
    def fork(
        self, *, config: dict[str, Any], fds: tuple[int, int, int], entry: str
    ) -> asyncio.Future[ForkedChild]:
        """Ask for a new worker with ``fds`` (channel, stdout, stderr) as its fds 3, 1 and 2,
        continuing as ``entry`` (``worker/zygote.py``'s ``ENTRIES``); the future resolves
        once it exists. The caller keeps its copies of ``fds`` until then, and owns the
        worker even if it stopped waiting (it must kill it)."""
        if self._closed:
            raise ForkServerError("the fork server is closed")
        if self._process is None:
            if self._started_once:
                self.restarts += 1
            self.start()
        loop = asyncio.get_running_loop()
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[ForkedChild] = loop.create_future()
        self._pending[request_id] = future
        message = {"t": "fork", "id": request_id, "entry": entry, "config": config}
        self._outbox.append((json.dumps(message, separators=(",", ":")).encode(), list(fds)))
        self._flush()
        return future

    def _flush(self) -> None:
        control = self._control
        if control is None:
            return
        loop = asyncio.get_running_loop()
        while self._outbox:
            data, fds = self._outbox[0]
            try:
                socket.send_fds(control, [data], fds)
            except (BlockingIOError, InterruptedError):
                loop.add_writer(control.fileno(), self._on_writable)
                return
            except OSError:
                return  # the fork server is gone: _on_died fails the pending forks
            self._outbox.popleft()

    def _on_writable(self) -> None:
        if self._control is not None:
            asyncio.get_running_loop().remove_writer(self._control.fileno())
        self._flush()

    # -- messages ---------------------------------------------------------------------------
    def _on_readable(self) -> None:
        control = self._control
        while control is not None:
            try:
                data, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, 2)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:
                self._drop_control()  # it exited (or is exiting): _on_died follows
                return
            self._on_message(data, fds)

    def _on_message(self, data: bytes, fds: list[int]) -> None:
        message = json.loads(data)
        kind = message.get("t")
        if kind == "forked":
            future = self._pending.pop(message["id"], None)
            loop = asyncio.get_running_loop()
            init = int(message["pid"])
            child = ForkedChild(int(message["worker"]), init, fds[0], loop.create_future())
            self._children[init] = child
            ChildReaper.adopt(child.pid)  # ours to reap if the fork server dies first
            for extra in fds[1:]:
                os.close(extra)
            if future is not None:
                future.set_result(child)
            else:  # no request of ours: never leave it running
                child.kill()
                child.exited.add_done_callback(lambda _: child.close())
        elif kind == "failed":
            for fd in fds:
                os.close(fd)
            future = self._pending.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_exception(ForkServerError(f"fork failed: {message.get('error')}"))
        elif kind == "exit":
            exited = self._children.pop(int(message["pid"]), None)
            if exited is not None:
                ChildReaper.forget(exited.pid)
            if exited is not None and not exited.exited.done():
                exited.exited.set_result(int(message["status"]))

    def _drop_control(self) -> None:
        control = self._control
        if control is None:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(control.fileno())
        loop.remove_writer(control.fileno())
        control.close()
        self._control = None

    def _on_died(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        self._on_readable()  # what it sent before it went still counts (exits, forks)
        self._drop_control()
        process = self._process
        assert process is not None
        with contextlib.suppress(ChildProcessError):
            process.wait()
        # Its children that were still alive are this process's now if it is pid 1 or a
        # subreaper (``reaper.py``): the release sweeps for those already gone.
        ChildReaper.release(process.pid)
        self._process = None
        for future in self._pending.values():
            if not future.done():
                why = f"the fork server exited (status {process.returncode})"
                future.set_exception(ForkServerError(why))
        self._pending.clear()
        self._outbox.clear()  # the descriptors belong to the callers, who close them
        # Its workers die with it (parent-death signal): each one's exit is known once its
        # pidfd says it has gone; there is no status to report but the kill.
        # (Those of an earlier instance, if it was restarted, are still awaited by close.)
        self._dying = [exited for exited in self._dying if not exited.done()]
        for child in self._children.values():
            if child.pidfd >= 0 and not child.exited.done():
                if child.pid != child.init_pid:
                    _reap_orphan_worker(loop, child.pid)
                loop.add_reader(child.pidfd, _orphan_exited, loop, child)
                self._dying.append(child.exited)
        self._children.clear()
        if self._gone is not None and not self._gone.done():
            self._gone.set_result(None)


def _reap_orphan_worker(loop: asyncio.AbstractEventLoop, pid: int) -> None:
    """A run's worker is the fork server's child, in the run's pid namespace: with the fork
    server gone it is reparented to this process if it is a child subreaper (or init). Reap
    it then: its zombie would hold its uid, and its init (which the kernel lets exit only
    once every process of the namespace is reaped) would never be gone. Without being its
    reaper, the wait below finds no child of ours and does nothing."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # already reaped (by whoever it went to)

    def reap() -> None:
        loop.remove_reader(pidfd)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
        os.close(pidfd)

    loop.add_reader(pidfd, reap)


def _orphan_exited(loop: asyncio.AbstractEventLoop, child: ForkedChild) -> None:
    loop.remove_reader(child.pidfd)
    # Reparented to this process if it is a child subreaper (or init): reap it, a zombie
    # would go on holding its uid.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitid(os.P_PIDFD, child.pidfd, os.WEXITED | os.WNOHANG)
    ChildReaper.forget(child.pid)
    if not child.exited.done():
        child.exited.set_result(-signal.SIGKILL)
