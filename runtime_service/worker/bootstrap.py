"""Worker process entry point: boot, isolate, report ready, hand the worker to what arrives.

Started by the runtime as
``python -I -S -c "<loader>" <package root> <channel fd> <sandbox config JSON>`` with an empty
environment, fds 1/2 on pipes the runtime drains, and the channel socket as the only other
inherited descriptor. Everything the worker itself needs is imported before it isolates itself
(``sandbox_child.isolate``: a private root without the project tree, its own uid, seccomp), and
first-use costs are paid (``program.prewarm``; in a forked worker most of them by the fork
server) before it reports ``ready``, so that a pooled
worker starts the program at once.

The first message decides what the worker becomes: a program's ``start`` goes to the program
runner (``program.py``), a Cordis ``host`` to the plugin harness (``plugin_harness.py``). Both
stand on ``core.py``; neither imports the other, and only this module knows both.

Stdlib only. The worker runs model code in its own process and trusts nothing it does; the
runtime, in turn, treats everything this process sends as hostile.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from typing import NoReturn

from runtime_service.worker import flatwire, sandbox_child
from runtime_service.worker.core import Channel, finish
from runtime_service.worker.program import Worker, prewarm, prewarm_fork_server, warm_loop

__all__ = ["main", "prewarm_fork_server", "serve"]


def main() -> None:
    """Entry point of a spawned worker: ``sys.argv`` is
    ``["-c", <package root>, <channel fd>, <sandbox config>]``."""
    # The runtime's code must not stay importable by the program (it is not even mounted).
    if sys.argv[1] in sys.path:
        sys.path.remove(sys.argv[1])
    try:
        raw_config = flatwire.loads_strict(sys.argv[3]) if len(sys.argv) > 3 else {}
    except flatwire.WireError:
        raw_config = {}
    serve(int(sys.argv[2]), raw_config, forked=False)


def serve(channel_fd: int, raw_config: object, *, forked: bool = True) -> NoReturn:
    """Isolate, report ready, run the one program that arrives on ``channel_fd``.

    Shared by both launches: a spawned worker (``main``, ``forked`` False) and a child of the
    fork server (``zygote.py``), which arrives here already in its own pid namespace with the
    compiler, the codecs and asyncio warm (``prewarm_fork_server``). A spawned worker runs the
    whole warm-up before ready (without it its first program finished ~40 ms later); a forked
    one only its event loop's first run (``warm_loop``): the rest would cost it ~1 ms of CPU
    per run to save its program ~0.4 ms (measured: ``benchmarks/runtime_floor.py``).
    """
    channel = Channel(socket.socket(fileno=channel_fd))
    channel.sock.setblocking(True)
    config = sandbox_child.SandboxConfig(raw_config if type(raw_config) is dict else {})
    started = time.perf_counter()
    # Imported while the runtime's tree is still reachable (the fork server has it already):
    # a worker that becomes a Cordis plugin host needs it after the private root is in place.
    from runtime_service.worker import plugin_harness, source_check

    try:
        report = sandbox_child.isolate(config)
    except sandbox_child.UidBusyError:
        # Not a failure of this worker: the runtime gives the run another uid.
        channel.send({"t": "uid-busy"})
        os._exit(0)
    report["setup-us"] = str(round((time.perf_counter() - started) * 1e6))
    os.environ.clear()  # interpreter start-up may have set LC_CTYPE (PEP 538)
    loop = asyncio.new_event_loop()
    if forked:
        warm_loop(loop)
    else:
        prewarm(loop)
    worker = Worker(channel, loop)
    # No program has run yet: this figure is the worker's own, and the run's compute budget
    # starts from it (the runtime need not read /proc when the program is handed over).
    # (The process's CPU clock, not os.times(): that counts in 10 ms ticks, and a forked
    # worker boots in a fraction of one.)
    report["cpu-s"] = repr(time.process_time())
    channel.send({"t": "ready", "sandbox": report})
    start = channel.recv_blocking()
    if start is not None and start.get("t") == "host":
        try:
            sandbox_child.apply_run_limits(memory_bytes=int(start["memory_bytes"]), cpu_seconds=0)
        except (OSError, ValueError, KeyError) as exc:
            finish(channel, {"t": "failed", "phase": "host-load", "message": str(exc)})
        plugin_harness.serve_host(channel, loop, start)
    if start is not None and start.get("t") == "check":
        source_check.serve_check(channel, start)  # a parse, never a run
    if start is None or start.get("t") != "start":
        os._exit(0)
    try:
        sandbox_child.apply_run_limits(
            memory_bytes=int(start["memory_bytes"]), cpu_seconds=float(start["cpu_seconds"])
        )
    except (OSError, ValueError) as exc:
        finish(channel, {"t": "done", "error": {"kind": "exception", "message": str(exc)}})
    worker.begin(start)
    worker.run()
