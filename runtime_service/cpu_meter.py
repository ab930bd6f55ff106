"""Busy CPU time of one worker and when to read it next: the compute budget's one meter.

A worker with a run cgroup is measured through it (``RunCgroup.cpu_seconds``): every process
of the run counts, also children the program forked, so a program cannot hide work from its
budget in another process. A worker without one (a host that offers no cgroups) is measured
as its own process (``WorkerProcess.cpu_seconds``).

Pure (no grpc, no asyncio): each reading is one file read.
"""

from __future__ import annotations

import os

from runtime_service.worker_process import WorkerProcess

__all__ = ["CPU_POLL_INTERVAL_S", "CPU_POLL_MAX_S", "CpuMeter", "next_cpu_poll_s"]

CPU_POLL_INTERVAL_S = 0.025  # the shortest poll: a compute timeout overshoots by at most one
# The longest: how late a worker's CPU and an out-of-memory kill of one of its other processes
# are seen while the budget is far away (a worker that dies is seen at once, by its exit).
CPU_POLL_MAX_S = 0.25
_CPUS = os.cpu_count() or 1


def next_cpu_poll_s(remaining_s: float) -> float:
    """When to read a worker's CPU time next, given what is left of its compute budget.

    All processes of a run together use at most one CPU-second per CPU per wall second, so the
    budget cannot run out sooner than ``remaining / CPUs`` from now: polling then is as exact
    as polling every 25 ms, and a long budget costs a few reads a second instead of forty
    (reading a cgroup file is ~30 us; at a thousand concurrent runs that was a core).
    """
    return min(CPU_POLL_MAX_S, max(CPU_POLL_INTERVAL_S, remaining_s / _CPUS))


class CpuMeter:
    """CPU seconds a worker (every process of its run) has been busy since ``start``."""

    __slots__ = ("_baseline", "_last", "_worker")

    def __init__(self, worker: WorkerProcess) -> None:
        self._worker = worker
        self._baseline = 0.0
        self._last = 0.0

    def start(self) -> None:
        """Count from now: the worker's boot is not its program's (or its plugin's). Without a
        cgroup the worker's own reading at ready stands for now: it ran nothing since, and no
        file is read on the hand-off path."""
        worker = self._worker
        cgroup = worker.cgroup
        if cgroup is not None:
            self._baseline = cgroup.cpu_seconds() or 0.0
        else:
            boot = worker.boot_cpu_s
            self._baseline = boot if boot is not None else (worker.cpu_seconds() or 0.0)
        self._last = 0.0

    def spent_s(self) -> float:
        """Busy CPU seconds since ``start``; the last reading once none can be made (the
        worker, or its cgroup, is gone: it spends nothing more)."""
        worker = self._worker
        cgroup = worker.cgroup
        used = cgroup.cpu_seconds() if cgroup is not None else worker.cpu_seconds()
        if used is not None:
            self._last = used - self._baseline
        return self._last
