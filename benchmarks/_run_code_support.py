"""Helpers for `benchmarks.run_code`: services with their own environment, each process's own
CPU from /proc (a run's processes are counted from the runtime's cgroup), the pipe round-trip
baseline and cProfile summaries."""

from __future__ import annotations

import asyncio
import os
import pstats
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from benchmarks._cgroup_meter import CgroupMeter
from benchmarks._support import service_env
from codemode_cli.processes import running
from codemode_common import procfs

_PYTHON = os.path.realpath(sys.executable)
_PIPE_CHILD = """\
import os, sys
fd = int(sys.argv[1])
while True:
    data = os.read(fd, 65536)
    if not data:
        break
    os.write(fd, data)
"""


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds of a process itself and of its reaped children."""

    own_s: float
    children_s: float

    def __sub__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(self.own_s - other.own_s, self.children_s - other.children_s)


@dataclass
class Service:
    proc: asyncio.subprocess.Process
    port: int
    meter: CgroupMeter | None = None
    """The cgroup the service was started in (the runtime: it holds every run's processes)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu(self) -> CpuTimes:
        """The process's own CPU, and its reaped children's plus those its fork server reaped
        (forked workers are the fork server's children, not the runtime's)."""
        own, reaped = _stat_cpu(self.proc.pid)
        for server in self._fork_servers():
            reaped += _stat_cpu(server)[1]
        return CpuTimes(own, reaped)

    def children_cpu(self) -> dict[int, float]:
        """CPU seconds of each live worker: for the runtime, one entry per run's process tree
        (a forked run's init and its worker, children of the fork server; or a spawned
        worker, a child of the runtime)."""
        servers = self._fork_servers()
        roots = [pid for pid in _children(self.proc.pid) if pid not in servers]
        roots += [pid for server in servers for pid in _children(server)]
        out = {}
        for root in roots:
            cpu = _tree_cpu(root)
            if cpu is not None:
                out[root] = cpu
        return out

    def _fork_servers(self) -> list[int]:
        return [pid for pid in _children(self.proc.pid) if _is_fork_server(pid)]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _stat_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a process; zeros once it is gone."""
    found = procfs.stat(pid)
    if found is None:
        return 0.0, 0.0
    own = found.cpu_ticks()
    return own / procfs.CLOCK_TICKS, (found.cpu_ticks(reaped=True) - own) / procfs.CLOCK_TICKS


def _tree_cpu(pid: int) -> float | None:
    """CPU seconds of a live (not zombie) process and everything below it, None if gone."""
    found = procfs.stat(pid)
    if found is None or found.ended:
        return None
    total = found.cpu_ticks(reaped=True) / procfs.CLOCK_TICKS
    return total + sum(_tree_cpu(child) or 0.0 for child in _children(pid))


def _is_fork_server(pid: int) -> bool:
    return b"runtime_service.worker.zygote" in (procfs.cmdline(pid) or b"")


@asynccontextmanager
async def service(
    *args: str,
    ready_prefix: str,
    env: Mapping[str, str] | None = None,
    profile_to: str | None = None,
) -> AsyncIterator[Service]:
    """Starts `python [-m cProfile -o FILE] <args>` and yields it once it prints its port."""
    async with running(
        *args,
        ready=ready_prefix,
        env=service_env(**(env or {})),
        interpreter=("-m", "cProfile", "-o", profile_to) if profile_to else (),
        stop_grace=20,  # a profiled service writes its profile as it exits
    ) as started:
        yield Service(started.proc, int(started.rest))


async def wait_for_pool(runtime: Service, size: int, timeout_s: float = 60.0) -> None:
    """Waits until the runtime holds `size` live workers and neither it nor any worker used
    CPU for 50 ms (the pool refill is over), so that no spawn overlaps the next measurement."""
    deadline = time.monotonic() + timeout_s
    last: tuple[float, float] | None = None  # (when, total CPU)
    while time.monotonic() < deadline:
        workers = runtime.children_cpu()
        total = runtime.cpu().own_s + sum(workers.values())
        now = time.monotonic()
        if len(workers) < size or last is None or total != last[1]:
            last = (now, total)
        elif now - last[0] >= 0.05:
            return
        await asyncio.sleep(0.01)


async def pipe_round_trips(samples: int, warmup: int = 50) -> list[float]:
    """Host (asyncio) <-> an isolated Python child over a socketpair, like a worker channel."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = await asyncio.create_subprocess_exec(
        _PYTHON, "-I", "-S", "-c", _PIPE_CHILD, str(child.fileno()),
        pass_fds=(child.fileno(),),
    )  # fmt: skip
    child.close()
    reader, writer = await asyncio.open_unix_connection(sock=parent)
    frame = b'{"t":"call","id":1,"name":"noop","args":"{}","token":"0123456789abcdef"}'
    took = []
    try:
        for i in range(samples + warmup):
            started = time.perf_counter()
            writer.write(frame)
            await reader.readexactly(len(frame))
            if i >= warmup:
                took.append(time.perf_counter() - started)
    finally:
        writer.close()
        await proc.wait()
    return took


_IDLE = "<method 'poll' of 'select.epoll' objects>"


def profile_top(path: str, limit: int = 12) -> dict[str, Any]:
    """Busy time (event-loop idle wait excluded) and the functions with the most own time."""
    stats = pstats.Stats(path)
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    busy = {key: entry for key, entry in table.items() if key[2] != _IDLE}
    total = sum(entry[2] for entry in busy.values()) or 1.0
    rows = sorted(busy.items(), key=lambda item: item[1][2], reverse=True)[:limit]
    return {
        "busy_s": round(total, 3),
        "top_own_time": [
            {
                "function": f"{os.path.basename(file)}:{line}({name})",
                "calls": entry[1],
                "tottime_s": round(entry[2], 3),
                "share_of_busy": round(entry[2] / total, 3),
            }
            for (file, line, name), entry in rows
        ],
    }
