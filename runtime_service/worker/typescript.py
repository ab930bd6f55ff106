"""Launch of a TypeScript worker: isolate exactly as the Python worker does, then exec Node.

Reached from the fork server's child (``zygote.py``, already in the run's pid namespace and
cgroup, the channel on fd 3) or from a spawned ``python -I -S`` (the ``spawn`` launch). The
sandbox steps are ``sandbox_child.isolate``'s, unchanged: cgroup, namespaces, the private root
(with the worker's own directory and the Node installation mounted read-only), the sandbox uid,
``no_new_privs``, the seccomp filter and the base limits. Then ``execve`` replaces this process
with ``node worker.js`` (``runtime_service/worker_ts``), with an empty environment, the channel
on fd 3 and stdout/stderr on the runtime's pipes; the worker reports ready itself.

What survives the exec and what does not:

- kept: namespaces, the root, uid/gid, ``no_new_privs``, the seccomp filter (it applies to
  Node and every thread and process it starts), rlimits, the cgroup, the parent-death signal
  (the uid does not change across the exec);
- reset: the dumpable flag. The kernel makes a process dumpable again on exec, and Node cannot
  clear it (no ``prctl``). What still keeps others out of its memory (``/proc/<pid>/mem``,
  ptrace): the worker is the only process with its uid on the host (``uid_is_exclusive``), it
  lives in a pid namespace holding only its own run (no other run's process can even name it),
  and its seccomp filter, inherited by everything the program starts, refuses ``ptrace``,
  ``process_vm_readv``/``writev``. Only root on the host (the runtime's own user) can reach it.

Node options: ``--max-old-space-size`` from the run's memory budget (V8 reads it only at
start: pooled workers are booted for the default budget, and a run with another budget gets a
worker started for its own, ``WorkerPool.launcher``; the run's cgroup bounds all its memory
besides) and ``--disallow-code-generation-from-strings`` (``eval`` and
``new Function`` refuse; the harness compiles the program with ``vm.Script``, which is not
affected). No ``RLIMIT_AS``: V8 and WebAssembly reserve far more address space than they use.

Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import NoReturn

from runtime_service.worker import framing, sandbox_child

__all__ = ["CHANNEL_FD", "HEAP_EXHAUSTED", "node_argv", "serve"]

CHANNEL_FD = 3  # where worker.js reads its channel
HEAP_EXHAUSTED = "JavaScript heap out of memory"
"""What Node writes to its stderr (fd 2, the runtime's pipe) when V8 reaches its heap limit,
just before it aborts (SIGABRT). Node offers no hook to exit otherwise, so this line and the
abort are how the runtime tells an exhausted memory budget from a crash. A program that
forged it would only misname its own run's end."""


def node_argv(node: dict[str, object], report: dict[str, str]) -> list[str]:
    """The command line of the Node worker (``node`` is the fork request's ``node`` entry)."""
    path = str(node.get("path", "node"))
    flags = node.get("flags")
    argv = [path, *(str(flag) for flag in flags)] if type(flags) is list else [path]
    return [*argv, str(node.get("worker", "worker.js")), json.dumps(report, separators=(",", ":"))]


def serve(channel_fd: int, raw_config: object) -> NoReturn:
    """Isolate, then become ``node worker.js`` with the channel on fd 3."""
    raw = raw_config if type(raw_config) is dict else {}
    node = raw.get("node")
    if type(node) is not dict:
        os.write(2, b"typescript worker: the launch config names no node\n")
        os._exit(2)
    config = sandbox_child.SandboxConfig(raw)
    started = time.perf_counter()
    try:
        report = sandbox_child.isolate(config)
    except sandbox_child.UidBusyError:
        # Not a failure of this worker: the runtime gives the run another uid.
        os.write(channel_fd, framing.pack({"t": "uid-busy"}))
        os._exit(0)
    report["setup-us"] = str(round((time.perf_counter() - started) * 1e6))
    report["dumpable"] = "yes after exec (own uid, own pid namespace, seccomp: no ptrace)"
    if channel_fd != CHANNEL_FD:
        os.dup2(channel_fd, CHANNEL_FD)  # inheritable (the only descriptor besides 0-2)
        os.close(channel_fd)
    os.set_inheritable(CHANNEL_FD, True)
    argv = node_argv(node, report)
    nice = node.get("nice")
    if type(nice) is int and nice > 0:
        # Before the exec: every thread Node starts inherits it (the runtime lowers each
        # one's again at the hand-off). Raising one's own niceness needs no privilege.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    try:
        os.execve(argv[0], argv, {})
    except OSError as exc:
        os.write(2, f"typescript worker: cannot exec {argv[0]}: {exc}\n".encode())
        os._exit(2)


def main() -> None:
    """Entry point of a spawned worker (``spawn`` launch): ``sys.argv`` is
    ``["-c", <package root>, <channel fd>, <sandbox config>]``, as the Python worker's."""
    import sys

    if sys.argv[1] in sys.path:
        sys.path.remove(sys.argv[1])
    try:
        raw_config = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    except ValueError:
        raw_config = {}
    serve(int(sys.argv[2]), raw_config)
