"""What the runtime offers and actually enforces, measured from a real worker (no grpc)."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime_service.budgets import Budgets
from runtime_service.runtime import LANGUAGES, Runtime
from runtime_service.worker_process import WorkerLaunchError

__all__ = ["Capabilities", "Isolation", "probe_capabilities"]


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
    network = "unknown"
    try:
        worker = await runtime.pool.acquire()
    except WorkerLaunchError as exc:
        network = f"unknown (worker failed to start: {exc})"
    else:
        network = worker.sandbox.get("network", "unknown")
        await worker.kill()
    enforced = [
        "fresh process per run, never reused; killed with its process group when the run ends",
        "environment: empty",
        "working directory: fresh empty temporary directory, removed after the run",
        "inherited descriptors: stdin /dev/null, stdout/stderr pipes, the protocol socket",
        "interpreter: isolated (-I -S): no site-packages, no user paths, no PYTHON* variables",
        "memory: RLIMIT_AS per run; CPU: busy-time budget polled every 25 ms, RLIMIT_CPU backstop",
        "open files: RLIMIT_NOFILE 64; file size: RLIMIT_FSIZE 64 MiB; core dumps off",
        "output: exact byte ledger checked in the worker and again in the runtime",
        "protocol: every worker message shape-checked and rebuilt; first terminal outcome wins",
    ]
    not_enforced = [
        "filesystem: readable and writable wherever the runtime's user may read and write",
        "privileges: the worker runs as the runtime's user (and keeps its capabilities)",
        "processes: RLIMIT_NPROC is not enforced for root; descendants that leave the worker's "
        "process group (setsid) survive the run",
    ]
    if network == "namespace":
        enforced.append("network: own empty network namespace (no interfaces up)")
    else:
        not_enforced.append(f"network: not isolated ({network})")
    options = runtime.options
    return Capabilities(
        languages=LANGUAGES,
        isolation=Isolation("process", enforced, not_enforced),
        defaults=options.defaults,
        maxima=options.maxima,
        pool_size=options.pool_size,
    )
