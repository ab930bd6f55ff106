"""What the runtime offers and actually enforces, measured from a real worker of each language
(no grpc)."""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass, field
from typing import Literal

from runtime_service.budgets import Budgets
from runtime_service.languages import DEFAULT_LANGUAGE, backends
from runtime_service.pool import WorkerPool
from runtime_service.runtime import Runtime
from runtime_service.source_check import SourceChecker
from runtime_service.versions import HOST_FACADE_VERSION, PROGRAM_WIRE_VERSION
from runtime_service.worker.sandbox_child import BASE_LIMITS, PID_NAMESPACE_OWN, REPORT_KEYS
from runtime_service.worker_process import WorkerLaunchError, WorkerSpec

__all__ = [
    "Capabilities",
    "Isolation",
    "LanguageCapability",
    "Mechanism",
    "describe_isolation",
    "probe_capabilities",
]

Scope = Literal["per-run", "per-process", ""]


@dataclass(frozen=True, slots=True)
class Mechanism:
    """One isolation mechanism: in force or not, and whether it bounds the whole run (every
    process of it together) or each process on its own."""

    name: str
    enforced: bool
    scope: Scope
    detail: str
    """How it is enforced, or why it is not (and what stands in for it)."""


@dataclass(frozen=True, slots=True)
class Isolation:
    mechanism: str
    enforced: list[str] = field(default_factory=list)
    not_enforced: list[str] = field(default_factory=list)
    mechanisms: list[Mechanism] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LanguageCapability:
    """What the runtime offers for one language it knows, served or not."""

    name: str
    served: bool
    reason: str
    """Why it is not served ("" when it is)."""
    program_wire_version: int
    host_facade_version: str
    defaults: Budgets
    maxima: Budgets
    max_source_bytes: int
    checked_kinds: tuple[str, ...]
    """What a source check takes for it (``source_check.KINDS``; empty: not served)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    languages: tuple[str, ...]
    isolation: Isolation
    """The default language's worker's."""
    defaults: Budgets
    maxima: Budgets
    pool_size: int
    by_language: dict[str, Isolation] = field(default_factory=dict)
    """Each served language's, measured from a worker of that language."""
    per_language: tuple[LanguageCapability, ...] = ()
    """Every language the runtime knows, in the language table's order."""


async def probe_capabilities(
    runtime: Runtime, checker: SourceChecker | None = None
) -> Capabilities:
    """Boot one worker per language and report the isolation each ended up with (a Node
    worker is isolated by the same steps, then execs: what survives the exec is measured, not
    assumed)."""
    # Booted side by side: a Node worker's boot is the longer, and start-up waits for it.
    checker = checker or SourceChecker(runtime)
    measured = await asyncio.gather(*(_probe(runtime.pools[lang]) for lang in runtime.languages))
    by_language = dict(zip(runtime.languages, measured, strict=True))
    options = runtime.options
    return Capabilities(
        languages=runtime.languages,
        isolation=by_language.get(DEFAULT_LANGUAGE)
        or next(iter(by_language.values()), Isolation("none")),
        defaults=options.defaults,
        maxima=options.maxima,
        pool_size=options.pool_size,
        by_language=by_language,
        per_language=tuple(
            LanguageCapability(
                name=language,
                served=language in runtime.languages,
                reason=runtime.unserved.get(language, ""),
                program_wire_version=PROGRAM_WIRE_VERSION,
                host_facade_version=HOST_FACADE_VERSION,
                defaults=options.defaults,
                maxima=options.maxima,
                max_source_bytes=options.max_program_bytes,
                checked_kinds=checker.kinds(language),
            )
            for language in (backend.name for backend in backends())
        ),
    )


async def _probe(pool: WorkerPool) -> Isolation:
    try:
        worker = await pool.acquire()
    except WorkerLaunchError as exc:
        report = dict.fromkeys(REPORT_KEYS, f"unknown (worker failed to start: {exc})")
    else:
        report = dict(worker.sandbox)
        await worker.kill()
    return describe_isolation(report, pool.spec)


def _nproc() -> int:
    return dict(BASE_LIMITS)[resource.RLIMIT_NPROC]


def describe_isolation(report: dict[str, str], spec: WorkerSpec) -> Isolation:
    """Turn a worker's sandbox report into what is and is not enforced (each report key is
    either in force, and listed as enforced, or not, and listed as not enforced)."""

    def held(key: str) -> bool:
        return report.get(key) == REPORT_KEYS[key]

    def why(key: str) -> str:
        return report.get(key, "not reported")

    own_pid_ns = report.get("pid-namespace") == PID_NAMESPACE_OWN
    enforced = [
        "fresh process per run, never reused"
        + (
            ", forked from a never-used fork server; pid 1 of its own pid namespace: every "
            "process of the run dies with it, also when the runtime is killed"
            if own_pid_ns
            else "; its whole process group is killed when the run ends"
        ),
        "environment: empty",
        "inherited descriptors: stdin /dev/null, stdout/stderr pipes, the protocol socket",
        # What the language's interpreter is started as (the rest of the sandbox is the same).
        spec.backend.capability.interpreter,
        "output: exact byte ledger checked in the worker and again in the runtime",
        "protocol: every worker message shape-checked and rebuilt; first terminal outcome wins",
    ]
    not_enforced = [
        "kernel: shared with the host (namespaces, not a virtual machine): a kernel exploit "
        "escapes the sandbox",
    ]
    mechanisms = _mechanisms(report, spec)
    for item in mechanisms:
        if item.name in _SUMMARISED:
            # Only a bound on the whole run counts as in force here: a per-process fallback
            # is listed with what it leaves open.
            in_force = item.enforced and item.scope == "per-run"
            scope = f"{item.scope}, " if item.scope else ""
            line = f"{_SUMMARISED[item.name]}: {scope}{item.detail}"
            (enforced if in_force else not_enforced).append(line)
    if not own_pid_ns:
        not_enforced.append(
            "descendants after a runtime crash: the worker dies with the runtime (parent-death "
            "signal), but processes the program started outlive a runtime that is killed "
            "outright (a restarted runtime kills them before it reuses their uids)"
        )
    dumpable = report.get("dumpable", "")
    if dumpable == "no":
        enforced.append(
            "memory of workers: not dumpable (no process of the same uid may open "
            "/proc/<pid>/mem or attach)"
        )
    elif dumpable.startswith("yes"):
        # An exec made it dumpable again (worker/exec_launch.py): what stands in for the
        # flag holds only with its own uid, its own pid namespace and the seccomp filter.
        kept_out = held("user") and own_pid_ns and held("seccomp")
        (enforced if kept_out else not_enforced).append(
            f"memory of workers: dumpable {dumpable[3:].strip()}"
        )
    # setrlimit failures are reported per limit as `rlimit-<resource>`.
    failed = sorted(value for key, value in report.items() if key.startswith("rlimit-"))
    if failed:
        not_enforced.append(
            f"open files, file size, core dumps: base rlimits not all applied ({'; '.join(failed)})"
        )
    else:
        enforced.append(
            "open files: RLIMIT_NOFILE 64; file size: RLIMIT_FSIZE 64 MiB; core dumps off"
        )
    mib = spec.tmp_bytes >> 20
    if held("filesystem"):
        enforced.append(
            "filesystem: private read-only root holding only the system trees (/usr, /lib*, "
            f"/bin, /sbin), {spec.backend.capability.installation} and five device nodes; the "
            "runtime's files (but the worker's own code), /root, /home, /work, "
            "/etc, /var, /run and the host's /tmp are absent; writable: a private "
            f"{mib} MiB memory-backed /tmp, the working directory, gone with the worker"
        )
    else:
        not_enforced.append(
            "filesystem: readable and writable wherever the runtime's user may read and write "
            f"({why('filesystem')}); working directory: a fresh temporary directory"
        )
    if held("proc"):
        enforced.append(
            "processes: a private /proc listing only the worker's own processes (the runtime's "
            "environment, command line and open files are unreachable)"
        )
    else:
        not_enforced.append(f"processes: /proc of the host ({why('proc')})")
    if held("user"):
        enforced.append(
            f"privileges: an unprivileged uid/gid of its own per live worker (from "
            f"{spec.uid_base}) that no other process on the host holds (the kernel is asked "
            "before the program starts), no supplementary groups, no capabilities, "
            "no_new_privs: the runtime and other workers cannot be signalled or traced; "
            f"RLIMIT_NPROC {_nproc()}"
        )
    else:
        not_enforced.append(
            f"privileges: the worker runs as the runtime's user ({why('user')}) and could "
            "signal its processes; RLIMIT_NPROC is not enforced for root"
        )
    if held("seccomp"):
        enforced.append(
            "system calls: a seccomp filter refuses setsid/setpgid (no descendant can leave the "
            "worker's process group, so all of them die with the run), ptrace and the other "
            "cross-process calls, namespace and mount calls, io_uring, bpf, perf_event_open, "
            "userfaultfd, keyrings, sockets other than Unix, IP and netlink routing (no "
            "AF_VSOCK to the VM host), and the privileged calls Docker's default profile "
            "refuses (the table is in runtime_service/worker/seccomp.py)"
        )
    else:
        not_enforced.append(
            f"system calls: no seccomp filter ({why('seccomp')}); descendants that leave the "
            "worker's process group (setsid) survive the run"
        )
    if held("network"):
        enforced.append(
            "network: own empty network namespace (no interfaces up; the host's loopback and "
            "abstract Unix sockets are unreachable)"
        )
    else:
        not_enforced.append(f"network: not isolated ({why('network')})")
    if held("ipc"):
        enforced.append("IPC, hostname, cgroup view: own namespaces")
    else:
        not_enforced.append(f"IPC: System V IPC and POSIX queues shared ({why('ipc')})")
    mechanism = "process" + ("+namespaces" if held("filesystem") else "")
    mechanism += "+seccomp" if held("seccomp") else ""
    mechanism += "+cgroup" if _cgroup_in_force(report, spec) else ""
    return Isolation(mechanism, enforced, not_enforced, mechanisms)


# Mechanisms whose line in `enforced`/`not_enforced` is written from their entry here (the
# others keep their own, longer, text below).
_SUMMARISED = {
    "memory": "memory",
    "pids": "process count",
    "compute": "CPU",
    "pid-namespace": "pid namespace",
}


def _cgroup_in_force(report: dict[str, str], spec: WorkerSpec) -> bool:
    return spec.cgroup_host().available and report.get("cgroup") == REPORT_KEYS["cgroup"]


def _mechanisms(report: dict[str, str], spec: WorkerSpec) -> list[Mechanism]:
    """Each mechanism, per run where the host allows it, else the per-process fallback."""
    host = spec.cgroup_host()

    def held(key: str) -> bool:
        return report.get(key) == REPORT_KEYS[key]

    if not host.available:
        no_cgroup = f"no run cgroup: {host.reason}"
    elif not held("cgroup"):
        no_cgroup = f"no run cgroup: the worker reported {report.get('cgroup', 'nothing')!r}"
    else:
        no_cgroup = ""
    items: list[Mechanism] = []
    if not no_cgroup:
        v1 = host.version == "v1"
        limit = "memory.limit_in_bytes" if v1 else "memory.max"
        swap = (
            (" and memory.memsw.limit_in_bytes" if v1 else ", memory.swap.max 0")
            if (host.swap_limited)
            else " (swap not accounted)"
        )
        items += [
            Mechanism("memory", True, "per-run", (
                f"one budget for every process of the run in its cgroup ({host.version} {limit}"
                f"{swap}), shared-memory, memfd and /tmp pages included; an out-of-memory kill "
                "ends the run; RLIMIT_AS per process as a backstop"
            )),
            Mechanism("pids", True, "per-run", (
                f"at most {spec.pids_max} processes and threads per run (pids.max)"
            )),
            Mechanism("compute", True, "per-run", (
                "busy CPU time of every process of the run ("
                + ("cpuacct.usage" if v1 else "cpu.stat usage_usec")
                + "), polled every 25 ms; RLIMIT_CPU per process as a backstop"
            )),
            Mechanism("cleanup", True, "per-run", (
                f"every process of the run is killed through its cgroup ({host.killable}), "
                "also one that left the process group, and the cgroup removed"
            )),
        ]  # fmt: skip
    else:
        nproc = f"RLIMIT_NPROC {_nproc()} for the worker's uid" if held("user") else ""
        items += [
            Mechanism("memory", True, "per-process", (
                f"RLIMIT_AS bounds each process's address space, not the total of a program's "
                f"processes, and not shared-memory, memfd or /tmp pages ({no_cgroup})"
            )),
            Mechanism("pids", bool(nproc), "per-process" if nproc else "", (
                f"{nproc} ({no_cgroup})" if nproc
                else f"no limit: root is not bound by RLIMIT_NPROC ({no_cgroup})"
            )),
            Mechanism("compute", True, "per-process", (
                "the busy-time budget counts the worker process; a descendant is bounded by its "
                f"own RLIMIT_CPU and by the run's wall-clock ceiling ({no_cgroup})"
            )),
            Mechanism("cleanup", True, "per-process", (
                f"the worker's process group is killed ({no_cgroup})"
            )),
        ]  # fmt: skip
    pid = report.get("pid-namespace")
    items.append(
        Mechanism("pid-namespace", True, "per-run", (
            "own pid namespace per run below a run init (pid 1), forked from a never-used "
            "fork server: every process of the run dies with it, also when the runtime is "
            "killed"
        ))
        if pid == PID_NAMESPACE_OWN
        else Mechanism(
            "pid-namespace", False, "",
            "the host's (pids are host pids; other processes are hidden, not gone)"
            + (f": {pid}" if pid else ""),
        )
    )  # fmt: skip
    for name, key, what in (
        ("network", "network", "own empty network namespace"),
        ("ipc", "ipc", "own IPC, UTS and cgroup namespaces"),
        ("filesystem", "filesystem", f"private read-only root, {spec.tmp_bytes >> 20} MiB /tmp"),
        ("proc", "proc", "private /proc listing only the run's processes"),
        ("uid", "user", "an unprivileged uid of its own per live worker, no capabilities"),
        ("seccomp", "seccomp", "system-call filter, inherited by every process of the run"),
    ):
        if held(key):
            detail = what
            if key == "filesystem" and report.get("root-switch"):
                # How the root was entered: a copy of the fork server's root template, or
                # built by the worker (pivot_root, or move+chroot under container seccomp).
                detail = f"{what} (root: {report['root-switch']})"
            items.append(Mechanism(name, True, "per-run", detail))
        else:
            items.append(Mechanism(name, False, "", report.get(key, "not reported")))
    failed = sorted(value for key, value in report.items() if key.startswith("rlimit-"))
    items.append(
        Mechanism("rlimits", not failed, "per-process" if not failed else "", (
            "open files 64, file size 64 MiB, no core dumps, per process"
            if not failed else "; ".join(failed)
        ))
    )  # fmt: skip
    return items
