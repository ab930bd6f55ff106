"""Process facts from Linux ``/proc``: one reader of ``/proc/<pid>/stat`` and ``status``.

The runtime reads them to reap what it adopted (``runtime_service/reaper.py``), to find a
worker's live descendants and its CPU (``runtime_service/worker_process.py``), to tell whether
a sandbox uid is free (``runtime_service/sandbox_uids.py``); the load test, the benchmarks and
the tests read the same facts. Every reader tolerates a process that is gone by the time it is
read (None, or left out of a scan): pids come and go between ``listdir`` and ``open``.

Standard library only; never imports grpc.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "CLOCK_TICKS",
    "Ids",
    "Stat",
    "children",
    "cmdline",
    "cpu_s",
    "ids",
    "machine_busy_s",
    "scan",
    "scan_ids",
    "stat",
]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""What ``stat``'s CPU fields count in, per second."""

_ENDED = (b"Z", b"X")  # a zombie, or a process being reaped right now


@dataclass(frozen=True, slots=True)
class Stat:
    """``/proc/<pid>/stat`` of one process. ``fields`` are those after the name (which may
    hold spaces and parentheses: it is cut at the last ``)``), ``fields[0]`` the state."""

    pid: int
    name: bytes
    fields: tuple[bytes, ...]

    @property
    def state(self) -> bytes:
        return self.fields[0]

    @property
    def ended(self) -> bool:
        """A zombie (or a process being reaped): it runs no more, it only holds its pid."""
        return self.fields[0] in _ENDED

    @property
    def ppid(self) -> int:
        return int(self.fields[1])

    @property
    def pgid(self) -> int:
        return int(self.fields[2])

    @property
    def sid(self) -> int:
        return int(self.fields[3])

    @property
    def start_ticks(self) -> bytes:
        """When it started, in clock ticks since boot: with the pid it names one process for
        the life of the machine."""
        return self.fields[19]

    def cpu_ticks(self, *, reaped: bool = False) -> int:
        """User + system time (``reaped``: plus that of the children it has waited for)."""
        return sum(int(value) for value in self.fields[11 : 15 if reaped else 13])


def stat(pid: int | str) -> Stat | None:
    """The process's ``stat``, or None once it is gone (or unreadable)."""
    raw = _read(pid, "stat")
    if raw is None:
        return None
    cut = raw.rfind(b")")
    fields = tuple(raw[cut + 2 :].split())
    if cut < 0 or len(fields) < 20:
        return None
    return Stat(int(pid), raw[raw.find(b"(") + 1 : cut], fields)


def scan() -> Iterator[Stat]:
    """Every process on the host (of this pid namespace), zombies included."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := stat(entry)) is not None:
            yield found


def children(pid: int, *, ended: bool | None = None) -> list[int]:
    """The direct children of ``pid`` by a scan (the kernel's per-task children list is not
    built everywhere: ``CONFIG_PROC_CHILDREN``); ``ended``: only zombies (True), only live
    ones (False), both (None)."""
    return [
        found.pid
        for found in scan()
        if found.ppid == pid and (ended is None or found.ended == ended)
    ]


def cpu_s(pid: int, *, reaped: bool = False) -> float | None:
    """CPU seconds of ``pid`` (``reaped``: its waited-for children's too), None once gone."""
    found = stat(pid)
    return None if found is None else found.cpu_ticks(reaped=reaped) / CLOCK_TICKS


@dataclass(frozen=True, slots=True)
class Ids:
    """The real, effective, saved and filesystem ids of a process (``status``)."""

    uids: frozenset[int]
    gids: frozenset[int]
    ended: bool


def ids(pid: int | str) -> Ids | None:
    """The process's uids and gids and whether it is a zombie, or None once it is gone."""
    status = _read(pid, "status")
    if status is None:
        return None
    uids: set[int] = set()
    gids: set[int] = set()
    ended = False
    for line in status.split(b"\n"):  # only the lines wanted are split
        if line.startswith(b"Uid:"):
            uids.update(int(value) for value in line.split()[1:])
        elif line.startswith(b"Gid:"):
            gids.update(int(value) for value in line.split()[1:])
        elif line.startswith(b"State:"):  # "State:\tZ (zombie)"
            state = line.split()[1:2]
            ended = bool(state) and state[0] in _ENDED
    return Ids(frozenset(uids), frozenset(gids), ended)


def scan_ids() -> Iterator[tuple[int, Ids]]:
    """The ids of every process on the host (of this pid namespace), zombies included."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := ids(entry)) is not None:
            yield int(entry), found


def machine_busy_s() -> float | None:
    """CPU time every core of the machine spent not idle since boot (``/proc/stat``: user to
    steal, less idle and iowait; guest time is inside user already), None where unreadable."""
    try:
        with open("/proc/stat", "rb") as handle:
            fields = [int(value) for value in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    return (sum(fields) - fields[3] - fields[4]) / CLOCK_TICKS


def cmdline(pid: int | str) -> bytes | None:
    """The process's arguments, NUL-separated (empty for a zombie), or None once it is gone."""
    return _read(pid, "cmdline")


def _read(pid: int | str, name: str) -> bytes | None:
    """``/proc/<pid>/<name>``, or None once the process is gone (or the file unreadable)."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            return handle.read()
    except OSError:
        return None
