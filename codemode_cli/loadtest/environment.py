"""Where and on what a load test ran: the commit, the machine, its load, and CPU spent.

Two runs can only be compared when they ran the same workload on the same kind of machine, and
a busy machine moves every figure (docs/benchmarks.md: ±25 % between repeats is normal here).
So the report records the commit, the machine (cores, memory, CPU model), the load average at
the start and the end, and the CPU the load phase cost: the driver's own (this process), the
started services' processes, and the whole machine's busy time (everything that ran, other
work on the machine included: read it next to the load average).

Everything here reads Linux's /proc and git where they exist and records None where they do not.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from codemode_common import procfs

REPO_ROOT = Path(__file__).resolve().parents[2]
GIT_TIMEOUT_S = 5.0


def commit() -> dict[str, object]:
    """The checkout's commit and whether it had uncommitted changes (None: not run from a git
    checkout of this project, or no git)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(REPO_ROOT), *args],
                capture_output=True,
                text=True,
                timeout=GIT_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    # Only this package's own checkout: installed elsewhere, a surrounding repository is not ours.
    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != REPO_ROOT:
        return {"commit": None, "dirty": None}
    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if head else None
    return {"commit": head, "dirty": None if status is None else bool(status)}


def _first_line_value(path: str, key: str) -> str | None:
    with contextlib.suppress(OSError), open(path) as handle:
        for line in handle:
            name, sep, value = line.partition(":")
            if sep and name.strip() == key:
                return value.strip()
    return None


def machine() -> dict[str, object]:
    memory = _first_line_value("/proc/meminfo", "MemTotal")  # "16384256 kB"
    return {
        "cores": os.cpu_count(),
        "cpu_model": _first_line_value("/proc/cpuinfo", "model name")
        or platform.processor()
        or None,
        "memory_bytes": int(memory.split()[0]) * 1024 if memory else None,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    own_s: float
    machine_s: float | None
    processes: dict[str, float | None]


def snapshot(pids: Mapping[str, int]) -> Snapshot:
    return Snapshot(
        time.perf_counter(),
        _own_cpu_s(),
        procfs.machine_busy_s(),
        {name: procfs.cpu_s(pid, reaped=True) for name, pid in pids.items()},
    )


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else round(after - before, 3)


def cpu(before: Snapshot, after: Snapshot, *, nested: int, programs: int) -> dict[str, object]:
    """CPU seconds of the load phase, and per nested call and per program in microseconds
    (the driver's plus the services' processes; the machine's separately)."""
    processes = {
        name: _delta(after.processes[name], value) for name, value in before.processes.items()
    }
    driver = round(after.own_s - before.own_s, 3)
    known = [v for v in processes.values() if v is not None]
    measured = round(driver + sum(known), 3) if len(known) == len(processes) else None
    machine_s = _delta(after.machine_s, before.machine_s)

    def per(total: float | None, count: int) -> float | None:
        return None if total is None or count == 0 else round(total / count * 1e6, 1)

    return {
        "wall_s": round(after.wall_s - before.wall_s, 3),
        "driver_s": driver,
        "processes_s": processes,
        "measured_s": measured,
        "machine_busy_s": machine_s,
        "measured_per_nested_call_us": per(measured, nested),
        "measured_per_program_us": per(measured, programs),
        "machine_per_nested_call_us": per(machine_s, nested),
        "machine_per_program_us": per(machine_s, programs),
        "note": "measured: the load driver and the started services' own processes (the runs' "
        "workers are not among them); machine: every core's busy time over the load phase, "
        "other work on the machine included",
    }
