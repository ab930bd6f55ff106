"""Isolation steps the worker applies to itself (stdlib only, Linux).

At boot, before it reports ready: die with the runtime (``PR_SET_PDEATHSIG``), leave the
host's network namespace, and lower the limits every run shares. When a program arrives: the
run's memory (address space) and CPU backstop limits. Lowering a hard limit is permanent for a
process without ``CAP_SYS_RESOURCE``, which the runtime's deployment must not grant workers.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import signal

__all__ = ["BASE_LIMITS", "apply_run_limits", "isolate"]

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000

# (resource, soft == hard) applied to every worker at boot.
BASE_LIMITS: tuple[tuple[int, int], ...] = (
    (resource.RLIMIT_NOFILE, 64),
    (resource.RLIMIT_CORE, 0),
    (resource.RLIMIT_FSIZE, 64 << 20),
    (resource.RLIMIT_NPROC, 32),
)


def isolate() -> dict[str, str]:
    """Apply boot-time isolation; return an honest report of what took effect."""
    report: dict[str, str] = {}
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() == 1:
        os._exit(0)  # the runtime is already gone
    if libc.unshare(_CLONE_NEWNET) == 0:
        report["network"] = "namespace"
    else:
        report["network"] = f"shared ({os.strerror(ctypes.get_errno())})"
    for which, value in BASE_LIMITS:
        try:
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError) as exc:
            report[f"rlimit-{which}"] = str(exc)
    return report


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
