"""The nursery: a small process that makes each run's init, pid 1 of a fresh pid namespace.

Started once by the fork server (``zygote.py``) as
``python -I -S -c "<loader>" <package root> <socket fd> <fork server pid>``, with nothing
imported but the few stdlib modules below, so that forking it costs a fraction of forking the
fork server (measured with ``benchmarks/runtime_floor.py``: a fork and exit of a bare
interpreter is ~0.3 ms of CPU, of the fork server with every worker module warm ~1.8 ms, and
the init then took copy-on-write faults in that large heap). It never runs a program and
holds nothing of one.

One request, one init, on a ``SOCK_SEQPACKET`` socket to the fork server:

- request: ``init`` and the run's cgroup directories (possibly none), ``"\\n"``-separated;
- reply ``b"ok <pid>"`` with a pidfd of the new init (``SCM_RIGHTS``), or
  ``b"failed <errno> <why>"`` (``EPERM``: no pid namespace can be made here, and the fork
  server then forks its workers without one, which they report; anything else fails only
  this fork).

The init (``_run_init``) joins the run's cgroups first, holds no descriptor but
``/dev/null``, and only reaps: the processes the program orphans are reparented to it (the
worker itself is the fork server's child, put into the namespace with ``setns``), and it
ends when the fork server kills it, once the worker has exited; the kernel then kills
whatever is left of the run and waits for it. It keeps the runtime's user, which a program
(another uid, seccomp, not dumpable) can neither signal nor trace; as the namespace's init it
also ignores every signal without a handler that comes from inside the namespace.

The nursery dies with the fork server and every init with the nursery
(``PR_SET_PDEATHSIG``): a run never outlives the process that made it.

Stdlib only, and as little of it as will do.
"""

from __future__ import annotations

import ctypes
import gc
import os
import select
import signal
import socket
import sys
from typing import NoReturn

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_CLONE_NEWPID = 0x20000000
_MAX_REQUEST = 1 << 16
_NR_CLOSE_RANGE = 436  # the same number on every architecture


class _Nursery:
    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.lib = ctypes.CDLL(None, use_errno=True)
        self.lib.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        self.lib.syscall.restype = ctypes.c_long
        for name in ("unshare", "setns"):  # CDLL makes each function object on first use
            getattr(self.lib, name)
        self.own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        # Lets an init tell, right after it set its parent-death signal, whether the nursery
        # is already gone (in its new pid namespace getppid() is always 0).
        self.self_pidfd = os.pidfd_open(os.getpid())
        self.null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    def serve(self) -> NoReturn:
        poller = select.poll()
        control = self.control.fileno()
        poller.register(control, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == control:
                    self.handle_request()
                else:
                    try:
                        while os.read(self.wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    _reap_all()

    def handle_request(self) -> None:
        try:
            data = self.control.recv(_MAX_REQUEST, socket.MSG_DONTWAIT)
        except (InterruptedError, BlockingIOError):
            return
        if not data:
            os._exit(0)  # the fork server closed its end: it is going away
        kind, *paths = data.decode("utf-8", "replace").split("\n")
        if kind != "init":
            self.reply(b"failed 22 malformed request", [])
            return
        cgroups = [path for path in paths if path]
        try:
            pid = self.fork_init(cgroups)
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            self.reply(f"failed {exc.errno or 0} {exc.strerror or exc}".encode(), [])
            return
        try:
            self.reply(f"ok {pid}".encode(), [pidfd])
        finally:
            os.close(pidfd)

    def reply(self, data: bytes, fds: list[int]) -> None:
        try:
            socket.send_fds(self.control, [data], fds)
        except OSError:
            os._exit(0)  # the fork server is gone

    def fork_init(self, cgroups: list[str]) -> int:
        # unshare(CLONE_NEWPID) makes the *next* child the init of a new namespace; setns on
        # the nursery's own namespace undoes it for the fork after.
        self.check(self.lib.unshare(_CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        pid = -1
        try:
            pid = os.fork()
        finally:
            if pid != 0 and self.lib.setns(self.own_pid_ns, _CLONE_NEWPID) != 0:
                os._exit(70)  # the next init would be born into this run's namespace: never
        if pid == 0:
            self._run_init(cgroups)
        return pid

    def _run_init(self, cgroups: list[str]) -> NoReturn:
        try:
            signal.set_wakeup_fd(-1)
            # SIGCHLD stays blocked and is taken with sigwaitinfo: no handler runs in pid 1.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.check(self.lib.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
            poll = select.poll()
            poll.register(self.self_pidfd, select.POLLIN)
            if poll.poll(0):
                os._exit(0)  # the nursery died before the parent-death signal was set
            # Charged to the run from here on (and everything reparented to it already is).
            for path in cgroups:
                fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            name = ctypes.create_string_buffer(b"codemode-init")
            self.lib.prctl(_PR_SET_NAME, ctypes.addressof(name), 0, 0, 0)
            for target in (0, 1, 2):
                os.dup2(self.null, target)
            if self.lib.syscall(_NR_CLOSE_RANGE, 3, 0xFFFFFFFF, 0) != 0:
                os.closerange(3, 1 << 16)
            while True:
                signal.sigwaitinfo({signal.SIGCHLD})
                _reap_all()
        except BaseException:
            os._exit(1)


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> NoReturn:
    """Entry point: ``sys.argv`` is ``["-c", <package root>, <socket fd>, <fork server pid>]``."""
    lib = ctypes.CDLL(None, use_errno=True)
    lib.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    lib.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(sys.argv[3]):
        os._exit(0)  # the fork server is already gone
    name = ctypes.create_string_buffer(b"codemode-inits")
    lib.prctl(_PR_SET_NAME, ctypes.addressof(name), 0, 0, 0)
    control = socket.socket(fileno=int(sys.argv[2]))
    control.setblocking(True)
    if sys.argv[1] in sys.path:
        sys.path.remove(sys.argv[1])
    nursery = _Nursery(control)
    # An init touches fewer pages of the nursery's heap (copy-on-write) when the collector
    # never walks the objects that exist now.
    gc.collect()
    gc.freeze()
    gc.disable()
    nursery.reply(b"ready", [])
    nursery.serve()
