"""Launch of a worker in another interpreter: isolate exactly as the Python worker does, then
exec it (the TypeScript worker's Node, or any backend's ``ExecLaunch``).

Reached from the fork server's child (``zygote.py``, already in the run's pid namespace and
cgroup, the channel on fd 3) or from a spawned ``python -I -S`` (the ``spawn`` launch). The
sandbox steps are ``sandbox_child.isolate``'s, unchanged: cgroup, namespaces, the private root
(with the interpreter's trees, the config's ``expose``, mounted read-only), the sandbox uid,
``no_new_privs``, the seccomp filter and the base limits. Then ``execve`` replaces this process
with the config's ``exec.argv`` plus the sandbox report (JSON) as its last argument, with an
empty environment, the channel on fd 3 and stdout/stderr on the runtime's pipes; the
interpreter reports ready itself, sending that report back.

What survives the exec and what does not:

- kept: namespaces, the root, uid/gid, ``no_new_privs``, the seccomp filter (it applies to the
  interpreter and every thread and process it starts), rlimits, the cgroup, the parent-death
  signal (the uid does not change across the exec);
- reset: the dumpable flag. The kernel makes a process dumpable again on exec, and the
  interpreter may not clear it (Node has no ``prctl``). What still keeps others out of its
  memory (``/proc/<pid>/mem``, ptrace): the worker is the only process with its uid on the host
  (``uid_is_exclusive``), it lives in a pid namespace holding only its own run (no other run's
  process can even name it), and its seccomp filter, inherited by everything the program
  starts, refuses ``ptrace``, ``process_vm_readv``/``writev``. Only root on the host (the
  runtime's own user) can reach it.

Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import NoReturn

from runtime_service.worker import framing, sandbox_child

__all__ = ["CHANNEL_FD", "exec_argv", "main", "serve"]

CHANNEL_FD = 3  # where the exec'd worker reads its channel


def exec_argv(launch: dict[str, object], report: dict[str, str]) -> list[str]:
    """The exec'd worker's command line (``launch`` is the config's ``exec`` entry)."""
    argv = launch.get("argv")
    words = [str(word) for word in argv] if type(argv) is list else []
    return [*words, json.dumps(report, separators=(",", ":"))]


def serve(channel_fd: int, raw_config: object) -> NoReturn:
    """Isolate, then become the config's interpreter with the channel on fd 3."""
    raw = raw_config if type(raw_config) is dict else {}
    launch = raw.get("exec")
    if type(launch) is not dict or type(launch.get("argv")) is not list or not launch["argv"]:
        os.write(2, b"worker launch: the config names no interpreter to exec\n")
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
    argv = exec_argv(launch, report)
    nice = launch.get("nice")
    if type(nice) is int and nice > 0:
        # Before the exec: every thread the interpreter starts inherits it (the runtime
        # lowers each one's again at the hand-off). Raising one's own niceness needs no
        # privilege.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    try:
        os.execve(argv[0], argv, {})
    except OSError as exc:
        os.write(2, f"worker launch: cannot exec {argv[0]}: {exc}\n".encode())
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
