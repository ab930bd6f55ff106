"""Host-side handle of one worker process: spawn, channel, CPU time, termination.

Workers are spawned with ``asyncio.create_subprocess_exec`` on the default asyncio loop:
CPython's ``_posixsubprocess`` execs straight away (vfork when it can), so no Python code and
no ``pthread_atfork`` handler of the runtime (grpc's among them) runs in the child. The child is
``python -I -S`` with an empty environment, a fresh empty temporary directory as cwd, its own
session/process group, stdin on /dev/null, stdout/stderr on pipes, and the channel socket as
the only other descriptor (``close_fds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime_service.worker import flatwire, framing

__all__ = ["WorkerLaunchError", "WorkerProcess", "WorkerSpec"]

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
_LOADER = (
    "import sys;sys.path.insert(0,sys.argv[1]);"
    "from runtime_service.worker.bootstrap import main;main()"
)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class WorkerLaunchError(RuntimeError):
    """A worker could not be started or did not report ready."""


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """How workers are started."""

    python: str = field(default_factory=lambda: os.path.realpath(sys.executable))
    """Interpreter to run (``-I -S``: no site-packages, no environment, no user paths)."""
    ready_timeout_s: float = 10.0
    temp_root: str | None = None
    """Parent of the per-worker temporary directories (the system default when None)."""
    loader: str = _LOADER
    """Code passed to ``-c``; tests substitute a fake worker that speaks raw protocol."""

    def argv(self, channel_fd: int) -> list[str]:
        return [self.python, "-I", "-S", "-c", self.loader, _PACKAGE_ROOT, str(channel_fd)]


class WorkerProcess:
    """A spawned worker. Never reused: one program, then ``kill``."""

    def __init__(
        self,
        *,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        workdir: str,
        sandbox: dict[str, str],
        spawned_at: float,
    ) -> None:
        self.process = process
        self.pid = process.pid
        self.reader = reader
        self.writer = writer
        self.workdir = workdir
        self.sandbox = sandbox
        self.spawned_at = spawned_at
        self.frames = framing.FrameBuffer()
        self._killed = False

    @classmethod
    async def spawn(cls, spec: WorkerSpec) -> WorkerProcess:
        started = time.monotonic()
        workdir = tempfile.mkdtemp(prefix="codemode-worker-", dir=spec.temp_root)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.argv(child.fileno()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(child.fileno(),),
                env={},
                cwd=workdir,
                start_new_session=True,
                limit=1 << 16,
            )
        except OSError as exc:
            parent.close()
            shutil.rmtree(workdir, ignore_errors=True)
            raise WorkerLaunchError(f"cannot start worker: {exc}") from exc
        finally:
            child.close()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=parent, limit=1 << 20)
        except BaseException:
            parent.close()
            await asyncio.shield(_reap(process, workdir))
            raise
        worker = cls(
            process=process,
            reader=reader,
            writer=writer,
            workdir=workdir,
            sandbox={},
            spawned_at=started,
        )
        try:
            ready = await asyncio.wait_for(worker._read_ready(), spec.ready_timeout_s)
        except (TimeoutError, WorkerLaunchError, OSError, flatwire.WireError) as exc:
            await asyncio.shield(worker.kill())
            raise WorkerLaunchError(f"worker did not become ready: {exc}") from exc
        except BaseException:
            # Cancelled mid-boot (pool closing): never leave the process behind.
            await asyncio.shield(worker.kill())
            raise
        worker.sandbox = ready
        return worker

    async def _read_ready(self) -> dict[str, str]:
        while True:
            data = await self.reader.read(1 << 16)
            if not data:
                raise WorkerLaunchError(f"worker exited during boot ({self._stderr_hint()})")
            for payload in self.frames.feed(data):
                message = flatwire.loads_strict(payload)
                if type(message) is dict and message.get("t") == "ready":
                    report = message.get("sandbox")
                    if type(report) is dict:
                        return {str(k): str(v) for k, v in report.items()}
                    return {}

    def _stderr_hint(self) -> str:
        return (
            "see worker stderr"
            if self.process.returncode is None
            else (f"exit status {self.process.returncode}")
        )

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self._killed

    def send(self, message: dict[str, Any]) -> None:
        """Queue a frame to the worker; a closed channel is ignored (the run ends anyway)."""
        if self.writer.is_closing():
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            self.writer.write(framing.pack(message))

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the worker process so far, or None once it is gone."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            return None
        fields = stat[stat.rfind(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    async def kill(self) -> int:
        """SIGKILL the worker's process group, reap it, remove its directory; return status."""
        self._killed = True
        # Not ``process.kill()``: Popen.send_signal polls first, reaping the child behind the
        # asyncio child watcher's back (which then reports status 255).
        if self.process.returncode is None:
            self._signal_group()
        status = await self.process.wait()
        # Members of the group that outlived the leader (the group id cannot be reused while
        # they exist).
        self._signal_group()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
        shutil.rmtree(self.workdir, ignore_errors=True)
        return status

    def _signal_group(self) -> None:
        _kill_group(self.pid)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _reap(process: asyncio.subprocess.Process, workdir: str) -> None:
    _kill_group(process.pid)
    await process.wait()
    shutil.rmtree(workdir, ignore_errors=True)
