"""A cgroup per run: one memory, process-count and CPU account for every process of a run.

Pure (no grpc, no asyncio): file operations on the cgroup filesystems, each a few system calls.

Two kinds of host are supported:

- **cgroup v2** (current Kubernetes nodes and containers): the unified hierarchy, with the
  ``memory`` and ``pids`` controllers available in the runtime's own cgroup. A v2 cgroup that
  hands controllers to its children may hold no process itself, so the runtime first moves the
  processes of its own cgroup (itself, and its container's init) into a leaf
  ``codemode-runtime`` and enables ``+memory +pids`` for the children; each run is then a
  sibling ``codemode-run-*`` of that leaf: ``memory.max``, ``memory.swap.max`` 0,
  ``memory.oom.group`` 1, ``pids.max``; CPU from ``cpu.stat`` ``usage_usec`` (kept by the
  cgroup core, no cpu controller needed); kill with ``cgroup.kill``.
- **cgroup v1** (this project's development and CI machines): one directory per hierarchy below
  the runtime's own cgroup in each of ``memory`` (``memory.limit_in_bytes`` and, where swap
  accounting exists, ``memory.memsw.limit_in_bytes``), ``pids`` (``pids.max``), ``cpuacct``
  (``cpuacct.usage``) and, when mounted, ``freezer`` (kill: freeze, SIGKILL every member,
  thaw; without it a kill loop).

Memory charged to a run's cgroup includes what RLIMIT_AS cannot see: pages of ``memfd``,
System V shared memory and tmpfs files (the worker's ``/tmp``) written by any of its
processes. Every run gets ``codemode-run-<runtime pid>.<its start time>-<n>``; directories of a
runtime that no longer exists (the name says which) are swept at start, their processes killed
first. The worker joins its cgroups itself, as its first isolation step (``sandbox_child.
join_cgroups``), before it runs anything else.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from codemode_common import procfs

__all__ = [
    "CGROUP_MODES",
    "CgroupHost",
    "CgroupUsage",
    "RunCgroup",
    "detect",
    "runtime_identity",
    "shared_host",
]

_log = logging.getLogger(__name__)

CgroupMode = Literal["auto", "v1", "v2", "off"]
CGROUP_MODES: tuple[CgroupMode, ...] = ("auto", "v1", "v2", "off")
RUN_PREFIX = "codemode-run-"
RUNTIME_LEAF = "codemode-runtime"
_V1_REQUIRED = ("memory", "pids", "cpuacct")
_V1_OPTIONAL = ("freezer",)
_NAME = re.compile(r"^codemode-run-(\d+)\.(\d+)-\d+$")
_COUNTER = itertools.count(1)  # one sequence per process: names never repeat in it
_KILL_ROUNDS = 200
_KILL_PAUSE_S = 0.001


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    """What a run's cgroup measured, read before it is removed."""

    cpu_s: float | None
    memory_peak_bytes: int | None
    oom_kills: int


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _write(path: str, value: str) -> None:
    # No buffering: one write(2) per value, as cgroup files expect.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _keyed(text: str, key: str) -> int | None:
    """The value of ``key`` in a flat-keyed cgroup file (``memory.events``, ``cpu.stat``)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return None


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot): a pid plus it names one
    process for the life of the machine."""
    found = procfs.stat(pid)
    return None if found is None else found.start_ticks.decode()


_IDENTITY: dict[int, str] = {}


def runtime_identity() -> str:
    """``<pid>.<start time>`` of this process: the middle of its run cgroups' names (read
    once per process: it is part of every run's cgroup name)."""
    pid = os.getpid()
    identity = _IDENTITY.get(pid)
    if identity is None:
        identity = _IDENTITY[pid] = f"{pid}.{_start_time(pid) or 0}"
    return identity


def _owner_alive(name: str) -> bool:
    match = _NAME.match(name)
    if match is None:
        return False
    pid, start = int(match.group(1)), match.group(2)
    return _start_time(pid) == start


_NO_LIMIT = 1 << 63  # what a new cgroup's memory limit is: none


class RunCgroup:
    """The cgroup(s) of one run: one directory (v2) or one per hierarchy (v1)."""

    keep_usage: ClassVar[bool] = False
    """Read the usage into ``final_usage`` before removing the directories (tests): three
    file reads per run (v1's ``memory.oom_control`` alone ~0.1 ms) that nothing else needs."""

    def __init__(self, host: CgroupHost, name: str, dirs: dict[str, str]) -> None:
        self.host = host
        self.name = name
        self.dirs = dirs
        """Directory per controller (v2: every controller maps to the same directory)."""
        self.final_usage: CgroupUsage | None = None
        """What the cgroup measured when it was removed (only with ``keep_usage``)."""
        self._oom_at_start = 0
        self._memory_limit: int | None = _NO_LIMIT
        """The limit last set (a kept host's next run with the same budget writes nothing);
        None when unknown (a write failed)."""

    @property
    def paths(self) -> list[str]:
        """The directories the worker writes its pid into (``cgroup.procs`` of each)."""
        return sorted(set(self.dirs.values()))

    @property
    def version(self) -> str:
        return self.host.version or "off"

    # -- limits ------------------------------------------------------------------------------
    def set_memory_limit(self, limit: int) -> None:
        """The run's memory budget: every process of the run and its shmem/tmpfs pages, swap
        excluded (the budget is RAM: a run may not park pages in swap either)."""
        previous = self._memory_limit
        if limit == previous:
            return
        self._memory_limit = None  # unknown until every write below is through
        memory = self.dirs["memory"]
        if self.host.version == "v2":
            _write(f"{memory}/memory.max", str(limit))
            with contextlib.suppress(FileNotFoundError):  # no swap accounting compiled in
                _write(f"{memory}/memory.swap.max", "0")
            with contextlib.suppress(FileNotFoundError):  # Linux < 4.19
                _write(f"{memory}/memory.oom.group", "1")  # an OOM kill takes the whole run
            self._memory_limit = limit
            return
        # v1: memsw (memory + swap) may never be below memory: lower memory first, and raise
        # memsw first (a kept host's next run may have the larger budget).
        if previous is None:
            with contextlib.suppress(OSError, ValueError):
                previous = int(_read(f"{memory}/memory.limit_in_bytes"))
        raising = previous is not None and limit > previous
        if not raising:
            _write(f"{memory}/memory.limit_in_bytes", str(limit))
        with contextlib.suppress(FileNotFoundError):
            _write(f"{memory}/memory.memsw.limit_in_bytes", str(limit))
        if raising:
            _write(f"{memory}/memory.limit_in_bytes", str(limit))
        self._memory_limit = limit

    def set_pids_limit(self, count: int) -> None:
        """Processes and threads the run may have at once, all of them counted."""
        _write(f"{self.dirs['pids']}/pids.max", str(count))

    # -- measurements ------------------------------------------------------------------------
    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) of every process the run has had, or None if unreadable."""
        try:
            if self.host.version == "v2":
                usec = _keyed(_read(f"{self.dirs['cpu']}/cpu.stat"), "usage_usec")
                return None if usec is None else usec / 1e6
            return int(_read(f"{self.dirs['cpu']}/cpuacct.usage")) / 1e9
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        """Processes the kernel's out-of-memory killer ended in this cgroup so far."""
        memory = self.dirs["memory"]
        try:
            if self.host.version == "v2":
                text = _read(f"{memory}/memory.events")
            else:
                text = _read(f"{memory}/memory.oom_control")
        except OSError:
            return 0
        return _keyed(text, "oom_kill") or 0

    def oom_killed(self) -> bool:
        """Whether the out-of-memory killer acted in this run (since ``mark_start``)."""
        return self.oom_kills() > self._oom_at_start

    def mark_start(self, *, reused: bool = False) -> None:
        """The program starts now. Before it, the cgroup had no memory limit of its own and
        ran only the worker's boot, so its OOM count starts at zero: no read (about 0.1 ms
        for v1's memory.oom_control) on the hand-off path. A kept host's (``reused``) count
        stays the one of its first run's start: a host is kept only after runs that saw no
        OOM kill, and a kill none of them saw (at the very end of one) left the host without
        one of its processes, so the run that finds it is rightly told it ran out of memory."""
        if not reused:
            self._oom_at_start = 0

    def memory_peak(self) -> int | None:
        """Highest memory charge of the run (boot included), or None where not kept."""
        memory = self.dirs["memory"]
        name = "memory.peak" if self.host.version == "v2" else "memory.max_usage_in_bytes"
        try:
            return int(_read(f"{memory}/{name}"))
        except (OSError, ValueError):
            return None

    def usage(self) -> CgroupUsage:
        return CgroupUsage(self.cpu_seconds(), self.memory_peak(), self.oom_kills())

    def procs(self) -> set[int]:
        """Pids of every live process of the run (as this process's pid namespace sees them)."""
        pids: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in _read(f"{path}/cgroup.procs").split())
        return pids

    # -- ending ------------------------------------------------------------------------------
    def kill_all(self) -> None:
        """SIGKILL every process of the run, including any that left the process group."""
        # Usually nothing is left by now, and reading the members is cheaper than a freeze.
        if self.populated():
            _kill_cgroup(self.host.version, self.dirs)

    def populated(self) -> bool:
        return _populated(self.paths)

    def try_remove(self) -> bool:
        """Remove the directories that are empty by now, without waiting; True once all are
        gone (False while members are still exiting: call again). The usage is read first."""
        if self.final_usage is None and self.keep_usage:
            self.final_usage = self.usage()
        for controller, path in list(self.dirs.items()):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    _log.warning("cannot remove run cgroup %s: %s", path, exc)
                return False
            del self.dirs[controller]
            for other, same in list(self.dirs.items()):
                if same == path:  # v2: one directory for every controller
                    del self.dirs[other]
        return True


def _kill_cgroup(version: str | None, dirs: dict[str, str]) -> None:
    paths = sorted(set(dirs.values()))
    if not paths:
        return
    freeze: tuple[str, str, str] | None
    if version == "v2":
        try:
            _write(f"{paths[0]}/cgroup.kill", "1")
            return
        except OSError:
            pass  # Linux < 5.14: freeze and kill one by one
        freeze = (f"{paths[0]}/cgroup.freeze", "1", "0")
    else:
        freezer = dirs.get("freezer")
        freeze = (f"{freezer}/freezer.state", "FROZEN", "THAWED") if freezer else None
    frozen = False
    if freeze is not None:
        # A frozen process cannot fork: the member list stays complete while it is killed.
        # Freezing is not awaited (that could block): a child forked meanwhile is caught by
        # the caller's next round, which repeats until the cgroup is empty.
        with contextlib.suppress(OSError):
            _write(freeze[0], freeze[1])
            frozen = True
    try:
        for path in paths:
            with contextlib.suppress(OSError):
                for line in _read(f"{path}/cgroup.procs").split():
                    with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                        os.kill(int(line), signal.SIGKILL)
    finally:
        if frozen and freeze is not None:
            with contextlib.suppress(OSError):
                _write(freeze[0], freeze[2])  # killed processes die once thawed


def _populated(paths: list[str]) -> bool:
    for path in paths:
        with contextlib.suppress(OSError):
            if _read(f"{path}/cgroup.procs").strip():
                return True
    return False


def _remove_cgroup(version: str | None, dirs: dict[str, str]) -> bool:
    paths = sorted(set(dirs.values()))
    for _ in range(_KILL_ROUNDS):
        if not _populated(paths):
            break
        _kill_cgroup(version, dirs)
        time.sleep(_KILL_PAUSE_S)
    removed = True
    for path in paths:
        for _ in range(_KILL_ROUNDS):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    _log.warning("cannot remove run cgroup %s: %s", path, exc)
                    removed = False
                    break
                time.sleep(_KILL_PAUSE_S)  # the last members are still exiting
            else:
                break
        else:
            _log.warning("run cgroup %s still busy; left for the next start's sweep", path)
            removed = False
    return removed


@dataclass(slots=True)
class CgroupHost:
    """What this host offers for run cgroups (detected once per runtime process)."""

    version: Literal["v1", "v2"] | None
    """None: no usable cgroup; runs fall back to per-process limits (``reason`` says why)."""
    reason: str
    """Where the run cgroups live, or why there are none."""
    bases: dict[str, str] = field(default_factory=dict)
    """Per controller, the runtime's own cgroup directory the runs are created below."""
    swap_limited: bool = False
    """Whether swap is accounted and capped (v1 ``memsw``, v2 ``memory.swap.max``)."""
    killable: str = ""
    """How every process of a run is killed: cgroup.kill, freezer, or a kill loop."""

    @property
    def available(self) -> bool:
        return self.version is not None

    def create(self) -> RunCgroup:
        """A new, empty cgroup for one run (no limits yet: see ``RunCgroup.set_*``)."""
        if self.version is None:
            raise OSError(errno.ENOTSUP, f"no run cgroups: {self.reason}")
        name = f"{RUN_PREFIX}{runtime_identity()}-{next(_COUNTER)}"
        dirs: dict[str, str] = {}
        made: list[str] = []
        try:
            for controller, base in self.bases.items():
                path = os.path.join(base, name)
                if path not in made:
                    os.mkdir(path, 0o755)
                    made.append(path)
                dirs[controller] = path
        except OSError:
            for path in made:
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            raise
        return RunCgroup(self, name, dirs)

    def sweep_stale(self) -> int:
        """Kill the processes of, and remove, run cgroups whose runtime is gone; return how
        many were removed. Cgroups of live runtimes (other processes here) are left alone."""
        stale: dict[str, dict[str, str]] = {}
        for controller, base in self.bases.items():
            try:
                names = os.listdir(base)
            except OSError:
                continue
            for name in names:
                if name.startswith(RUN_PREFIX) and not _owner_alive(name):
                    stale.setdefault(name, {})[controller] = os.path.join(base, name)
        removed = 0
        for name, dirs in sorted(stale.items()):
            _log.warning("removing stale run cgroup %s (its runtime is gone)", name)
            if _remove_cgroup(self.version, dirs):
                removed += 1
        return removed


# -- detection ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Mount:
    point: str
    root: str
    fstype: str
    options: frozenset[str]
    read_only: bool = False


def _mounts() -> list[_Mount]:
    mounts: list[_Mount] = []
    try:
        text = _read("/proc/self/mountinfo")
    except OSError:
        return mounts
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        read_only = "ro" in fields[5].split(",")
        mounts.append(_Mount(point, fields[3], tail[0], frozenset(tail[2].split(",")), read_only))
    # Topmost first: of two mounts on one point, the later one is what paths resolve to.
    return mounts[::-1]


def _own_cgroups() -> tuple[dict[str, str], str | None]:
    """This process's cgroup path per v1 controller, and its v2 path (None if absent)."""
    v1: dict[str, str] = {}
    v2: str | None = None
    try:
        text = _read("/proc/self/cgroup")
    except OSError:
        return v1, v2
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        for controller in parts[1].split(","):
            if controller:
                v1[controller] = parts[2]
    return v1, v2


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def _directory(mount: _Mount, cgroup_path: str) -> str | None:
    """The directory of ``cgroup_path`` inside ``mount`` (which may expose only a subtree)."""
    root = mount.root.rstrip("/")
    if root and not _under(cgroup_path, root):
        return None
    relative = cgroup_path[len(root) :].lstrip("/")
    path = os.path.join(mount.point, relative) if relative else mount.point
    return path if os.path.isdir(path) else None


def _probe(host: CgroupHost, files: tuple[str, ...]) -> str | None:
    """Create and remove one run cgroup, checking the files each run needs; None when fine,
    else why not."""
    try:
        cgroup = host.create()
    except OSError as exc:
        return f"cannot create a cgroup below the runtime's own ({exc.strerror or exc})"
    try:
        for name in files:
            controller, _, filename = name.partition(":")
            path = os.path.join(cgroup.dirs[controller], filename)
            if not os.access(path, os.W_OK if filename.endswith(("max", "limit_in_bytes"))
                             else os.R_OK):  # fmt: skip
                return f"{path} is missing or not writable"
    finally:
        _remove_cgroup(host.version, cgroup.dirs)
    return None


def _detect_v1(cgroup_root: str, mounts: list[_Mount], own: dict[str, str]) -> CgroupHost:
    bases: dict[str, str] = {}
    for controller in _V1_REQUIRED + _V1_OPTIONAL:
        mount = next(
            (
                m
                for m in mounts
                if m.fstype == "cgroup" and controller in m.options and _under(m.point, cgroup_root)
            ),
            None,
        )
        path = own.get(controller)
        directory = _directory(mount, path) if mount is not None and path is not None else None
        if directory is None:
            if controller in _V1_REQUIRED:
                return CgroupHost(None, f"no cgroup v1 {controller} hierarchy under {cgroup_root}")
            continue
        bases[controller] = directory
    bases["cpu"] = bases.pop("cpuacct")
    memory = bases["memory"]
    host = CgroupHost(
        "v1",
        "",
        bases,
        swap_limited=os.path.exists(os.path.join(memory, "memory.memsw.limit_in_bytes")),
        killable="freezer" if "freezer" in bases else "kill loop",
    )
    problem = _probe(host, ("memory:memory.limit_in_bytes", "pids:pids.max", "cpu:cpuacct.usage"))
    if problem is not None:
        return CgroupHost(None, f"cgroup v1: {problem}")
    host.reason = f"cgroup v1 below {memory} (memory), {bases['pids']} (pids), {bases['cpu']} (cpu)"
    return host


def _enable_v2_controllers(base: str) -> str | None:
    """Let ``base``'s children have memory and pids controllers; None when done, else why not.

    A v2 cgroup that delegates controllers may hold no process, so the processes of ``base``
    (this runtime and, in a container, its init) move into a leaf first.
    """
    wanted = {"memory", "pids"}
    try:
        enabled = set(_read(f"{base}/cgroup.subtree_control").split())
    except OSError as exc:
        return f"cannot read {base}/cgroup.subtree_control ({exc.strerror})"
    if wanted <= enabled:
        return None
    control = " ".join(f"+{name}" for name in sorted(wanted - enabled))
    try:
        _write(f"{base}/cgroup.subtree_control", control)
        return None
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            return f"cannot enable {control} in {base} ({exc.strerror})"
    leaf = os.path.join(base, RUNTIME_LEAF)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(leaf, 0o755)
        for _ in range(_KILL_ROUNDS):
            members = _read(f"{base}/cgroup.procs").split()
            if not members:
                break
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    _write(f"{leaf}/cgroup.procs", pid)
        _write(f"{base}/cgroup.subtree_control", control)
    except OSError as exc:
        return f"cannot delegate {control} below {base} ({exc.strerror})"
    return None


def _remount_writable(point: str) -> str | None:
    """Make the cgroup2 mount at ``point`` writable; None when done, else why not.

    Container runtimes mount the container's cgroup subtree read-only. With a cgroup
    namespace of its own (the default on v2) that mount shows only the container's cgroup, so
    a runtime holding CAP_SYS_ADMIN may remount it read-write and delegate below itself -- never
    above, where the pod's limits stay. It changes this process's mount namespace only (the
    runtime's container). A remount changes the filesystem's flags and this mount's; a bind
    remount (where the first is refused) only this mount's.
    """
    import ctypes  # only on this path

    libc = ctypes.CDLL(None, use_errno=True)
    keep = 2 | 4 | 8  # MS_NOSUID | MS_NODEV | MS_NOEXEC
    remount, bind = 32, 4096
    why = ""
    for flags in (remount | keep, remount | bind | keep):
        if libc.mount(None, point.encode(), None, ctypes.c_ulong(flags), None) == 0:
            return None
        why = os.strerror(ctypes.get_errno())
    return f"cannot remount {point} read-write ({why})"


def _detect_v2(
    cgroup_root: str, mounts: list[_Mount], own: str | None, remount: bool
) -> CgroupHost:
    mount = next(
        (m for m in mounts if m.fstype == "cgroup2" and _under(m.point, cgroup_root)), None
    )
    if mount is None or own is None:
        return CgroupHost(None, f"no cgroup2 mount under {cgroup_root}")
    if mount.read_only:
        if not remount:
            return CgroupHost(
                None,
                f"cgroup v2 mount {mount.point} is read-only (set cgroup_remount to remount it "
                "read-write, as the deploy/ manifests do)",
            )
        problem = _remount_writable(mount.point)
        if problem is not None:
            return CgroupHost(None, f"cgroup v2: {problem}")
        return _detect_v2(cgroup_root, _mounts(), _own_cgroups()[1], remount=False)
    base = _directory(mount, own)
    if base is None:
        return CgroupHost(None, f"the runtime's cgroup {own} is not visible in {mount.point}")
    if os.path.basename(base) == RUNTIME_LEAF:
        base = os.path.dirname(base)  # moved there by an earlier detection in this process
    try:
        available = set(_read(f"{base}/cgroup.controllers").split())
    except OSError as exc:
        return CgroupHost(None, f"cgroup v2: cannot read {base}/cgroup.controllers ({exc})")
    missing = {"memory", "pids"} - available
    if missing:
        return CgroupHost(
            None,
            f"cgroup v2 at {base} has no {' and '.join(sorted(missing))} controller "
            "(not delegated to the runtime)",
        )
    problem = _enable_v2_controllers(base)
    if problem is not None:
        return CgroupHost(None, f"cgroup v2: {problem}")
    bases = dict.fromkeys(("memory", "pids", "cpu"), base)
    host = CgroupHost("v2", "", bases, killable="cgroup.kill")
    problem = _probe(host, ("memory:memory.max", "pids:pids.max", "cpu:cpu.stat"))
    if problem is not None:
        return CgroupHost(None, f"cgroup v2: {problem}")
    probe_swap = os.path.join(base, "memory.swap.max")
    host.swap_limited = os.path.exists(probe_swap) or not os.path.exists("/proc/swaps")
    host.reason = f"cgroup v2 below {base}"
    return host


def detect(
    mode: str = "auto", cgroup_root: str = "/sys/fs/cgroup", remount: bool = False
) -> CgroupHost:
    """Find where this runtime can create run cgroups (``mode``: auto, v1, v2 or off).

    ``auto`` prefers v2 (the unified hierarchy with memory and pids available) and falls back
    to v1 hierarchies; a host offering neither gets a host without cgroups and the reason.
    ``remount``: a read-only cgroup2 mount (a container's) is mounted again, writable.
    """
    if mode == "off":
        return CgroupHost(None, "disabled by configuration (cgroups: off)")
    if mode not in CGROUP_MODES:
        raise ValueError(f"cgroups must be one of {', '.join(CGROUP_MODES)}, got {mode!r}")
    mounts = _mounts()
    v1_own, v2_own = _own_cgroups()
    reasons: list[str] = []
    if mode in ("auto", "v2"):
        host = _detect_v2(cgroup_root, mounts, v2_own, remount)
        if host.available or mode == "v2":
            return host
        reasons.append(host.reason)
    host = _detect_v1(cgroup_root, mounts, v1_own)
    if not host.available and reasons:
        host.reason = "; ".join([*reasons, host.reason])
    return host


def shared_host(
    mode: str = "auto", cgroup_root: str = "/sys/fs/cgroup", remount: bool = False
) -> CgroupHost:
    """The detection for this process (every runtime in it shares one): done once, and the
    stale run cgroups of runtimes that are gone are swept right after. Asked once per worker
    launch: the answer for each spelling of the root is kept (resolving it walked the path)."""
    return _shared_host_as_given(mode, cgroup_root, remount)


@functools.cache
def _shared_host_as_given(mode: str, cgroup_root: str, remount: bool) -> CgroupHost:
    return _shared_host(mode, os.path.realpath(cgroup_root), remount)


@functools.cache
def _shared_host(mode: str, cgroup_root: str, remount: bool) -> CgroupHost:
    host = detect(mode, cgroup_root, remount)
    if host.available:
        host.sweep_stale()
    return host
