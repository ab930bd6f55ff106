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
- reply ``{"t": "forked", "id", "pid", "worker"}`` with a pidfd of the run's init (the
  runtime kills the run through that: no pid-reuse race, as the runtime reaps neither
  process), ``pid`` the init's and ``worker`` the worker's (the same process without a pid
  namespace), or ``{"t": "failed", "id", "error"}``;
- later ``{"t": "exit", "pid", "status"}`` once every process of the run is gone (status:
  the worker's exit code, or minus the signal that killed it).

Each run gets a pid namespace of its own, with two processes in it. Its init (pid 1) is
made by the nursery (``nursery.py``), a small process the zygote starts once: forking that
costs a fraction of forking the zygote, whose heap holds every worker module. The zygote then
enters the init's namespace for one fork (``setns`` on the init's pidfd, undone right after),
so that its child, the worker, is born there as pid 2 -- a child of the zygote, which reaps
it and so knows its exit status first-hand. The worker must not be pid 1: the kernel ignores
every signal that a namespace's init gets from inside it without a handler, so a program's
``os.kill(os.getpid(), SIGKILL)`` or ``os.abort()`` would do nothing, and orphans would pile
up as zombies on a process that never reaps them; the init reaps them (the kernel reparents
what a process of the namespace orphans to its init, never to a parent outside). Once the
worker is reaped the zygote kills the init: the kernel then kills every other process of the
namespace and waits for them before the init is gone, and only then is the exit reported --
so an exit means the whole run is gone, whatever the program forked, double-forked or cloned.

Root templates: on the first fork for a sandbox configuration (the trees a language exposes
or hides) a short-lived child builds that configuration's private root in a mount namespace
of its own and exits; the zygote keeps the namespace by a descriptor and hands it to every
later child of that configuration as fd 4 (``TEMPLATE_FD``), which the worker enters, leaves
for a copy of its own, and closes before anything else (``sandbox_child``). The zygote itself
never changes its mount namespace. If a template cannot be built, none is tried again:
children build their own roots.

The zygote dies with the runtime (``PR_SET_PDEATHSIG``; it kills its runs and reaps their
workers first, ``Zygote.end``) and every worker dies with the zygote (the same, set first
thing in the child); the nursery dies with the zygote and every init with the nursery, and
the zygote exits if its nursery dies (the runtime starts a new one). It is a child
subreaper: a process orphaned below it (only possible without pid namespaces) is reparented
to it and reaped here.

Stdlib only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import gc
import json
import os
import select
import signal
import socket
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

__all__ = ["CHANNEL_FD", "ENTRIES", "TEMPLATE_FD", "Nursery", "build_root_template", "main"]

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
_NURSERY_LOADER = (
    "import sys;sys.path.insert(0,sys.argv[1]);"
    "from runtime_service.worker.nursery import main;main()"
)
_NURSERY_TIMEOUT_S = 10.0
# What unshare(CLONE_NEWPID) fails with where pid namespaces cannot be had at all.
_NO_PID_NAMESPACES = (errno.EPERM, errno.EINVAL, errno.ENOSYS)


class _Libc:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL(None, use_errno=True)
        self.lib.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        self.lib.syscall.restype = ctypes.c_long

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            number = ctypes.get_errno()
            raise OSError(number, f"{what}: {os.strerror(number)}")

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


class _Run:
    """A live worker of the zygote's and, in a pid namespace, the run's init."""

    __slots__ = ("init", "init_pidfd", "status", "worker")

    def __init__(self, worker: int, init: int | None, init_pidfd: int) -> None:
        self.worker = worker
        self.init = init
        """The run's init (pid 1 of its namespace, the nursery's child), or None."""
        self.init_pidfd = init_pidfd
        self.status = 0
        """The worker's exit status, once it is reaped (reported once the init is gone)."""


class NurseryGone(Exception):
    """The nursery exited: every init, and so every run, is gone with it."""


class Nursery:
    """The zygote's end of the nursery (``nursery.py``): each run's init comes from there."""

    def __init__(self, package_root: str) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Its only descriptor besides 0-2 (the zygote's control socket is not inheritable).
        os.set_inheritable(theirs.fileno(), True)
        argv = [
            sys.executable, "-I", "-S", "-c", _NURSERY_LOADER, package_root,
            str(theirs.fileno()), str(os.getpid()),
        ]  # fmt: skip
        try:
            self.pid = os.posix_spawn(sys.executable, argv, {})
        finally:
            theirs.close()
        self.sock = mine
        self.reaped = False

    def wait_ready(self) -> bool:
        self.sock.settimeout(_NURSERY_TIMEOUT_S)
        try:
            ready = self.sock.recv(64) == b"ready"
        except OSError:
            ready = False
        self.sock.settimeout(None)
        if not ready:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
        return ready

    def make_init(self, cgroups: list[str]) -> tuple[int, int]:
        """A new run's init (joined to ``cgroups``): its pid and a pidfd. OSError if the
        nursery cannot make one (no pid namespaces here); a nursery that went away ends the
        zygote (its inits, and so every run, are gone with it)."""
        try:
            self.sock.send("\n".join(["init", *cgroups]).encode())
            data, fds, _, _ = socket.recv_fds(self.sock, 4096, 1)
        except OSError as exc:
            raise NurseryGone(str(exc)) from exc
        if not data:
            raise NurseryGone("it closed its socket")
        kind, _, detail = data.decode("utf-8", "replace").partition(" ")
        if kind != "ok" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            number, _, why = detail.partition(" ")
            code = int(number) if number.isdigit() else 0
            raise OSError(code, f"the nursery made no init: {why or detail}")
        return int(detail), fds[0]


class Zygote:
    def __init__(self, control: socket.socket, libc: _Libc, nursery: Nursery | None) -> None:
        self.control = control
        self.libc = libc
        self.nursery = nursery
        self.runs: dict[int, _Run] = {}
        """Each live worker by pid."""
        self.ending: dict[int, _Run] = {}
        """Runs whose worker is reaped and whose init was killed, by the init's pidfd: the
        exit is reported once the init is gone (and with it every process of the run)."""
        # The namespace the zygote lives in, to return to after each fork into a run's.
        self.own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        # Lets a child tell, right after it set its parent-death signal, whether the zygote
        # is already gone (getppid() says nothing: in a new pid namespace it is always 0).
        self.self_pidfd = os.pidfd_open(os.getpid())
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        # The parent-death signal (main): the runtime is gone, so is every run.
        self.ending_all = False
        signal.signal(signal.SIGTERM, self._on_term)
        self.pid_namespaces = nursery is not None
        self.poller = select.poll()
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
                if self.ending_all:
                    self.end()
                # Each fd is named: an event of an init's pidfd that an earlier event of this
                # round closed is stale (its fd may even be reused), and must never be taken
                # for a request -- a blocking read of the control socket would then wait
                # forever while the runtime waits for the exits this loop no longer reports.
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
                elif fd in self.ending:
                    self.init_gone(fd)

    def _on_term(self, signum: int, frame: object) -> None:
        self.ending_all = True  # (the wake-up fd ends the poll: serve ends it all)

    def end(self, status: int = 0) -> NoReturn:
        """Kill every run and reap its worker, then exit. A worker is the zygote's child but
        lives in its run's namespace: were the zygote to exit first, it would be reparented
        out of it, to a reaper above the runtime that may never reap it, and its zombie would
        hold the run's uid (and its init, waiting for it, the namespace)."""
        for run in self.runs.values():
            if run.init is not None:
                _kill_init(run.init_pidfd, close=False)
            else:
                with contextlib.suppress(OSError):
                    os.killpg(run.worker, signal.SIGKILL)
        for pid in self.runs:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # killed: a moment
        if self.nursery is not None:
            # Gone before the zygote, as the runs are: the inits it leaves are reparented
            # here (a subreaper) and reaped, so nothing of a run outlives the zygote.
            if not self.nursery.reaped:
                with contextlib.suppress(OSError):
                    os.kill(self.nursery.pid, signal.SIGKILL)
            while True:
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    break
        os._exit(status)

    # -- requests ---------------------------------------------------------------------------
    def handle_request(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.control, _MAX_REQUEST, 4, socket.MSG_DONTWAIT)
        except (InterruptedError, BlockingIOError):
            return  # nothing after all: never block the loop that reaps
        if not data and not fds:
            self.end()  # the runtime closed the control socket: it is going away
        request: object = None
        try:
            request = json.loads(data)
            if type(request) is not dict or request.get("t") != "fork" or len(fds) != 3:
                raise ValueError("malformed fork request")
            run = self.fork_child(request, fds)
            pidfd = run.init_pidfd if run.init is not None else os.pidfd_open(run.worker)
            try:
                message = {
                    "t": "forked",
                    "id": request.get("id"),
                    "pid": run.worker if run.init is None else run.init,
                    "worker": run.worker,
                }
                socket.send_fds(self.control, [json.dumps(message).encode()], [pidfd])
            except OSError:
                self.end()  # the runtime closed the control socket: it is going away
            finally:
                if run.init is None:
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
            self.end()  # the runtime closed the control socket: it is going away

    def fork_child(self, request: dict[str, Any], fds: list[int]) -> _Run:
        """Fork the run's worker: into a new pid namespace whose init the nursery made, or
        (without pid namespaces) into the zygote's own."""
        config = request.get("config")
        template = self.root_template(config)
        init: tuple[int, int] | None = None
        if self.nursery is not None and self.pid_namespaces:
            raw = config if type(config) is dict else {}
            try:
                init = self.nursery.make_init(sandbox_child.SandboxConfig(raw).cgroups)
            except NurseryGone as exc:
                print(f"fork server: the nursery is gone ({exc})", file=sys.stderr)
                self.end(70)
            except OSError as exc:
                if exc.errno not in _NO_PID_NAMESPACES:
                    raise  # this fork fails (out of processes or memory, say), not the next
                # No CAP_SYS_ADMIN: workers share the host's pid namespace (they report it).
                self.pid_namespaces = False
                print(f"fork server: no pid namespaces ({exc})", file=sys.stderr)
        if init is not None:
            try:
                self.libc.setns(init[1], _CLONE_NEWPID)  # for the next fork only
            except OSError:
                _kill_init(init[1])
                raise
        pid = -1
        try:
            pid = os.fork()
        except OSError:
            if init is not None:
                _kill_init(init[1])
            raise
        finally:
            if init is not None and pid != 0:  # the zygote, not the child
                try:
                    self.libc.setns(self.own_pid_ns, _CLONE_NEWPID)
                except OSError as exc:
                    # The next child would be born into this run's namespace: never.
                    print(f"fork server: cannot leave a run's namespace ({exc})", file=sys.stderr)
                    os._exit(70)
        if pid == 0:
            self.become_worker(request, fds, template, in_namespace=init is not None)
        run = _Run(pid, None, -1) if init is None else _Run(pid, init[0], init[1])
        self.runs[pid] = run
        return run

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
        template: tuple[int, str] | None,
        *,
        in_namespace: bool,
    ) -> NoReturn:
        """In the child: die with the zygote, keep only the run's descriptors, isolate (as
        the worker does), then continue as the requested entry's worker."""
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
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
            if in_namespace:
                # Charged to the run from its first instructions, like its init (the worker
                # joins again as it isolates: a no-op, and it reports the outcome).
                sandbox_child.join_cgroups(sandbox_child.SandboxConfig(config).cgroups, {})
                config["pid_namespace"] = True
            self.libc.set_name(b"codemode-worker")
            channel, stdout, stderr = fds
            # Above every fd number the targets could collide with, then into place.
            kept = (
                (channel, stdout, stderr)
                if template is None
                else (channel, stdout, stderr, template[0])
            )
            moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in kept]
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
            run = self.runs.get(pid)
            if run is not None and run.init is None:
                # Without a pid namespace the worker's descendants are only bound by its
                # process group (seccomp keeps them in it): the group id is still reserved
                # while the leader is unreaped, so this kill hits nobody else.
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                continue
            if self.nursery is not None and pid == self.nursery.pid:
                # Every init died with it, and so every run: the runtime starts a new zygote.
                print("fork server: the nursery exited", file=sys.stderr)
                self.nursery.reaped = True
                self.end(70)
            run = self.runs.pop(pid, None)
            if run is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if run.init is None:
                self.send({"t": "exit", "pid": pid, "status": code})
                continue
            # The worker is gone; the rest of the run goes with its init (the kernel kills
            # the namespace and waits for it before the init's pidfd says it is gone).
            run.status = code
            _kill_init(run.init_pidfd, close=False)
            self.ending[run.init_pidfd] = run
            self.poller.register(run.init_pidfd, select.POLLIN)

    def init_gone(self, pidfd: int) -> None:
        run = self.ending.pop(pidfd)
        self.poller.unregister(pidfd)
        os.close(pidfd)
        self.send({"t": "exit", "pid": run.init, "status": run.status})


def _kill_init(pidfd: int, *, close: bool = True) -> None:
    """SIGKILL a run's init (from outside its namespace: it cannot ignore it)."""
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    if close:
        os.close(pidfd)


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


def main() -> NoReturn:
    """Entry point: ``sys.argv`` is ``["-c", <package root>, <control fd>, <runtime pid>]``."""
    libc = _Libc()
    # SIGTERM, not SIGKILL: it ends its runs before it goes (``Zygote.end``); until the
    # handler is in place, before any run, SIGTERM's default ends it just as well.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(sys.argv[3]):
        os._exit(0)  # the runtime is already gone
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    libc.set_name(b"codemode-forksv")
    control = socket.socket(fileno=int(sys.argv[2]))
    control.setblocking(True)
    if sys.argv[1] in sys.path:
        sys.path.remove(sys.argv[1])  # nothing more is imported from the runtime's tree
    os.set_inheritable(control.fileno(), False)  # never the nursery's
    nursery: Nursery | None = None
    try:
        nursery = Nursery(sys.argv[1])  # it boots while the zygote warms up
    except OSError as exc:
        print(f"fork server: no nursery, so no pid namespaces ({exc})", file=sys.stderr)
    bootstrap.prewarm_fork_server()
    sandbox_child.prepare()
    if "ssl" in sys.modules and sys.modules["ssl"] is None:
        del sys.modules["ssl"]  # kept out by the loader (runtime_service/zygote.py)
    if nursery is not None and not nursery.wait_ready():
        print("fork server: the nursery did not start, so no pid namespaces", file=sys.stderr)
        nursery = None
    # Children touch fewer pages of the zygote's heap (copy-on-write) when the collector
    # never walks the objects that exist now.
    gc.collect()
    gc.freeze()
    gc.disable()
    sandbox_child.SandboxConfig({})  # warm the class
    zygote = Zygote(control, libc, nursery)
    zygote.send({"t": "ready", "pid": os.getpid()})
    zygote.serve()
