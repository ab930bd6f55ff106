"""What the runtime offers and actually enforces, measured from a real worker (no grpc)."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field

from runtime_service.budgets import Budgets
from runtime_service.runtime import LANGUAGES, Runtime
from runtime_service.worker.sandbox_child import BASE_LIMITS, PID_NAMESPACE_OWN, REPORT_KEYS
from runtime_service.worker_process import WorkerLaunchError, WorkerSpec

__all__ = ["Capabilities", "Isolation", "describe_isolation", "probe_capabilities"]


@dataclass(frozen=True, slots=True)
class Isolation:
    mechanism: str
    enforced: list[str] = field(default_factory=list)
    not_enforced: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Capabilities:
    languages: tuple[str, ...]
    isolation: Isolation
    defaults: Budgets
    maxima: Budgets
    pool_size: int


async def probe_capabilities(runtime: Runtime) -> Capabilities:
    """Boot one worker and report the isolation it ended up with."""
    try:
        worker = await runtime.pool.acquire()
    except WorkerLaunchError as exc:
        report = dict.fromkeys(REPORT_KEYS, f"unknown (worker failed to start: {exc})")
    else:
        report = dict(worker.sandbox)
        await worker.kill()
    options = runtime.options
    return Capabilities(
        languages=LANGUAGES,
        isolation=describe_isolation(report, options.worker),
        defaults=options.defaults,
        maxima=options.maxima,
        pool_size=options.pool_size,
    )


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
        "interpreter: isolated (-I -S): no site-packages, no user paths, no PYTHON* variables",
        "memory: RLIMIT_AS per run; CPU: busy-time budget polled every 25 ms, RLIMIT_CPU backstop",
        "output: exact byte ledger checked in the worker and again in the runtime",
        "protocol: every worker message shape-checked and rebuilt; first terminal outcome wins",
    ]
    not_enforced = [
        "kernel: shared with the host (namespaces, not a virtual machine): a kernel exploit "
        "escapes the sandbox",
        "memory: RLIMIT_AS bounds each process, not the total of a program's processes; "
        "no cgroup limits",
        "CPU: the busy-time budget counts the worker process; a descendant is bounded by its "
        "own RLIMIT_CPU and by the run's wall-clock ceiling",
    ]
    if not own_pid_ns:
        not_enforced += [
            "pid namespace: the host's (pids are host pids; other processes are hidden, not "
            f"gone) ({why('pid-namespace')})",
            "descendants after a runtime crash: the worker dies with the runtime (parent-death "
            "signal), but processes the program started outlive a runtime that is killed "
            "outright (a restarted runtime kills them before it reuses their uids)",
        ]
    if report.get("dumpable") == "no":
        enforced.append(
            "memory of workers: not dumpable (no process of the same uid may open "
            "/proc/<pid>/mem or attach)"
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
            "/bin, /sbin), the Python installation (its site-packages and the runtime's own "
            "paths masked) and five device nodes; the runtime's files, /root, /home, /work, "
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
            "worker's process group, so all of them die with the run), ptrace, "
            "process_vm_readv/writev, namespace and mount calls, bpf, perf_event_open, keyctl"
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
    return Isolation(mechanism, enforced, not_enforced)
