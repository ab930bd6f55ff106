"""Host-side handle of one worker process: launch, channel, output pipes, exit, termination.

Two launches (``WorkerSpec.launch``). ``fork-server``, the default: the pool's fork server
(``zygote.py``) forks the worker from a pre-initialized, never-used process, into a pid
namespace of its own below the run's init; the runtime hands it the channel and pipes it
made, learns its exit from the fork server and kills the run's init through a pidfd -- and
with it, every process of the run.
``spawn``: each worker is a fresh interpreter, as below; a fake worker (a test's ``loader``)
always spawns.

Spawned workers are started with ``subprocess.Popen`` (CPython's ``_posixsubprocess`` execs straight
away, with vfork when it can, so no Python code and no ``pthread_atfork`` handler of the
runtime -- grpc's among them -- runs in the child). The child is ``python -I -S`` with an empty
environment, ``/`` as cwd (it moves into its private root, or into a fresh directory it
reports when it cannot build one), its own session/process group, stdin on /dev/null,
stdout/stderr on pipes, and the channel socket as the only other descriptor (``close_fds``).
Either way the worker isolates itself before it reports ready (see ``worker/sandbox_child.py``)
and drops to a uid of its own, leased (``sandbox_uids.py``) for as long as any process of the
run lives. Its run's cgroup (``run_cgroup``) is made here before the launch and joined first
thing in the child (a forked run's init and its worker join it first thing, so every process
of the run is in it); it is removed once every process in it is gone.

Everything is driven by event-loop callbacks, with no task or thread per worker: the channel
socket, both pipes and a pidfd (for the exit) are watched with ``add_reader``. The pidfd
replaces asyncio's child watcher, which would park a thread in ``waitpid`` per worker and wake
the loop through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import math
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from codemode_common import procfs
from runtime_service import run_cgroup
from runtime_service.frame_reader import FrameEvent, FrameLimits, FrameReader
from runtime_service.languages import LanguageBackend, default_backend
from runtime_service.reaper import ChildReaper
from runtime_service.run_cgroup import RunCgroup
from runtime_service.sandbox_uids import UidLeaseError, UidLeases, live_processes_of
from runtime_service.worker import flatwire, framing
from runtime_service.worker.sandbox_child import PID_NAMESPACE_OWN
from runtime_service.zygote import ForkedChild, ForkServer, ForkServerError

__all__ = [
    "UidLeases",
    "WorkerCapacityError",
    "WorkerLaunch",
    "WorkerLaunchError",
    "WorkerProcess",
    "WorkerSpec",
]

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
# How a worker continues once launched (the fork server's ``ENTRIES``; a spawned worker runs
# the entry's module): in this interpreter, or isolated and then exec'd into another one.
_BOOTSTRAP = "bootstrap"
_EXEC = "exec"
_ENTRY_MODULES = {
    _BOOTSTRAP: "runtime_service.worker.bootstrap",
    _EXEC: "runtime_service.worker.exec_launch",
}
_BOOT_NICE = 19  # a booting worker yields the CPU to running programs (reset on hand-off)
_RECV_BYTES = 1 << 16
# Replies the worker has not read yet beyond which its channel is not read either (reading is
# what makes refusals): a worker that floods calls and never reads holds the runtime to this
# much, plus one read's replies. Reading resumes once half of it is gone. Both workers take
# in what the runtime sends while a write of theirs waits, so a genuine one never waits for it.
_BACKLOG_PAUSE_BYTES = 16 << 20
_GROUP_POLL_S = 0.002
_GROUP_EXIT_TIMEOUT_S = 10.0
# Frame limits of a channel read outside any run: only the framing's own cap.
_UNBOUNDED = FrameLimits(framing.MAX_FRAME_BYTES, framing.MAX_FRAME_BYTES, framing.MAX_FRAME_BYTES)
_UID_ATTEMPTS = 8  # uids tried per launch when workers find theirs held by another process

WorkerLaunch = Literal["fork-server", "spawn"]


def _loader(entry: str) -> str:
    """The ``-c`` code of a spawned worker continuing as ``entry``."""
    return (
        f"import sys;sys.path.insert(0,sys.argv[1]);from {_ENTRY_MODULES[entry]} import main;main()"
    )


class WorkerLaunchError(RuntimeError):
    """A worker could not be started or did not report ready."""


class WorkerCapacityError(WorkerLaunchError):
    """No sandbox is free: every uid of the range is leased to a live worker. Nothing ran; a
    worker that ends frees one (the runtime answers RESOURCE_EXHAUSTED with RetryInfo)."""


class _UidBusy(WorkerLaunchError):
    """The worker found its uid held by another process on the host."""


def _runtime_paths() -> tuple[str, ...]:
    """Paths of the runtime itself, masked in a worker's root if an exposed tree holds them."""
    paths = {_PACKAGE_ROOT, sys.prefix, tempfile.gettempdir(), os.path.expanduser("~")}
    with contextlib.suppress(AttributeError):
        paths.update(site.getsitepackages())
    paths.add(site.getusersitepackages())
    return tuple(sorted(os.path.realpath(p) for p in paths if p and os.path.isabs(p)))


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """How workers are started."""

    python: str = field(default_factory=lambda: os.path.realpath(sys.executable))
    """Interpreter to run (``-I -S``: no site-packages, no environment, no user paths)."""
    ready_timeout_s: float = 10.0
    temp_root: str | None = None
    """Where a worker that cannot build its private root makes its working directory (the
    system default when None); it reports the path and the runtime removes it afterwards."""
    loader: str | None = None
    """Code passed to ``-c`` instead of the language's own worker (None): tests substitute a
    fake worker that speaks raw protocol."""
    uid_base: int = 60_000
    uid_count: int = 1_000
    """Workers run as ``uid_base + slot`` (gid the same), each live worker with its own. The
    range must hold no other user's processes or files on this host, and runtimes sharing a
    host need disjoint ranges. Only a runtime running as root can switch uid."""
    tmp_bytes: int = 64 << 20
    """Size cap of a worker's private ``/tmp`` (its working directory)."""
    hidden_paths: tuple[str, ...] = field(default_factory=_runtime_paths)
    """Runtime paths masked inside the worker's root should an exposed tree contain them."""
    cgroups: str = "auto"
    """Run cgroups: ``auto`` (v2 where delegated, else v1), ``v1``, ``v2`` or ``off``
    (``run_cgroup``). Where none can be made, runs fall back to per-process limits."""
    cgroup_root: str = "/sys/fs/cgroup"
    """Where the cgroup filesystems are mounted (only mounts below it are used)."""
    cgroup_remount: bool = False
    """Mount a writable cgroup2 over a read-only one (a container's; needs CAP_SYS_ADMIN)."""
    pids_max: int = 64
    """Processes and threads a run may have at once (its cgroup's ``pids.max``)."""
    launch: WorkerLaunch = "fork-server"
    """``fork-server``: forked by the pool's fork server, each run in its own pid namespace;
    ``spawn``: a fresh interpreter per worker (no pid namespace). A custom ``loader`` always
    spawns: the fork server runs only the real worker."""
    backend: LanguageBackend = field(default_factory=default_backend)
    """The language of the workers (``runtime_service/languages``): how they start, exec and
    end. One protocol: nothing else in the runtime depends on it."""
    executables: Mapping[str, str | None] = field(default_factory=dict)
    """Interpreters of exec'd workers by language name, for backends that look them up
    (TypeScript's Node); None: absent (the language is not served). A backend finds its own
    where a language is not named."""
    boot_memory_bytes: int = 512 << 20
    """The memory budget a worker is booted for, by backends whose interpreter reads it only
    at start (V8's heap limit): the runtime sets it to its default memory budget."""

    @property
    def language(self) -> str:
        """The name of the workers' language."""
        return self.backend.name

    def cgroup_host(self) -> run_cgroup.CgroupHost:
        """Where this spec's workers get their run cgroups (detected once per process)."""
        return run_cgroup.shared_host(self.cgroups, self.cgroup_root, self.cgroup_remount)

    @property
    def forks(self) -> bool:
        """Whether workers come from the fork server."""
        return self.launch == "fork-server" and self.loader is None

    def fallback_root(self) -> str:
        """Where a worker without a private root makes its working directory."""
        return _resolved(self.temp_root or tempfile.gettempdir())

    def sandbox_config(
        self, uid: int, cgroups: list[str] | None = None, *, boot_nice: int = 0
    ) -> dict[str, Any]:
        """What the worker's ``sandbox_child.SandboxConfig`` is built from (and, for a
        worker that execs another interpreter, how ``worker/exec_launch.py`` execs it:
        ``boot_nice`` is the niceness it starts with, so that every thread it makes
        inherits it)."""
        config: dict[str, Any] = {
            "uid": uid,
            "hide": list(self.hidden_paths),
            "tmp_bytes": self.tmp_bytes,
            "tmp_root": self.fallback_root(),
            "cgroups": list(cgroups or ()),
        }
        launch = self.backend.launch(self)
        if launch is not None:
            config["exec"] = {"argv": list(launch.argv), "nice": boot_nice}
            config["expose"] = list(launch.expose)  # read-only in the worker's root
        return config

    @property
    def entry(self) -> str:
        """How a launched worker continues (the fork server's ``ENTRIES``)."""
        return _BOOTSTRAP if self.backend.launch(self) is None else _EXEC

    def argv(self, channel_fd: int, uid: int, cgroups: list[str] | None = None) -> list[str]:
        config = self.sandbox_config(uid, cgroups)
        loader = self.loader if self.loader is not None else _loader(self.entry)
        return [
            self.python, "-I", "-S", "-c", loader, _PACKAGE_ROOT, str(channel_fd),
            json.dumps(config, separators=(",", ":")),
        ]  # fmt: skip


FrameHandler = Callable[[FrameEvent], None]
Listener = Callable[[], None]
OutputHandler = Callable[[int, bytes], None]


class WorkerProcess:
    """A launched worker: one program, then ``terminate`` and ``close`` -- or, for a language
    that keeps a host per tenant, ``park`` between that tenant's runs (``kept_hosts.py``)."""

    def __init__(
        self,
        *,
        process: subprocess.Popen[bytes] | ForkedChild,
        channel: socket.socket,
        outputs: tuple[int, int],
        uid: int,
        spawned_at: float,
        cgroup: RunCgroup | None = None,
    ) -> None:
        self.process = process if isinstance(process, subprocess.Popen) else None
        """The ``Popen`` of a spawned worker (None for a forked one)."""
        self._forked = process if isinstance(process, ForkedChild) else None
        self._pid = process.pid
        self.channel = channel
        self.boot_cpu_s: float | None = None
        """CPU time the worker reported at ready, before any program ran."""
        self.setup_us: float | None = None
        """How long the worker took to isolate itself (its own measurement)."""
        self.workdir: str | None = None
        """A working directory on the host's filesystem, only when the worker reported one
        (no private root): removed after the worker is gone."""
        self.uid = uid
        self.spawned_at = spawned_at
        self.cgroup = cgroup
        """The run's cgroup (memory, pids and CPU of every process of the run), joined at
        boot; None where the host offers none (per-process limits only)."""
        self.sandbox: dict[str, str] = {}
        self.backend: LanguageBackend = default_backend()
        """The worker's language (what its exit means: ``backend.exits``)."""
        self.threaded = False
        """Whether the worker runs threads of its own (Node's): ``activate`` renices each."""
        self.frames = framing.FrameBuffer()
        """Splits the channel until the worker is ready; ``listen`` hands over to a reader
        bounded by the run's budgets."""
        self._reader: FrameReader | None = None
        self.returncode: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        """Resolves once the worker is reaped and everything it held is released."""
        self._pidfd = -1
        if self._forked is not None:
            # Not our child: the fork server reaps it and reports the status.
            self._forked.exited.add_done_callback(self._on_forked_exit)
        else:
            self._pidfd = os.pidfd_open(self.pid)
            self._loop.add_reader(self._pidfd, self._on_exit)
        self.output_fds = outputs
        self._outputs: set[int] = set(outputs)
        self._outputs_closed: asyncio.Future[None] = self._loop.create_future()
        self._output_handler: OutputHandler | None = None
        self._on_frame: FrameHandler | None = None
        self._on_channel_eof: Listener | None = None
        self._out = bytearray()
        self._batch = framing.TurnBatch(self._write)
        self._channel_open = True
        self._reading = False
        self._paused = False  # reading held back while the worker does not read (``_write``)
        self._closed = False
        self._close_scheduled = False
        self._reaper: asyncio.Task[None] | None = None
        self._killed = False
        self.runs_served = 0
        """Runs this worker has finished and lived on after (a kept host's: ``park``)."""

    @property
    def pid(self) -> int:
        """The worker process (as the host sees it)."""
        return self._forked.pid if self._forked is not None else self._pid

    # -- launching --------------------------------------------------------------------------
    @classmethod
    async def spawn(
        cls, spec: WorkerSpec, *, background: bool = False, fork_server: ForkServer | None = None
    ) -> WorkerProcess:
        """Start a worker and wait until it is ready: forked by ``fork_server`` when given
        (and ``spec.forks``), else spawned. A ``background`` launch (a pool refill) boots at
        the lowest CPU priority so that it does not slow running programs down; ``activate``
        restores the normal priority. A worker that finds its uid held by another process
        on the host is retried with another uid (and that uid reclaimed)."""
        started = time.monotonic()
        server = fork_server if spec.forks else None
        for _ in range(_UID_ATTEMPTS):
            try:
                uid = UidLeases.acquire(spec.uid_base, spec.uid_count)
            except UidLeaseError as exc:
                raise WorkerCapacityError(str(exc)) from exc
            try:
                return await cls._launch(spec, uid, started, background, server)
            except _UidBusy:
                UidLeases.mark_dirty(uid)
        raise WorkerLaunchError(
            f"{_UID_ATTEMPTS} sandbox uids in a row were held by other processes on the host"
        )

    @classmethod
    async def _launch(
        cls,
        spec: WorkerSpec,
        uid: int,
        started: float,
        background: bool,
        server: ForkServer | None,
    ) -> WorkerProcess:
        try:
            cgroup = _create_cgroup(spec)
        except OSError as exc:
            UidLeases.release(uid)
            raise WorkerLaunchError(f"cannot create the run's cgroup: {exc}") from exc
        cgroups = cgroup.paths if cgroup is not None else None
        parent = child = None
        pipes: list[int] = []
        try:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            pipes = [out_r, out_w, err_r, err_w]
            process: subprocess.Popen[bytes] | ForkedChild
            if server is not None:
                # A refill of a language whose boot costs far more CPU than the fork
                # (``nice_boot``) must not slow the programs running meanwhile: it starts
                # at the lowest priority.
                nice = _BOOT_NICE if background and spec.backend.nice_boot and _can_renice() else 0
                fds = (child.fileno(), out_w, err_w)
                process = await cls._fork(server, spec, uid, cgroup, fds, boot_nice=nice)
            else:
                # Synchronous, like asyncio's own subprocess transport: vfork + exec, ~0.15 ms.
                process = subprocess.Popen(  # noqa: ASYNC220
                    spec.argv(child.fileno(), uid, cgroups),
                    stdin=subprocess.DEVNULL,
                    stdout=out_w,
                    stderr=err_w,
                    pass_fds=(child.fileno(),),
                    env={},
                    cwd="/",
                    start_new_session=True,
                    close_fds=True,
                )
                ChildReaper.claim(process.pid)  # reaped in close (or below), never by a sweep
                ChildReaper.adopt_group(process.pid)  # its descendants, should they come here
        except (OSError, WorkerLaunchError) as exc:
            for fd in pipes:
                os.close(fd)
            for sock in (parent, child):
                if sock is not None:
                    sock.close()
            if cgroup is not None:
                cgroup.try_remove()
            UidLeases.release(uid)
            if isinstance(exc, WorkerLaunchError):
                raise
            raise WorkerLaunchError(f"cannot start worker: {exc}") from exc
        except BaseException:  # cancelled: _fork has arranged for the worker to die
            for fd in pipes:
                os.close(fd)
            for sock in (parent, child):
                if sock is not None:
                    sock.close()
            raise
        child.close()
        os.close(out_w)
        os.close(err_w)
        if background and server is None and _can_renice():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, process.pid, _BOOT_NICE)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        parent.setblocking(False)
        try:
            worker = cls(
                process=process,
                channel=parent,
                outputs=(out_r, err_r),
                uid=uid,
                spawned_at=started,
                cgroup=cgroup,
            )
        except OSError as exc:  # no pidfd (Linux < 5.3): do not leave the process behind
            assert isinstance(process, subprocess.Popen)
            _kill_group(process.pid)
            process.wait()
            ChildReaper.release(process.pid)
            ChildReaper.forget_group(process.pid)
            for fd in (out_r, err_r):
                os.close(fd)
            parent.close()
            if cgroup is not None:
                cgroup.kill_all()
                cgroup.try_remove()
            UidLeases.release(uid)
            raise WorkerLaunchError(f"cannot watch worker: {exc}") from exc
        try:
            worker.backend = spec.backend
            worker.threaded = spec.backend.threaded
            worker.sandbox = await asyncio.wait_for(worker._read_ready(), spec.ready_timeout_s)
            worker.boot_cpu_s = _float_or_none(worker.sandbox.pop("cpu-s", None))
            worker.setup_us = _float_or_none(worker.sandbox.pop("setup-us", None))
            workdir = worker.sandbox.pop("workdir", None)
            if workdir and os.path.dirname(workdir) == spec.fallback_root():
                worker.workdir = workdir
        except _UidBusy:
            await asyncio.shield(worker.kill())
            await asyncio.shield(worker.closed)  # the lease ends before the uid is reclaimed
            raise
        except (TimeoutError, WorkerLaunchError, OSError, flatwire.WireError) as exc:
            why = (
                f"no ready report within {spec.ready_timeout_s:g} s"
                if isinstance(exc, TimeoutError)  # its own text is empty
                else str(exc)
            )
            stderr = worker._stderr_so_far()  # what the worker said before it failed
            await asyncio.shield(worker.kill())
            detail = f"; its stderr: {stderr}" if stderr else ""
            raise WorkerLaunchError(f"worker did not become ready: {why}{detail}") from exc
        except BaseException:
            # Cancelled mid-boot (pool closing): never leave the process behind.
            await asyncio.shield(worker.kill())
            raise
        return worker

    @staticmethod
    async def _fork(
        server: ForkServer,
        spec: WorkerSpec,
        uid: int,
        cgroup: RunCgroup | None,
        fds: tuple[int, int, int],
        *,
        boot_nice: int = 0,
    ) -> ForkedChild:
        cgroups = cgroup.paths if cgroup is not None else None
        config = spec.sandbox_config(uid, cgroups, boot_nice=boot_nice)
        try:
            forking = server.fork(config=config, fds=fds, entry=spec.entry)
        except ForkServerError as exc:
            raise WorkerLaunchError(f"cannot start worker: {exc}") from exc
        try:
            return await asyncio.shield(forking)
        except ForkServerError as exc:
            raise WorkerLaunchError(f"cannot start worker: {exc}") from exc
        except asyncio.CancelledError:
            # It may be forked all the same: then it dies, and the uid is free once it is gone.
            forking.add_done_callback(functools.partial(_discard_fork, uid, cgroup))
            raise

    async def _read_ready(self) -> dict[str, str]:
        while True:
            data = await self._loop.sock_recv(self.channel, _RECV_BYTES)
            if not data:
                raise WorkerLaunchError(f"worker exited during boot{self._exit_hint()}")
            for payload in self.frames.feed(data):
                message = flatwire.loads_strict(payload)
                if type(message) is dict and message.get("t") == "uid-busy":
                    raise _UidBusy(f"sandbox uid {self.uid} is held by another process")
                if type(message) is dict and message.get("t") == "ready":
                    report = message.get("sandbox")
                    if type(report) is dict:
                        return {str(k): str(v) for k, v in report.items()}
                    return {}

    def _stderr_so_far(self, limit: int = 2048) -> str:
        """The end of what the worker wrote to stderr so far (non-blocking; boot failures)."""
        data = b""
        with contextlib.suppress(OSError):  # BlockingIOError: nothing (more) to read
            while len(data) < 1 << 16 and (chunk := os.read(self.output_fds[1], 1 << 16)):
                data += chunk
        return data.decode("utf-8", "replace").strip()[-limit:]

    def _exit_hint(self) -> str:
        code = self.returncode  # None while its exit is not yet reaped
        return "" if code is None else f" (exit status {code})"

    def activate(self) -> None:
        """The worker is handed a program: give it the normal scheduling priority back (to
        each of its threads: Linux keeps a niceness per thread, and Node's helper threads --
        garbage collection, compilation -- inherited the boot's)."""
        if not _can_renice():
            return
        threads: list[int] = [self.pid]
        if self.threaded:
            with contextlib.suppress(OSError):
                threads = [int(tid) for tid in os.listdir(f"/proc/{self.pid}/task")]
        for tid in threads:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, 0)

    @property
    def alive(self) -> bool:
        return self.returncode is None and not self._killed

    @property
    def exited(self) -> asyncio.Future[int]:
        """Resolves with the exit status (negative: killed by that signal) once reaped."""
        return self._exited

    # -- channel ----------------------------------------------------------------------------
    def listen(
        self,
        on_frame: FrameHandler,
        on_channel_eof: Listener,
        on_output: OutputHandler,
        limits: FrameLimits = _UNBOUNDED,
    ) -> None:
        """Deliver channel frames (or verdicts on frames over ``limits``) and pipe bytes to
        callbacks, straight from the event loop."""
        pending, skip = self.frames.leftover()
        self._reader = FrameReader(limits, pending, skip)
        self._on_frame = on_frame
        self._on_channel_eof = on_channel_eof
        self._output_handler = on_output
        if self._channel_open:
            self._reading = True
            self._loop.add_reader(self.channel.fileno(), self._on_channel_readable)
        for fd in self._outputs:
            self._loop.add_reader(fd, self._on_output_readable, fd)

    def stop_listening(self) -> None:
        """Stop reading the channel (pipes keep draining until they end)."""
        if self._reading:
            self._reading = False
            if not self._paused:
                self._loop.remove_reader(self.channel.fileno())
            self._paused = False

    def park(self) -> bool:
        """Between two runs of a kept host (``kept_hosts.py``): stop reading the channel and
        the pipes until the next run listens. False (the worker must be ended instead) when
        the channel is closed or a frame is half read: the next run would read the rest."""
        reader = self._reader
        if not self.alive or not self._channel_open or reader is None:
            return False
        if not reader.between_frames or self.channel_readable():
            return False
        self.stop_listening()
        for fd in self._outputs:
            self._loop.remove_reader(fd)
        self._reader = None
        self._on_frame = self._on_channel_eof = self._output_handler = None
        self.frames = framing.FrameBuffer()
        self.boot_cpu_s = None  # a CPU meter without a cgroup reads the process from now on
        self.runs_served += 1
        return True

    def channel_readable(self) -> bool:
        """Whether the worker has sent bytes not read yet."""
        try:
            return bool(self.channel.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def read_pending(self) -> None:
        """Process every frame already queued on the channel, without waiting for more."""
        while self._reading and self._read_channel_once():
            pass

    def _on_channel_readable(self) -> None:
        self._read_channel_once()

    def _read_channel_once(self) -> bool:
        reader = self._reader
        if reader is None:
            return False
        try:
            data = self.channel.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self.stop_listening()
            if self._on_channel_eof is not None:
                self._on_channel_eof()
            return False
        handler = self._on_frame
        for event in reader.feed(data):
            if not self._reading or handler is None:
                break
            try:
                handler(event)
            except Exception as exc:
                # The frames read with this one are already out of the buffer: a failing
                # handler must not lose them (one may be the completion).
                self._loop.call_exception_handler(
                    {"message": "worker frame handler failed", "exception": exc}
                )
        if reader.stopped:
            self.stop_listening()  # a frame over the run's output bound: nothing more counts
            return False
        return True

    def send(self, message: dict[str, Any]) -> None:
        """Send a frame to the worker now (behind the frames held in this loop turn); a
        closed channel is ignored (the run ends anyway)."""
        self._batch.now(framing.pack(message))

    def send_frame(self, frame: bytes) -> None:
        self._batch.now(frame)

    def queue(self, message: dict[str, Any], raw: str | None = None) -> None:
        """Send a frame with the others of this event-loop turn (``framing.TurnBatch``: the
        first at once, the rest in one write when the turn ends) -- the replies to a
        worker's calls: a batch of results, or the refusals of a batch of calls, ready in
        one turn share one ``send``. At most one turn's frames are ever held. ``raw``: as
        ``framing.pack``'s."""
        self._batch.add(framing.pack(message, raw), self._loop)

    def _write(self, data: bytes) -> None:
        """One write to the channel, or onto the backlog the socket has not taken yet."""
        if not self._channel_open:
            return
        if not self._out:
            try:
                sent = self.channel.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                return
            if sent == len(data):
                return
            self._out += memoryview(data)[sent:]
            self._loop.add_writer(self.channel.fileno(), self._on_channel_writable)
        else:
            self._out += data
        if len(self._out) > _BACKLOG_PAUSE_BYTES and self._reading and not self._paused:
            self._paused = True
            self._loop.remove_reader(self.channel.fileno())

    def _on_channel_writable(self) -> None:
        try:
            sent = self.channel.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            sent = len(self._out)
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self.channel.fileno())
        if self._paused and len(self._out) <= _BACKLOG_PAUSE_BYTES // 2:
            self._paused = False
            self._loop.add_reader(self.channel.fileno(), self._on_channel_readable)

    # -- output pipes -----------------------------------------------------------------------
    def _on_output_readable(self, fd: int) -> None:
        try:
            data = os.read(fd, _RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if self._output_handler is not None and data:
            self._output_handler(fd, data)
        if not data:
            self._close_output(fd)
            if self._output_handler is not None:
                self._output_handler(fd, b"")

    def _close_output(self, fd: int) -> None:
        if fd in self._outputs:
            self._outputs.discard(fd)
            self._loop.remove_reader(fd)
            os.close(fd)
            if not self._outputs and not self._outputs_closed.done():
                self._outputs_closed.set_result(None)

    @property
    def outputs_open(self) -> bool:
        return bool(self._outputs)

    async def drain_outputs(self, timeout_s: float) -> None:
        """Wait until both pipes have ended (or the timeout passes, then stop reading them)."""
        if self._outputs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._outputs_closed), timeout_s)
        for fd in list(self._outputs):
            self._close_output(fd)

    # -- exit and termination ---------------------------------------------------------------
    def _on_exit(self) -> None:
        # Read the status but leave the zombie: while it is unreaped its pid -- the process
        # group id -- cannot be reused, so signalling the group later never hits a stranger.
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
            status = 255
        else:
            if info is None:
                return  # spurious wake-up
            status = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        self.returncode = status
        if not self._exited.done():
            self._exited.set_result(status)

    def _on_forked_exit(self, exited: asyncio.Future[int]) -> None:
        status = exited.result() if not exited.cancelled() else 255
        self.returncode = status
        if not self._exited.done():
            self._exited.set_result(status)

    @property
    def own_pid_namespace(self) -> bool:
        """Whether the worker is the init of a pid namespace of its own (as it reported):
        then its exit means every process of the run is gone."""
        return self.sandbox.get("pid-namespace") == PID_NAMESPACE_OWN

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the worker process so far, or None once it is gone."""
        return procfs.cpu_s(self.pid)

    def signal_group(self) -> None:
        """SIGKILL the worker's process group: the worker and every descendant (the sandbox
        keeps them from leaving the group). Safe until ``close`` reaps the leader."""
        self._killed = True
        if not self._closed:
            _move_off_this_cpu(self.pid)
            if self._forked is not None:
                self._forked.kill()  # through its pidfd: never a stranger
            else:
                _kill_group(self.pid)

    def close_when_exited(self) -> None:
        """Reap and release everything as soon as the worker has exited."""
        if not self._close_scheduled:
            self._close_scheduled = True
            self._exited.add_done_callback(lambda _: self.close())

    def close(self) -> None:
        """Kill what is left of the group, reap the (exited) worker, release the channel, the
        pipes and the directory; the uid and ``closed`` follow once the group is empty."""
        if self._closed or not self._exited.done():
            return
        self._closed = True
        if self.cgroup is not None and not (self._forked is not None and self.own_pid_namespace):
            # The cgroup holds every process of the run, also one that left the group. (A
            # forked run's were in its pid namespace, every one gone once its init is: the
            # directory's removal below is the check, and a kill loop follows if it fails.)
            self.cgroup.kill_all()
        if self.process is not None:
            # Members of the group that outlived the leader die now; the leader is still a
            # zombie, so the group id is still theirs.
            _kill_group(self.pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            ChildReaper.release(self.pid)
            self.process.returncode = self.returncode  # Popen must never wait for it again
        self.stop_listening()
        if self._out:
            self._loop.remove_writer(self.channel.fileno())
            self._out.clear()
        self._batch.clear()
        self._channel_open = False
        self.channel.close()
        for fd in list(self._outputs):
            self._close_output(fd)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._forked is not None:
            self._forked.close()
            if self.own_pid_namespace and not self._cgroup_left():
                # Reaped init of its pid namespace: the kernel killed and waited for every
                # other process of the run before that, so nothing of it is left.
                self._release()
            else:  # no pid namespace: its descendants are found by uid (and cgroup)
                self._reaper = self._loop.create_task(self._await_forked_gone())
        elif _group_exists(self.pid) or self._cgroup_left():
            # Killed descendants are still on their way out (tearing down takes the kernel
            # about a millisecond per process): the uid is free only once they are gone.
            self._reaper = self._loop.create_task(self._await_group_gone())
        else:
            self._release()

    def _cgroup_left(self) -> bool:
        """Whether the run's cgroup still exists (it is removed here once it is empty)."""
        return self.cgroup is not None and not self.cgroup.try_remove()

    async def _await_group_gone(self) -> None:
        deadline = time.monotonic() + _GROUP_EXIT_TIMEOUT_S
        try:
            while (_live_group_members(self.pid) or self._cgroup_left()) and (
                time.monotonic() < deadline
            ):
                _kill_group(self.pid)
                if self.cgroup is not None:
                    self.cgroup.kill_all()
                await asyncio.sleep(_GROUP_POLL_S)
        finally:
            self._release()

    async def _await_forked_gone(self) -> None:
        """A forked run's processes: without a pid namespace found by uid (the worker's pid,
        and so its group id, may be reused once its init reaped it); and its cgroup."""
        deadline = time.monotonic() + _GROUP_EXIT_TIMEOUT_S
        by_uid = not self.own_pid_namespace
        try:
            while time.monotonic() < deadline:
                pids = live_processes_of(self.uid) if by_uid else []
                if not pids and not self._cgroup_left():
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                if self.cgroup is not None:
                    self.cgroup.kill_all()
                await asyncio.sleep(_GROUP_POLL_S)
        finally:
            self._release()

    def _release(self) -> None:
        if self.process is not None:
            ChildReaper.forget_group(self.pid)
        UidLeases.release(self.uid)
        if not self.closed.done():
            self.closed.set_result(None)

    async def kill(self) -> int:
        """SIGKILL the group, wait for the exit, release everything; return the status."""
        self.signal_group()
        self.close_when_exited()
        return await asyncio.shield(self._exited)


def _create_cgroup(spec: WorkerSpec) -> RunCgroup | None:
    """The run's cgroup, made before its worker starts (None where the host has none)."""
    host = spec.cgroup_host()
    if not host.available:
        return None
    cgroup = host.create()
    try:
        cgroup.set_pids_limit(spec.pids_max)
    except OSError:
        cgroup.try_remove()
        raise
    return cgroup


def _discard_fork(uid: int, cgroup: RunCgroup | None, forking: asyncio.Future[ForkedChild]) -> None:
    """A fork nobody waits for any more: kill the worker, free the uid (and remove the
    cgroup) once it is gone."""
    if forking.cancelled() or forking.exception() is not None:
        if cgroup is not None:
            cgroup.kill_all()
            cgroup.try_remove()
        UidLeases.release(uid)
        return
    child = forking.result()
    child.kill()

    def gone(_: asyncio.Future[int]) -> None:
        child.close()
        if cgroup is not None:
            cgroup.kill_all()
            cgroup.try_remove()
        UidLeases.release(uid)

    child.exited.add_done_callback(gone)


def _libc_sched_getcpu() -> Callable[[], int] | None:
    try:
        getcpu: Callable[[], int] = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    return getcpu


_sched_getcpu = _libc_sched_getcpu()


def _move_off_this_cpu(pid: int) -> None:
    """Let a worker about to be killed die on another CPU than this process's.

    Its teardown is about a millisecond of kernel time on the CPU it runs on, and the kill
    wakes it on ours, right when the outcome is about to be sent: over gRPC that send then
    took ~1 ms instead of ~0.25 ms (p50, ``return 1``).
    """
    if _sched_getcpu is None:
        return
    with contextlib.suppress(OSError):
        others = os.sched_getaffinity(0) - {_sched_getcpu()}
        if others:
            os.sched_setaffinity(pid, others)


def _float_or_none(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


@functools.lru_cache(maxsize=16)
def _resolved(path: str) -> str:
    """``os.path.realpath``, once per path: every launch asks (the walk is a system call per
    component)."""
    return os.path.realpath(path)


@functools.cache
def _can_renice() -> bool:
    """Whether this process may lower a worker's nice value again (CAP_SYS_NICE): only then
    do refills boot at the lowest priority."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 23))
    except OSError:
        pass
    return False


def _group_exists(pgid: int) -> bool:
    """Whether any process (zombies included) is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live_group_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that have not finished exiting (zombies excluded)."""
    return [found.pid for found in procfs.scan() if found.pgid == pgid and not found.ended]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
