"""Exact CPU of a service and everything it starts: a cgroup of the benchmark's own.

Summing ``/proc/<pid>/stat`` of a reaper (utime + stime + cutime + cstime) undercounts the
fork server's runs badly: measured side by side it said 5.7 ms per run where the cgroup said
21 ms. The kernel charges a cgroup's CPU account (v1 ``cpuacct.usage``, v2 ``cpu.stat``
``usage_usec``) at every scheduler tick and context switch, from the task's exact runtime, to
the cgroup and each ancestor, and a removed child cgroup's usage stays in its parent's
account. So a service started from inside a fresh cgroup -- the runtime, its fork server,
every run's init, worker and their children, even in their own run cgroups below it -- is
measured whole and exactly by that one file.

The benchmark process moves itself in, starts the service (which inherits the cgroup), and
moves itself back out before it measures anything, so its own CPU is not counted.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

_V1_ROOT = "/sys/fs/cgroup/cpuacct"
_V2_ROOT = "/sys/fs/cgroup"


@dataclass(slots=True)
class CgroupMeter:
    """A cgroup that a service was started in; ``cpu_s()`` is everything it ever ran."""

    path: str
    usage_file: str
    home: str  # the cgroup the benchmark process came from (it goes back there)

    def cpu_s(self) -> float:
        with open(os.path.join(self.path, self.usage_file)) as handle:
            text = handle.read()
        if self.usage_file == "cpuacct.usage":
            return int(text) / 1e9
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise OSError(f"no usage_usec in {self.path}/cpu.stat")

    def leave(self) -> None:
        """Moves the benchmark process back to where it came from (what it starts now is
        not measured)."""
        _join(self.home, os.getpid())


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in the v1 hierarchy of ``controller`` ('' for v2)."""
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                return path
    return None


def _join(directory: str, pid: int) -> None:
    with open(os.path.join(directory, "cgroup.procs"), "w") as handle:
        handle.write(str(pid))


def _remove_tree(path: str) -> None:
    """Removes a cgroup and every child cgroup below it (children first); what is busy
    stays (a process still inside it)."""
    for root, dirs, _ in os.walk(path, topdown=False):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, name))
    with contextlib.suppress(OSError):
        os.rmdir(path)


@contextlib.contextmanager
def cgroup_meter(name: str) -> Iterator[CgroupMeter | None]:
    """Moves this process into a new cgroup ``name`` (removed afterwards) and yields its
    meter; None where no cgroup can be made (not root, no cgroup filesystem): the caller
    falls back to a lower bound and says so."""
    meter: CgroupMeter | None = None
    try:
        v1 = _own_cgroup("cpuacct")
        if v1 is not None and os.path.isdir(_V1_ROOT):
            home = os.path.join(_V1_ROOT, v1.lstrip("/"))
            path, usage = os.path.join(home, f"{name}-{os.getpid()}"), "cpuacct.usage"
        else:
            v2 = _own_cgroup("")
            if v2 is None:
                raise OSError("no cgroup")
            home = os.path.join(_V2_ROOT, v2.lstrip("/"))
            # A v2 cgroup with processes cannot have children with controllers: the
            # sibling of the benchmark's own cgroup, under the same parent.
            path, usage = os.path.join(os.path.dirname(home), f"{name}-{os.getpid()}"), "cpu.stat"
        os.mkdir(path)
        try:
            _join(path, os.getpid())
        except OSError:
            os.rmdir(path)
            raise
        meter = CgroupMeter(path, usage, home)
    except OSError:
        meter = None
    try:
        yield meter
    finally:
        if meter is not None:
            with contextlib.suppress(OSError):
                meter.leave()
            _remove_tree(meter.path)
