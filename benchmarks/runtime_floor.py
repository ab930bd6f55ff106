"""What one forked run costs before its program runs, step by step, on this machine.

``runtime_throughput`` measures whole runs; this benchmark takes a forked worker apart to show
where its CPU goes and what no change to the runtime can remove. In a process prepared exactly
as the fork server prepares itself (``python -I -S``, the worker's modules imported, codecs
warm, ``gc.freeze``), it forks children that stop after successive steps of a real worker's
boot, each step using the worker's own code (``sandbox_child``, ``program``):

* ``raw_clone``: ``clone`` + ``exit_group`` from C, no Python in the child -- the kernel's own
  floor for one process (page tables copied at fork, torn down at exit) and the baseline;
* ``fork``: ``os.fork`` + ``os._exit``: CPython's after-fork work and the copy-on-write
  faults it takes;
* ``pid_namespace``: the child as pid 1 of a new pid namespace (the fork server's way);
* ``init_and_worker``: it forks the worker and reaps it (the run's init);
* ``namespaces``: the worker leaves the mount, network, IPC, UTS and cgroup namespaces;
* ``root``: it enters the root template and mounts its ``/proc`` and ``/tmp``
  (``root_built``: builds the whole private root instead, as without a template);
* ``isolated``: the whole of ``sandbox_child.isolate`` (uid drop and its exclusivity check,
  seccomp, limits);
* ``ready``: the worker's event loop and warm-up, i.e. everything before it reports ready.

Each figure is the CPU of the child and everything it reaped (``wait4``'s rusage: user +
system, exit included), the mean over a round of children, the median of five interleaved
rounds; ``faults`` are its minor page faults.
``cow_fault_us`` is the cost of one copy-on-write fault (a child writing one byte into each
page of a buffer its parent filled). Figures are CPU time, not wall time: steady on a loaded
machine. Needs root with CAP_SYS_ADMIN for the namespace steps (skipped, and said so,
without). Prints one JSON object.

    .venv/bin/python -m benchmarks.runtime_floor [--quick]
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

WORKER_CPU_TARGET_MS = 5.0
_UID = 64_900  # one sandbox uid, reused: each child is reaped before the next starts
_CLONE_NEWPID = 0x20000000
_SIGCHLD = 17
_SYS_CLONE = 56  # x86_64
_SYS_EXIT_GROUP = 231
_COW_PAGES = 2048
_ROUNDS = 5


def _child_cost(start: Callable[[], int], count: int) -> dict[str, float]:
    """Mean CPU (ms) and minor faults of ``count`` children (each reaped before the next)."""
    cpu = faults = 0.0
    for _ in range(count):
        pid = start()
        _, status, usage = os.wait4(pid, 0)
        if status != 0:
            raise RuntimeError(f"a measured child failed (status {status})")
        cpu += (usage.ru_utime + usage.ru_stime) * 1000
        faults += usage.ru_minflt
    return {"ms": round(cpu / count, 3), "faults": round(faults / count)}


def _measure(count: int) -> dict[str, Any]:
    from runtime_service.worker import (  # noqa: F401 - imported as the fork server does
        bootstrap,
        exec_launch,
        plugin_harness,
        program,
        sandbox_child,
        seccomp,
        zygote,
    )

    bootstrap.prewarm_fork_server()
    sandbox_child.prepare()
    import asyncio
    import fcntl  # noqa: F401

    libc = zygote._Libc()
    raw = ctypes.CDLL(None, use_errno=True)
    raw.syscall.restype = ctypes.c_long
    shared = bytearray(_COW_PAGES * 4096)  # written by the parent: every page is resident
    for page in range(_COW_PAGES):
        shared[page * 4096] = 1
    gc.collect()
    gc.freeze()
    gc.disable()
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)

    def fork_then(body: Callable[[], None]) -> int:
        pid = os.fork()
        if pid == 0:
            _run_child(body)
        return pid

    def in_pid_namespace(body: Callable[[], None]) -> Callable[[], int]:
        def start() -> int:
            libc.unshare(_CLONE_NEWPID)
            try:
                return fork_then(body)  # (the child never returns: it exits in _run_child)
            finally:
                libc.setns(own_pid_ns, _CLONE_NEWPID)

        return start

    def with_worker(worker: Callable[[], None]) -> Callable[[], None]:
        def init() -> None:
            child = os.fork()
            if child == 0:
                _run_child(worker)
            while os.waitpid(-1, 0)[0] != child:
                pass

        return init

    def raw_clone() -> int:
        pid = int(raw.syscall(_SYS_CLONE, _SIGCHLD, 0, 0, 0, 0))
        if pid == 0:
            raw.syscall(_SYS_EXIT_GROUP, 0)
        return pid

    def nothing() -> None:
        pass

    def cow() -> None:
        for page in range(_COW_PAGES):
            shared[page * 4096] = 2

    results: dict[str, Any] = {}
    results["raw_clone"] = _child_cost(raw_clone, count)
    results["fork"] = _child_cost(lambda: fork_then(nothing), count)
    cow_cost = _child_cost(lambda: fork_then(cow), count)
    results["cow_fault_us"] = round((cow_cost["ms"] - results["fork"]["ms"]) * 1000 / _COW_PAGES, 2)
    try:
        libc.unshare(_CLONE_NEWPID)
        libc.setns(own_pid_ns, _CLONE_NEWPID)
    except OSError as exc:
        results["namespace_steps"] = f"not measured ({exc}): needs root with CAP_SYS_ADMIN"
        return results

    template, error = zygote.build_root_template(libc, {})
    config: dict[str, object] = {"uid": _UID, "pid_namespace": True}
    shared_libc = sandbox_child._shared_libc()

    def namespaces() -> None:
        sandbox_child._unshare(shared_libc, {})

    def root() -> None:
        report: dict[str, str] = {}
        assert template is not None
        sandbox_child._enter_template(shared_libc, os.dup(template))
        sandbox_child._unshare(shared_libc, report)
        sandbox_child._root_from_template(shared_libc, sandbox_child.SandboxConfig(config), report)

    def root_built() -> None:
        report: dict[str, str] = {}
        sandbox_child._unshare(shared_libc, report)
        arch = seccomp.ARCHES.get(os.uname().machine)
        sandbox_child._private_root(shared_libc, sandbox_child.SandboxConfig(config), arch, report)

    def isolated() -> None:
        templated: dict[str, object] = (
            {**config, "mount_template": os.dup(template)} if template is not None else config
        )
        sandbox_child.isolate(sandbox_child.SandboxConfig(templated))

    def ready() -> None:
        isolated()
        program.warm_loop(asyncio.new_event_loop())  # as a forked worker (bootstrap.serve)

    steps: list[tuple[str, Callable[[], None]]] = [
        ("pid_namespace", nothing),
        ("init_and_worker", with_worker(nothing)),
        ("namespaces", with_worker(namespaces)),
    ]
    if template is not None:
        steps.append(("root", with_worker(root)))
    else:
        results["root_template"] = f"unavailable ({error})"
    steps += [
        ("root_built", with_worker(root_built)),
        ("isolated", with_worker(isolated)),
        ("ready", with_worker(ready)),
    ]
    # Interleaved rounds, the median round per step: a busy moment of the machine lands in
    # one round of every step rather than in all of one step.
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name, _ in steps}
    before = time.process_time()
    for _ in range(_ROUNDS):
        for name, body in steps:
            rounds[name].append(_child_cost(in_pid_namespace(body), max(1, count // _ROUNDS)))
    results["fork_server_ms_per_fork"] = round(
        (time.process_time() - before) * 1000 / (max(1, count // _ROUNDS) * _ROUNDS * len(steps)),
        3,
    )
    for name, measured in rounds.items():
        results[name] = sorted(measured, key=lambda figure: figure["ms"])[len(measured) // 2]
    return results


def _run_child(body: Callable[[], None]) -> NoReturn:
    try:
        body()
    except BaseException as exc:
        os.write(2, f"runtime_floor child: {type(exc).__name__}: {exc}\n".encode())
        os._exit(1)
    os._exit(0)


def _child_main() -> None:
    """In the measuring process (``python -I -S``, as the fork server is started)."""
    count = int(sys.argv[2])
    print(json.dumps(_measure(count)))


def main() -> None:
    import argparse
    import subprocess

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer children per step")
    args = parser.parse_args()
    count = 60 if args.quick else 300
    root = str(Path(__file__).resolve().parent.parent)
    loader = (
        "import sys;sys.path.insert(0,sys.argv[1]);"
        "from benchmarks.runtime_floor import _child_main;_child_main()"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", loader, root, str(count)],
        capture_output=True,
        text=True,
        env={},
        cwd="/",
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the measuring process failed:\n{done.stderr}")
    figures = json.loads(done.stdout)
    steps = [
        name
        for name in ("pid_namespace", "init_and_worker", "namespaces", "root", "isolated", "ready")
        if name in figures
    ]
    increments: dict[str, float] = {}
    previous = figures["fork"]["ms"]
    for name in steps:
        increments[name] = round(figures[name]["ms"] - previous, 3)
        previous = figures[name]["ms"]
    ready = figures.get("ready", {}).get("ms")
    result = {
        "benchmark": "runtime_floor",
        "quick": args.quick,
        "children_per_step": count,
        "max_rss_mb_measuring_process": round(
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1
        ),
        "baseline": {"raw_clone": figures["raw_clone"]},
        "steps_cumulative": {name: figures[name] for name in ["fork", *steps]},
        "step_increments_ms": increments,
        "root_built": figures.get("root_built"),
        "cow_fault_us": figures["cow_fault_us"],
        "fork_server_ms_per_fork": figures.get("fork_server_ms_per_fork"),
        "notes": {
            key: figures[key] for key in ("namespace_steps", "root_template") if key in figures
        },
        "worker_cpu_ms_before_program": ready,
        "target": {"worker_cpu_ms_per_run_max": WORKER_CPU_TARGET_MS},
        "below_target_before_the_program": None if ready is None else ready <= WORKER_CPU_TARGET_MS,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
