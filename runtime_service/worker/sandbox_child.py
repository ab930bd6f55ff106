"""Isolation steps the worker applies to itself (stdlib only, Linux).

At boot, before it reports ready, as the runtime's user. A worker forked by the fork server
(``zygote.py``) is already in a pid namespace of its own when it gets here (below the run's
init, pid 1), so every process of the run dies with it; a spawned worker (the ``spawn``
launch) shares the host's.

1. die with its parent (``PR_SET_PDEATHSIG``): the runtime, or the fork server;
2. join the run's cgroups (``cgroup.procs``), while still root and before any namespace is
   left, so that the worker and everything it starts are accounted to the run;
3. leave the runtime's mount, network, IPC, UTS and cgroup namespaces;
3. build a private root: a small read-only tmpfs holding read-only bind mounts of what the
   interpreter needs (the system trees ``/usr``, ``/lib*``, ``/bin``, ``/sbin``; the Python
   installation, with its site-packages and the runtime's own code masked), five device nodes,
   a fresh ``/proc`` that shows only the run's own processes (its pid namespace; without one,
   ``hidepid=invisible`` hides every process it may not trace) and a
   size-capped private ``/tmp`` as the working directory; ``pivot_root`` into it and detach
   the old root (where seccomp refuses ``pivot_root``, as container runtimes' default profiles
   do: move it over ``/`` and chroot), so the runtime's files, ``/root``, ``/home``, ``/work``,
   ``/etc``, ``/var``, ``/run`` and the host ``/tmp`` are simply not there. The new root is
   mounted over ``/tmp`` inside the worker's own mount namespace: nothing appears on the host.
   A forked worker usually starts from a root template instead (``build_root_template``):
   the fork server keeps one mount namespace per configuration with the fixed part of that
   root already built; the worker enters it, leaves it at once for a copy of its own, and
   mounts only its ``/proc`` and ``/tmp`` (~0.3 ms instead of ~2 ms of mounting per run).
   Without the privileges for this, the worker makes a fresh directory under the host's temp
   directory instead and reports it (the runtime removes it afterwards);
4. drop to an unprivileged uid/gid of its own (no supplementary groups, no capabilities),
   check with the kernel that no other process holds that uid (``uid_is_exclusive``), set
   ``PR_SET_NO_NEW_PRIVS`` and stay not dumpable (no process of the same uid may open its
   ``/proc/<pid>/mem``); with a real uid, ``RLIMIT_NPROC`` counts;
5. install a seccomp filter refusing the calls that would let a program leave its process
   group (``setsid``/``setpgid``), debug other processes, touch namespaces and mounts, reach
   the VM host (AF_VSOCK) or risky kernel surface (io_uring, bpf, ...): the table of what is
   refused and why is in ``worker/seccomp.py``;
6. lower the limits every run shares.

Each step reports what actually took effect; a step that fails (no privileges, an old kernel)
is reported, never hidden, and the runtime's capabilities say so. When a program arrives: the
run's memory (address space) and CPU backstop limits.

Everything here runs before the program; the worker's own modules are already imported, so
the project tree is not needed once the private root is in place.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import math
import os
import resource
import signal
import struct
import sys
from collections.abc import Iterator

from runtime_service.worker import seccomp
from runtime_service.worker.seccomp import ARCHES as _ARCHES

__all__ = [
    "BASE_LIMITS",
    "REPORT_KEYS",
    "SandboxConfig",
    "UidBusyError",
    "apply_run_limits",
    "build_root_template",
    "isolate",
    "join_cgroups",
    "prepare",
]

# Report keys and the value each has when the step is in force.
REPORT_KEYS: dict[str, str] = {
    "cgroup": "joined",
    "network": "namespace",
    "ipc": "namespace",
    "filesystem": "private-root",
    "proc": "private",
    "user": "unprivileged",
    "seccomp": "filter",
}

# What else a worker reports (not part of REPORT_KEYS: a spawned worker has no pid namespace).
PID_NAMESPACE_OWN = "own"

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_MODE_FILTER = 2

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_NAMESPACE_FLAGS = (
    _CLONE_NEWNS
    | _CLONE_NEWCGROUP
    | _CLONE_NEWUTS
    | _CLONE_NEWIPC
    | _CLONE_NEWUSER
    | _CLONE_NEWPID
    | _CLONE_NEWNET
)  # not CLONE_NEWTIME (0x80): in clone()'s flags that bit belongs to the exit signal

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MS_MOVE = 8192
_MNT_DETACH = 2

# Trees exposed read-only inside the private root (when they exist), besides the interpreter.
_SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache",)
_DEVICES = ("null", "zero", "full", "random", "urandom")
_ROOT_MOUNT_POINTS = ("/tmp", "/mnt", "/var/tmp", "/media", "/srv")
_DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}

# (resource, soft == hard) applied to every worker at boot.
BASE_LIMITS: tuple[tuple[int, int], ...] = (
    (resource.RLIMIT_NOFILE, 64),
    (resource.RLIMIT_CORE, 0),
    (resource.RLIMIT_FSIZE, 64 << 20),
    (resource.RLIMIT_NPROC, 32),
)


class UidBusyError(OSError):
    """Another process on the host holds the uid the worker was given: it must not run."""


class SandboxConfig:
    """What the runtime asks for (decoded from the worker's command line or fork request)."""

    __slots__ = (
        "cgroups",
        "expose",
        "hide",
        "mount_template",
        "mount_template_switch",
        "pid_namespace",
        "tmp_bytes",
        "tmp_root",
        "uid",
    )

    def __init__(self, raw: dict[str, object]) -> None:
        uid = raw.get("uid")
        self.uid = uid if type(uid) is int and uid > 0 else None
        hide = raw.get("hide")
        self.hide = [p for p in hide if type(p) is str] if type(hide) is list else []
        # Directories another interpreter needs (the TypeScript worker's code and Node's
        # installation), mounted read-only at the same path, over any mask.
        expose = raw.get("expose")
        self.expose = (
            [p for p in expose if type(p) is str and os.path.isabs(p)]
            if type(expose) is list
            else []
        )
        tmp = raw.get("tmp_bytes")
        self.tmp_bytes = tmp if type(tmp) is int and tmp > 0 else 64 << 20
        root = raw.get("tmp_root")
        self.tmp_root = root if type(root) is str else None
        cgroups = raw.get("cgroups")
        self.cgroups = [p for p in cgroups if type(p) is str] if type(cgroups) is list else []
        # Set by the fork server (never by the runtime): the worker runs in a pid namespace
        # of its own, below the run's init.
        self.pid_namespace = raw.get("pid_namespace") is True
        # Set by the fork server (never by the runtime): the descriptor of a mount namespace
        # whose root is this configuration's private root, fixed part already built
        # (``build_root_template``); the worker closes it as soon as it stands in a copy.
        template = raw.get("mount_template")
        self.mount_template = template if type(template) is int and template >= 0 else None
        switch = raw.get("mount_template_switch")
        # How the template's root was switched (``build_root_template``), for the report.
        self.mount_template_switch = switch if switch in ("pivot_root", "move") else "pivot_root"


class _Libc:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL(None, use_errno=True)
        self.lib.mount.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_ulong,
            ctypes.c_char_p,
        ]
        self.lib.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        self.lib.prctl.restype = ctypes.c_int
        # CDLL makes each function object on first use: make them all now, in the fork
        # server, rather than in every child.
        for name in ("unshare", "setns", "umount2", "syscall"):
            getattr(self.lib, name)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    def prctl(self, option: int, arg: int = 0, arg3: int = 0) -> None:
        # Unused arguments must be zero (PR_SET_NO_NEW_PRIVS checks them).
        self.check(self.lib.prctl(option, arg, arg3, 0, 0), f"prctl({option})")

    def unshare(self, flags: int) -> None:
        self.check(self.lib.unshare(flags), "unshare")

    def setns(self, fd: int, flags: int) -> None:
        self.check(self.lib.setns(fd, flags), "setns")

    def mount(
        self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None
    ) -> None:
        self.check(
            self.lib.mount(
                None if source is None else source.encode(),
                target.encode(),
                None if fstype is None else fstype.encode(),
                flags,
                None if data is None else data.encode(),
            ),
            f"mount {target}",
        )

    def umount(self, target: str, flags: int) -> None:
        self.check(self.lib.umount2(target.encode(), flags), f"umount {target}")

    def syscall(self, number: int, *args: bytes) -> None:
        self.check(self.lib.syscall(number, *args), f"syscall {number}")


def isolate(config: SandboxConfig) -> dict[str, str]:
    """Apply boot-time isolation; return an honest report of what took effect.

    Raises ``UidBusyError`` when another process on the host holds the sandbox uid.
    """
    report: dict[str, str] = {}
    # First, while root and still in the host's cgroup namespace: every later step, and
    # every process the program starts, is charged to the run.
    join_cgroups(config.cgroups, report)
    libc = _shared_libc()
    parent = os.getppid()
    _die_with_parent(libc, parent)
    report["pid-namespace"] = PID_NAMESPACE_OWN if config.pid_namespace else "host (spawned worker)"
    arch = _ARCHES.get(os.uname().machine)
    templated = config.mount_template is not None and _enter_template(libc, config.mount_template)
    privileged = _unshare(libc, report)
    if templated:
        # Standing in the template itself: only a copy of it may be changed, and only a
        # finished private root may run a program (there is no host tree to fall back on).
        if not privileged:
            raise OSError(1, "could not leave the root template's mount namespace")
        _root_from_template(libc, config, report)
    elif privileged:
        try:
            _private_root(libc, config, arch, report)
        except OSError as exc:
            report["filesystem"] = f"shared ({exc.strerror or exc})"
    else:
        report.setdefault("filesystem", "shared (no mount namespace)")
    report.setdefault("proc", "shared (no private root)")
    if report["filesystem"] != REPORT_KEYS["filesystem"]:
        _own_workdir(config, report)
    _drop_privileges(libc, config, report)
    # Credential changes clear the parent-death signal: set it again.
    _die_with_parent(libc, parent)
    _install_seccomp(libc, arch, report)
    for which, value in BASE_LIMITS:
        try:
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError) as exc:
            report[f"rlimit-{which}"] = str(exc)
    return report


def join_cgroups(paths: list[str], report: dict[str, str]) -> None:
    """Move this process into the run's cgroups (one per v1 hierarchy, or one v2 directory)
    before anything else, while still root: every process it starts is then counted and
    limited with it. Reported as ``cgroup``: ``joined``, or what failed. "0" names the
    writer itself, whatever pid namespace it is in (a forked run's init joins first, then
    its worker again: already a member, a no-op)."""
    if not paths:
        report["cgroup"] = "none (the runtime made no cgroup for this run)"
        return
    for path in paths:
        try:
            fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError as exc:
            report["cgroup"] = f"not joined ({path}: {exc.strerror or exc})"
            return
    report["cgroup"] = "joined"


def _own_workdir(config: SandboxConfig, report: dict[str, str]) -> None:
    """Without a private root: a fresh empty directory on the host, reported so that the
    runtime removes it once the worker is gone."""
    import tempfile  # only on this degraded path

    path = tempfile.mkdtemp(prefix="codemode-worker-", dir=config.tmp_root)
    if config.uid is not None and os.geteuid() == 0:
        with contextlib.suppress(OSError):
            os.chown(path, config.uid, config.uid)
    os.chdir(path)
    report["workdir"] = path


def _die_with_parent(libc: _Libc, parent: int) -> None:
    try:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        os._exit(0)
    # In a pid namespace of its own the parent is outside it and getppid() is 0 either way;
    # the fork server closes that window itself (zygote.py).
    if os.getppid() != parent:
        os._exit(0)  # the runtime is already gone


def _unshare(libc: _Libc, report: dict[str, str]) -> bool:
    """Leave the runtime's namespaces; True when a private mount namespace was obtained."""
    try:
        libc.unshare(
            _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWCGROUP
        )
    except OSError as exc:
        first = exc
    else:
        report["network"] = "namespace"
        report["ipc"] = "namespace"
        return True
    try:  # without CAP_SYS_ADMIN a lone network namespace may still be possible
        libc.unshare(_CLONE_NEWNET)
    except OSError:
        report["network"] = f"shared ({first.strerror})"
    else:
        report["network"] = "namespace"
    report["ipc"] = f"shared ({first.strerror})"
    return False


def _exposed_trees() -> list[str]:
    """Directories the interpreter needs, outermost first, nested ones dropped."""
    candidates = list(_SYSTEM_TREES)
    for prefix in (sys.base_prefix, sys.base_exec_prefix, sys.prefix):
        candidates.append(os.path.realpath(prefix))
    candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    chosen: list[str] = []
    for path in sorted(set(candidates), key=len):
        if path == "/" or not os.path.lexists(path):
            continue
        if any(path == top or path.startswith(top.rstrip("/") + "/") for top in chosen):
            continue
        chosen.append(path)
    return chosen


def _masked_paths(config: SandboxConfig) -> list[str]:
    stdlib = os.path.dirname(os.__file__)
    masks = [os.path.join(stdlib, "site-packages"), os.path.join(stdlib, "dist-packages")]
    masks.extend(os.path.realpath(path) for path in config.hide)
    return masks


def _private_root(
    libc: _Libc,
    config: SandboxConfig,
    arch: tuple[int, dict[str, int]] | None,
    report: dict[str, str],
) -> None:
    """Build the whole private root for this run, from the host's mount namespace (a
    spawned worker, or a fork server without a template for this configuration)."""
    switch = _build_root(libc, config, arch, report)
    # Container runtimes' default seccomp profiles refuse pivot_root: the new root was moved
    # over / and chrooted into (the old root stays mounted underneath, out of reach of a
    # process without CAP_SYS_CHROOT -- and the worker's own filter refuses chroot).
    report["root-switch"] = "pivot_root" if switch == "pivot_root" else "move+chroot"
    os.chdir("/tmp")
    report["filesystem"] = "private-root"


def build_root_template(config: SandboxConfig) -> str:
    """Turn this process's mount namespace into a root template for ``config``; returns how
    the root was switched (``pivot_root``, or ``move`` where seccomp refuses it).

    Run by a short-lived child of the fork server, which keeps the namespace (a descriptor
    of ``/proc/<child>/ns/mnt``) once the child exits. The template holds everything of the
    private root that is the same for every run of this configuration -- the tmpfs root, the
    read-only trees, masks, files, devices and extra trees -- and nothing of a run: no
    ``/proc`` (it shows the mounter's pid namespace) and no ``/tmp`` (sized and owned per
    run). A worker enters it and leaves it at once for a copy of its own
    (``_root_from_template``): copying a dozen mounts costs a fraction of building them.
    Every mount is private, so nothing a run mounts in its copy reaches the template or
    another run's copy. With ``pivot_root`` the old root is detached and the template holds
    no path to the host's files. Where container runtimes' seccomp profiles refuse it, the new
    root is moved over ``/`` instead: entering a mount namespace lands on the topmost mount
    at its root (``setns`` looks down), which is the private root, with the old root
    underneath and out of reach as in the per-run ``move+chroot`` switch (the worker gets no
    ``CAP_SYS_CHROOT`` and its filter refuses ``chroot``).
    """
    libc = _shared_libc()
    libc.unshare(_CLONE_NEWNS)
    switch = _build_root(libc, config, _ARCHES.get(os.uname().machine), None)
    libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
    return switch


def _build_root(
    libc: _Libc,
    config: SandboxConfig,
    arch: tuple[int, dict[str, int]] | None,
    run: dict[str, str] | None,
) -> str:
    """Lay out the private root over a directory of this mount namespace and switch into
    it; with ``run`` (the run's report) its ``/proc`` and ``/tmp`` too, without it (a
    template) an empty ``/tmp`` to mount them on. Returns ``pivot_root`` or ``move``."""
    libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
    root = _root_mount_point()
    trees = _exposed_trees()
    masks = _masked_paths(config)
    with _holding(_extra_trees(config, trees, masks)) as extra:
        _lay_out_root(libc, root, trees, masks)
        if run is not None:
            _mount_run_filesystems(libc, config, root, run)
        else:
            os.mkdir(root + "/tmp")
        # Last, so that a tree under /tmp lands in the worker's own /tmp, read-only.
        _bind_held_trees(libc, root, extra)
    os.chdir(root)
    try:
        if arch is None:
            raise OSError(38, "no syscall table")
        # pivot_root(".", "."): the old root ends up on top of the new one; detach it.
        libc.syscall(arch[1]["pivot_root"], b".", b".")
        libc.umount(".", _MNT_DETACH)
        switch = "pivot_root"
    except OSError:
        libc.mount(".", "/", None, _MS_MOVE, None)
        os.chroot(".")
        switch = "move"
    os.chdir("/")
    libc.mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None)
    return switch


def _enter_template(libc: _Libc, fd: int) -> bool:
    """Stand in the root template (closing its descriptor either way); False if refused."""
    try:
        libc.setns(fd, _CLONE_NEWNS)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _root_from_template(libc: _Libc, config: SandboxConfig, report: dict[str, str]) -> None:
    """In this run's own copy of the template (``setns`` then ``unshare``, cwd and root
    already its root): add what belongs to the run -- ``/proc`` and ``/tmp``."""
    # Extra trees below /tmp are in the copy already, about to be covered by the run's
    # /tmp: held first, bound again inside it.
    below_tmp = [
        t for t in config.expose if _within(t, "/tmp") and t != "/tmp" and os.path.isdir(t)
    ]
    with _holding(below_tmp) as extra:
        _mount_run_filesystems(libc, config, "", report)
        _bind_held_trees(libc, "", extra)
    os.chdir("/tmp")
    report["root-switch"] = f"template ({config.mount_template_switch})"
    report["filesystem"] = "private-root"


def _root_mount_point() -> str:
    # The new root is mounted over an existing directory: only this namespace sees it.
    root = next((path for path in _ROOT_MOUNT_POINTS if os.path.isdir(path)), None)
    if root is None:
        raise OSError(2, "no directory to mount the private root on")
    return root


def _extra_trees(config: SandboxConfig, trees: list[str], masks: list[str]) -> list[str]:
    """Extra trees (the TypeScript worker's directory) not already exposed."""
    return [
        tree
        for tree in config.expose
        if os.path.isdir(tree)
        and not (
            any(_within(tree, top) for top in trees) and not any(_within(tree, m) for m in masks)
        )
    ]


@contextlib.contextmanager
def _holding(trees: list[str]) -> Iterator[dict[str, int]]:
    """The trees held open while the root is laid out: a tmpfs mounted on the way may cover
    them (a checkout under /tmp), and they are bound from these descriptors."""
    held: dict[str, int] = {}
    try:
        for tree in trees:
            held[tree] = os.open(tree, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        yield held
    finally:
        for fd in held.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _lay_out_root(libc: _Libc, root: str, trees: list[str], masks: list[str]) -> None:
    """The part of the private root every run of one configuration shares: a small tmpfs
    with the read-only trees, masks, files, devices, and the directory ``/proc`` goes on."""
    libc.mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
    for tree in trees:
        target = root + tree
        if os.path.islink(tree):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.readlink(tree), target)
            continue
        os.makedirs(target, exist_ok=True)
        libc.mount(tree, target, None, _MS_BIND | _MS_REC, None)
        libc.mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID, None)
    for mask in masks:
        inside = any(mask.startswith(tree.rstrip("/") + "/") for tree in trees)
        if inside and os.path.isdir(root + mask):
            libc.mount("tmpfs", root + mask, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                       "size=4k,nr_inodes=2,mode=0")  # fmt: skip
    for path in _SYSTEM_FILES:
        if os.path.isfile(path):
            _bind_file(libc, path, root + path, _MS_RDONLY)
    os.mkdir(root + "/dev")
    for name in _DEVICES:
        if os.path.exists("/dev/" + name):
            _bind_file(libc, "/dev/" + name, f"{root}/dev/{name}", 0)
    for name, target in _DEV_LINKS.items():
        os.symlink(target, f"{root}/dev/{name}")
    os.mkdir(root + "/proc")


def _mount_run_filesystems(
    libc: _Libc, config: SandboxConfig, root: str, report: dict[str, str]
) -> None:
    """What belongs to one run: its ``/proc`` and its size-capped ``/tmp``."""
    # A proc mount shows the pid namespace of the process that mounts it. In the run's own
    # namespace that is just the run's processes, and they are not dumpable, so hidepid
    # would hide the program's own children from it; in the host's namespace, hidepid hides
    # every process the worker may not trace (Linux >= 5.8: per-mount options).
    # ``subset=pid``: no system-wide files.
    options = "subset=pid" if config.pid_namespace else "hidepid=invisible,subset=pid"
    try:
        libc.mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options)
        report["proc"] = "private"
    except OSError as exc:
        report["proc"] = f"absent ({exc.strerror})"
    if not os.path.isdir(root + "/tmp"):
        os.mkdir(root + "/tmp")
    owner = f",uid={config.uid},gid={config.uid}" if config.uid is not None else ""
    libc.mount("tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV,
               f"size={config.tmp_bytes},nr_inodes=16384,mode=700{owner}")  # fmt: skip


def _bind_held_trees(libc: _Libc, root: str, held_trees: dict[str, int]) -> None:
    """Bind each held tree read-only at its own path below ``root``."""
    for tree, held in held_trees.items():
        os.makedirs(root + tree, exist_ok=True)
        libc.mount(f"/proc/self/fd/{held}", root + tree, None, _MS_BIND | _MS_REC, None)
        libc.mount(None, root + tree, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID,
                   None)  # fmt: skip


def _within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _bind_file(libc: _Libc, source: str, target: str, extra: int) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w"):
        pass
    libc.mount(source, target, None, _MS_BIND, None)
    libc.mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NOEXEC | extra, None)


def _drop_privileges(libc: _Libc, config: SandboxConfig, report: dict[str, str]) -> None:
    uid = config.uid
    if os.geteuid() != 0:
        report["user"] = "runtime's user (not root: no uid to drop to)"
    elif uid is None:
        report["user"] = "runtime's user (no sandbox uid configured)"
    else:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        except OSError as exc:
            report["user"] = f"runtime's user ({exc.strerror})"
        else:
            report["user"] = "unprivileged"
            if not uid_is_exclusive():
                raise UidBusyError(16, f"another process on the host holds uid {uid}")
    # Not dumpable (setuid already cleared the flag; a worker that kept the runtime's user
    # clears it here): no process of the same uid may open /proc/<pid>/mem or attach. The
    # program's own children inherit it; its pid namespace still shows them in /proc.
    libc.prctl(_PR_SET_DUMPABLE, 0)
    report["dumpable"] = "no"
    try:
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1)
    except OSError as exc:
        report["no-new-privs"] = f"off ({exc.strerror})"


def uid_is_exclusive() -> bool:
    """Whether this process is the only one on the host whose real uid is its own.

    The kernel counts the tasks of each real uid (zombies and every pid namespace included)
    against ``RLIMIT_NPROC``, for an unprivileged caller. With the soft limit at 2, starting
    one thread succeeds exactly when this process is the uid's only task -- an exact, O(1)
    question to the kernel, where reading /proc would cost a scan of every process on the
    host per run. Must run single-threaded, after the drop to the uid.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (min(2, hard), hard))
    done = _thread.allocate_lock()
    done.acquire()
    try:
        _thread.start_new_thread(done.release, ())
    except RuntimeError:  # EAGAIN: the uid already has another task
        return False
    finally:
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
    done.acquire()  # the probe thread has run (it ends right after)
    return True


_LIBC: list[_Libc] = []


def _shared_libc() -> _Libc:
    """One ``_Libc`` per process: loading it and declaring the prototypes costs a forked
    worker ~0.3 ms of CPU (ctypes builds the function objects), so the fork server does it
    once in ``prepare`` and every child inherits it."""
    if not _LIBC:
        _LIBC.append(_Libc())
    return _LIBC[0]


def _seccomp_program(audit_arch: int, numbers: dict[str, int]) -> bytes:
    """The filter of ``worker/seccomp.py`` (its docstring says what is refused and why)."""
    return seccomp.build(audit_arch, numbers, _NAMESPACE_FLAGS)


_FILTERS: dict[int, bytes] = {}


def seccomp_filter(arch: tuple[int, dict[str, int]]) -> bytes:
    """The filter for ``arch``, built once per process: the fork server builds it before it
    forks, so that no worker pays for assembling it again."""
    program = _FILTERS.get(arch[0])
    if program is None:
        program = _FILTERS[arch[0]] = _seccomp_program(*arch)
    return program


def prepare() -> None:
    """Everything ``isolate`` can compute ahead (for the fork server)."""
    _shared_libc()
    arch = _ARCHES.get(os.uname().machine)
    if arch is not None:
        seccomp_filter(arch)


def _install_seccomp(
    libc: _Libc, arch: tuple[int, dict[str, int]] | None, report: dict[str, str]
) -> None:
    if arch is None:
        report["seccomp"] = f"off (no syscall table for {os.uname().machine})"
        return
    program = seccomp_filter(arch)
    count = len(program) // 8
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HxxxxxxP", count, ctypes.addressof(buffer))
    fprog_buffer = ctypes.create_string_buffer(fprog, len(fprog))
    try:
        libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog_buffer))
    except OSError as exc:
        report["seccomp"] = f"off ({exc.strerror})"
    else:
        report["seccomp"] = "filter"


def apply_run_limits(*, memory_bytes: int, cpu_seconds: float) -> None:
    """Lower the address-space limit and set the CPU-time backstop for this run.

    The CPU limit is only a backstop one second past the compute budget: the runtime polls the
    worker's CPU time and ends the run itself well before ``SIGXCPU``.
    """
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if cpu_seconds > 0:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime + cpu_seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
