"""The fork server ("zygote"): one pre-initialized process that forks a fresh worker per run.

Started by the runtime (``runtime_service/zygote.py``) as
``python -I -S -c "<loader>" <package root> <control fd> <runtime pid>`` with an empty
environment, stdin and stdout on /dev/null, stderr shared with the runtime. It imports every
module a worker needs and pays their first-use costs once, then serves fork requests on the
control socket and *never runs a program itself*: no program, no binding, no secret ever
reaches it (a request carries only the sandbox config and three descriptors), and it starts
no thread and keeps no event loop open (its warm-up's is closed before it serves), so a child
inherits nothing but the imported modules and their warmed state.

One request, one child:

- request ``{"t": "fork", "id", "entry", "config"}`` with ``SCM_RIGHTS`` descriptors
  ``[channel, stdout, stderr]`` (the runtime made them; the zygote closes its copies once
  the child has them);
- reply ``{"t": "forked", "id", "pid"}`` with a pidfd of the child (the runtime watches and
  kills it through that: no pid-reuse race, as the zygote reaps it, not the runtime), or
  ``{"t": "failed", "id", "error"}``;
- later ``{"t": "exit", "pid", "status"}`` once the zygote has reaped it (status: exit code,
  or minus the signal that killed it).

The child is created as pid 1 of a new pid namespace: ``unshare(CLONE_NEWPID)`` makes the
zygote's *next* child the init of a fresh namespace, the ordinary ``os.fork()`` creates it,
and ``setns`` on the zygote's own namespace undoes the unshare for the fork after. That is
one process per run -- the same count as a raw ``clone(CLONE_NEWPID)``, without bypassing
libc's and CPython's fork handling, and one fewer than an intermediate process that would
unshare and fork (and then have to stay alive as the parent, or the child's parent-death
signal would fire). When the init of a pid namespace dies, the kernel kills every other
process in it and waits for them: so the zygote reaping a worker means the whole run is
gone, whatever the program forked, double-forked or cloned.

Root templates: on the first fork for a sandbox configuration (the trees a language exposes
or hides) a short-lived child builds that configuration's private root in a mount namespace
of its own and exits; the zygote keeps the namespace by a descriptor and hands it to every
later child of that configuration as fd 4 (``TEMPLATE_FD``), which the worker enters, leaves
for a copy of its own, and closes before anything else (``sandbox_child``). The zygote itself
never changes namespace. If a template cannot be built, none is tried again: children build
their own roots.

The zygote dies with the runtime (``PR_SET_PDEATHSIG``) and every worker dies with the
zygote (the same, set first thing in the child). It is a child subreaper: a process orphaned
below it (only possible without pid namespaces) is reparented to it and reaped here.

Stdlib only.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import traceback
from typing import Any, NoReturn

# plugin_harness: imported before any fork, children cannot import it after pivot_root.
from runtime_service.worker import (  # noqa: F401
    bootstrap,
    exec_launch,
    plugin_harness,
    sandbox_child,
)

__all__ = ["CHANNEL_FD", "ENTRIES", "TEMPLATE_FD", "build_root_template", "main"]

CHANNEL_FD = 3  # where a child finds its channel socket (0-2: /dev/null, stdout, stderr)
ENTRIES = {
    # The worker runs in this interpreter: isolate, ready, run one program.
    "bootstrap": bootstrap.serve,
    # The same isolation, then os.execve of the config's interpreter with the channel on
    # fd 3 (what the exec keeps and resets: exec_launch.py).
    "exec": exec_launch.serve,
}
"""How a forked child continues, by the request's ``entry`` (the runtime's language backend
chooses it): nothing else is ever run in a child."""
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15
_CLONE_NEWPID = 0x20000000
_MAX_REQUEST = 1 << 16
_MAX_TEMPLATES = 8  # root templates kept (one per sandbox configuration: a handful in practice)
_TEMPLATE_TIMEOUT_MS = 5000
TEMPLATE_FD = 4  # where a child finds its root template's descriptor, until it enters it
_NR_CLOSE_RANGE = 436  # the same number on every architecture


class _Libc:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL(None, use_errno=True)
        self.lib.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        self.lib.syscall.restype = ctypes.c_long

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    def prctl(self, option: int, arg: int) -> None:
        self._check(self.lib.prctl(option, arg, 0, 0, 0), f"prctl({option})")

    def set_name(self, name: bytes) -> None:
        """The process's name in ps, top and perf (what `comm` shows; at most 15 bytes):
        an operator tells the fork server, a run's init and its worker apart."""
        buffer = ctypes.create_string_buffer(name[:15])
        self._check(
            self.lib.prctl(_PR_SET_NAME, ctypes.addressof(buffer), 0, 0, 0), "prctl(PR_SET_NAME)"
        )

    def unshare(self, flags: int) -> None:
        self._check(self.lib.unshare(flags), "unshare")

    def setns(self, fd: int, flags: int) -> None:
        self._check(self.lib.setns(fd, flags), "setns")

    def close_from(self, first: int) -> None:
        """Close every descriptor from ``first`` up (close_range, Linux >= 5.9)."""
        if self.lib.syscall(_NR_CLOSE_RANGE, first, 0xFFFFFFFF, 0) != 0:
            os.closerange(first, resource_nofile())


def resource_nofile() -> int:
    import resource  # only on kernels without close_range

    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


class Zygote:
    def __init__(self, control: socket.socket, libc: _Libc) -> None:
        self.control = control
        self.libc = libc
        self.children: dict[int, socket.socket] = {}
        """Each live child (the run's init, or the worker itself) and its report socket."""
        # The namespace the zygote lives in, to return to after each unshare.
        self.own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        # Lets a child tell, right after it set its parent-death signal, whether the zygote
        # is already gone (getppid() says nothing: in a new pid namespace it is always 0).
        self.self_pidfd = os.pidfd_open(os.getpid())
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self.pid_namespaces = True
        self.poller = select.poll()
        self.naming: dict[int, int] = {}
        """Report sockets of inits that have not named their worker yet, by fd: init pid."""
        self.templates: dict[str, tuple[int, str]] = {}
        """Root templates by sandbox configuration: a mount namespace descriptor, and how its
        root was switched (``pivot_root`` or ``move``)."""
        self.templates_possible = True

    def serve(self) -> NoReturn:
        poller = self.poller
        poller.register(self.control.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        control = self.control.fileno()
        while True:
            for fd, _ in poller.poll():
                # Each fd is named: an event of a report socket that reap() closed earlier in
                # this round is stale (its fd may even be reused), and must never be taken for
                # a request -- a blocking read of the control socket would then wait forever
                # while the runtime waits for the exits this loop no longer reports.
                if fd == control:
                    self.handle_request()
                elif fd == self.wake_r:
                    while True:
                        try:
                            if not os.read(self.wake_r, 4096):
                                break
                        except BlockingIOError:
                            break
                    self.reap()
                elif fd in self.naming:
                    self.name_worker(fd)

    # -- requests ---------------------------------------------------------------------------
    def handle_request(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.control, _MAX_REQUEST, 4, socket.MSG_DONTWAIT)
        except (InterruptedError, BlockingIOError):
            return  # nothing after all: never block the loop that reaps
        if not data and not fds:
            os._exit(0)  # the runtime closed the control socket: it is going away
        request: object = None
        try:
            request = json.loads(data)
            if type(request) is not dict or request.get("t") != "fork" or len(fds) != 3:
                raise ValueError("malformed fork request")
            pid, worker = self.fork_child(request, fds)
            pidfd = os.pidfd_open(pid)
            try:
                message = {"t": "forked", "id": request.get("id"), "pid": pid, "worker": worker}
                socket.send_fds(self.control, [json.dumps(message).encode()], [pidfd])
            finally:
                os.close(pidfd)
        except Exception as exc:
            request_id = request.get("id") if type(request) is dict else None
            self.send({"t": "failed", "id": request_id, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:  # the child has its own copies
                os.close(fd)

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.control.send(json.dumps(message).encode())
        except OSError:
            os._exit(0)  # the runtime closed the control socket: it is going away

    def fork_child(self, request: dict[str, Any], fds: list[int]) -> tuple[int, int | None]:
        """Fork the run's first process; returns its pid and the worker's (as the host sees
        them: the same process without a pid namespace; None while the init has not named
        it yet)."""
        template = self.root_template(request.get("config"))
        new_namespace = False
        if self.pid_namespaces:
            try:
                self.libc.unshare(_CLONE_NEWPID)
                new_namespace = True
            except OSError as exc:
                # No CAP_SYS_ADMIN: workers share the host's pid namespace (they report it).
                self.pid_namespaces = False
                print(f"fork server: no pid namespaces ({exc})", file=sys.stderr)
        report, report_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        report.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        pid = -1
        try:
            pid = os.fork()
        finally:
            if new_namespace and pid != 0:  # the zygote, not the child
                try:
                    self.libc.setns(self.own_pid_ns, _CLONE_NEWPID)
                except OSError as exc:
                    # The next child would be born into this run's namespace: never.
                    print(f"fork server: cannot leave the unshared namespace ({exc})",
                          file=sys.stderr)  # fmt: skip
                    os._exit(70)
            if pid != 0:
                report_child.close()
        if pid == 0:
            report.close()
            self.become_worker(request, fds, report_child if new_namespace else None, template)
        self.children[pid] = report
        if not new_namespace:
            return pid, pid
        # The init names its worker soon (name_worker); the zygote does not wait for it:
        # on a busy host that wait is a scheduling delay, and it would hold up every fork.
        report.setblocking(False)
        self.naming[report.fileno()] = pid
        self.poller.register(report.fileno(), select.POLLIN)
        return pid, None

    def name_worker(self, fd: int) -> None:
        """The init named its worker with SCM_CREDENTIALS (the kernel translated the pid into
        this namespace, a pid the zygote could not know otherwise): tell the runtime."""
        init = self.naming[fd]
        report = self.children.get(init)
        try:
            worker = _read_worker(report) if report is not None else None
        except BlockingIOError:
            # A stale event: this fd was closed by reap() earlier in the same poll round and
            # reused for a newer run's report socket, whose init has not written yet.
            return
        del self.naming[fd]
        self.poller.unregister(fd)
        if worker is not None:
            self.send({"t": "worker", "pid": init, "worker": worker})

    # -- root templates ---------------------------------------------------------------------
    def root_template(self, config: object) -> tuple[int, str] | None:
        """The root template for this sandbox configuration (built on first use), or None:
        the child then builds its whole private root itself, as a spawned worker does."""
        if type(config) is not dict or not self.templates_possible:
            return None
        key = json.dumps([config.get("expose"), config.get("hide")], sort_keys=True)
        template = self.templates.get(key)
        if template is None and len(self.templates) < _MAX_TEMPLATES:
            fd, detail = build_root_template(self.libc, config)
            if fd is None:
                # No privileges for it: no later configuration will fare better. Workers
                # build their own roots, and report it.
                self.templates_possible = False
                print(f"fork server: no root templates ({detail})", file=sys.stderr)
                return None
            template = self.templates[key] = (fd, detail)
        return template

    # -- the child --------------------------------------------------------------------------
    def become_worker(
        self,
        request: dict[str, Any],
        fds: list[int],
        report: socket.socket | None,
        template: tuple[int, str] | None,
    ) -> NoReturn:
        """In the child: die with the zygote, keep only the run's descriptors, isolate (as
        the worker does), then continue as the requested entry's worker.

        In a pid namespace the child first forks once more and stays behind as the
        namespace's init (``_run_init``). The worker must not be pid 1: the kernel ignores
        every signal that a namespace's init gets from inside it without a handler, so a
        program's ``os.kill(os.getpid(), SIGKILL)`` or ``os.abort()`` would do nothing, and
        orphans would pile up as zombies on a process that never reaps them.
        """
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            poll = select.poll()
            poll.register(self.self_pidfd, select.POLLIN)
            if poll.poll(0):
                os._exit(0)  # the zygote died before the parent-death signal was set
            config = request.get("config", {})
            if type(config) is not dict:
                config = {}
            # Only the fork server names a template descriptor: never one from a request.
            config = {k: v for k, v in config.items() if not k.startswith("mount_template")}
            if report is not None:
                # Init and worker are charged to the run from their first instruction: the
                # init joins before it forks the worker (the worker joins again, a no-op, and
                # reports the outcome).
                cgroups = sandbox_child.SandboxConfig(config).cgroups
                sandbox_child.join_cgroups(cgroups, {})
                worker = os.fork()
                if worker != 0:
                    self.libc.set_name(b"codemode-init")
                    self._run_init(worker, report)
                report.close()
                config = {**config, "pid_namespace": True}
            self.libc.set_name(b"codemode-worker")
            channel, stdout, stderr = fds
            # Above every fd number the targets could collide with, then into place.
            kept = (
                (channel, stdout, stderr)
                if template is None
                else (channel, stdout, stderr, template[0])
            )
            high = [os.dup(fd) for fd in kept]
            moved = [fcntl_dupfd(fd, 10) for fd in high]
            os.dup2(moved[1], 1)
            os.dup2(moved[2], 2)
            os.dup2(moved[0], CHANNEL_FD)
            if template is not None:
                # The worker closes it as soon as it stands in the template (sandbox_child).
                os.dup2(moved[3], TEMPLATE_FD)
                config["mount_template"] = TEMPLATE_FD
                config["mount_template_switch"] = template[1]
            # Only 0 (/dev/null), 1, 2, the channel and the template stay open: the control
            # socket, the zygote's own descriptors and every copy above are closed here.
            self.libc.close_from(CHANNEL_FD + 1 if template is None else TEMPLATE_FD + 1)
            os.setsid()
            gc.enable()
            # The shape of a spawned worker's argv (the package root left out: it is not
            # mounted), not the fork server's: the channel is fd 3.
            sys.argv = [sys.argv[0], "", str(CHANNEL_FD)]
            entry = request.get("entry")
            serve = ENTRIES.get(entry) if type(entry) is str else None
            if serve is not None:
                serve(CHANNEL_FD, config)
            os.write(2, f"fork server: unknown worker entry {entry!r}\n".encode())
            os._exit(2)
        except BaseException:
            try:  # on the child's own stderr pipe: the runtime shows it as the boot failure
                os.write(2, traceback.format_exc().encode("utf-8", "replace")[-4096:])
            finally:
                os._exit(1)  # never return into the zygote's loop

    def _run_init(self, worker: int, report: socket.socket) -> NoReturn:
        """The run's pid 1: reap every process of the run, and when the worker exits, tell
        the zygote its status and exit (the kernel then kills whatever is left of the run).

        It keeps the runtime's user but holds nothing: no descriptor but ``report``, no
        program; a program (another uid, seccomp, not dumpable) cannot signal or trace it.
        """
        try:
            ids = struct.pack("3i", worker, os.getuid(), os.getgid())
            report.sendmsg([b"w"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, ids)])
            os.dup2(report.fileno(), CHANNEL_FD)
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 1)
            os.dup2(null, 2)
            self.libc.close_from(CHANNEL_FD + 1)
            while True:
                try:
                    pid, status = os.waitpid(-1, 0)
                except ChildProcessError:
                    os._exit(0)
                if pid == worker:
                    code = os.waitstatus_to_exitcode(status)
                    os.write(CHANNEL_FD, struct.pack("i", code))
                    os._exit(0)
        except BaseException:
            os._exit(1)

    # -- reaping ----------------------------------------------------------------------------
    def reap(self) -> None:
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            if pid in self.children:
                # Without a pid namespace the worker's descendants are only bound by its
                # process group (seccomp keeps them in it): the group id is still reserved
                # while the leader is unreaped, so this kill hits nobody else.
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                continue
            report = self.children.pop(pid, None)
            if report is not None:
                code = os.waitstatus_to_exitcode(status)
                if self.naming.pop(report.fileno(), None) is not None:
                    self.poller.unregister(report.fileno())
                    with contextlib.suppress(BlockingIOError):  # (the init died first)
                        _read_worker(report)  # never named: the message is still queued
                # The worker's own status, as the run's init saw it (when there is one).
                report.setblocking(False)
                with contextlib.suppress(OSError):
                    data = report.recv(16)
                    if len(data) == 4:
                        code = struct.unpack("i", data)[0]
                report.close()
                self.send({"t": "exit", "pid": pid, "status": code})


def build_root_template(libc: _Libc, config: dict[str, Any]) -> tuple[int | None, str]:
    """Have a short-lived child build a root template in a mount namespace of its own
    (``sandbox_child.build_root_template``) and keep that namespace by a descriptor once the
    child is gone; returns it and how its root was switched, or None and why not."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            switch = sandbox_child.build_root_template(sandbox_child.SandboxConfig(config))
            os.write(ready_w, b"\0" + switch.encode())
            os.read(done_r, 1)  # until the fork server holds the namespace
            os._exit(0)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(ready_w, f"{type(exc).__name__}: {exc}".encode()[:512])
            os._exit(1)
    os.close(ready_w)
    os.close(done_r)
    template: int | None = None
    answer = b"the template builder did not answer"
    try:
        poll = select.poll()
        poll.register(ready_r, select.POLLIN)
        if poll.poll(_TEMPLATE_TIMEOUT_MS):
            answer = os.read(ready_r, 1024)
        if answer.startswith(b"\0"):
            template = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            answer = answer[1:]
    except OSError as exc:
        answer = str(exc).encode()
    finally:
        os.close(ready_r)
        os.close(done_w)  # the builder exits
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)  # (only if it hangs: it is still our child)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return template, answer.decode("utf-8", "replace")


def _read_worker(report: socket.socket) -> int | None:
    """The worker's pid from the init's first message (None if the init died first)."""
    try:
        _, ancillary, _, _ = report.recvmsg(16, socket.CMSG_SPACE(12))
    except BlockingIOError:
        raise  # nothing yet: the caller waits for the next event
    except OSError:
        return None
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int(struct.unpack("3i", data[:12])[0])
    return None


def fcntl_dupfd(fd: int, lowest: int) -> int:
    import fcntl

    duplicate = fcntl.fcntl(fd, fcntl.F_DUPFD, lowest)
    os.close(fd)
    return duplicate


def main() -> NoReturn:
    """Entry point: ``sys.argv`` is ``["-c", <package root>, <control fd>, <runtime pid>]``."""
    libc = _Libc()
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(sys.argv[3]):
        os._exit(0)  # the runtime is already gone
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    libc.set_name(b"codemode-forksv")
    control = socket.socket(fileno=int(sys.argv[2]))
    control.setblocking(True)
    if sys.argv[1] in sys.path:
        sys.path.remove(sys.argv[1])  # nothing more is imported from the runtime's tree
    bootstrap.prewarm_fork_server()
    sandbox_child.prepare()
    import fcntl  # noqa: F401 - used by every child: imported once, here

    # Children touch fewer pages of the zygote's heap (copy-on-write) when the collector
    # never walks the objects that exist now.
    gc.collect()
    gc.freeze()
    gc.disable()
    sandbox_child.SandboxConfig({})  # warm the class
    zygote = Zygote(control, libc)
    zygote.send({"t": "ready", "pid": os.getpid()})
    zygote.serve()
