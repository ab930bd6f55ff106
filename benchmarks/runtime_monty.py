"""Monty programs per second and their CPU, beside the CPython fork tier, in the same run.

The workload of ``benchmarks.runtime_throughput`` (10-call programs, 50 at once, every binding
call answered on the stream, CPU from the benchmark's cgroup: every process of a run) on a
runtime serving the opt-in ``monty`` language (``languages: [python, monty]``), once with
CPython programs and once with Monty programs. Beside them a bare ``pydantic_monty`` pool in
this process, no services and no sandbox: the same 10-call program, its calls answered
directly, as many sessions at once as the machine has CPUs.

This first slice starts a fresh sandboxed bridge and ``monty`` process per run (as the other
languages start a worker per run), so its figure is a per-run worker start plus Monty's own
boot; reusing one Monty process per agent is the later step the targets are for.

Targets (not yet met by design of this slice): monty >= 5 x the CPython fork tier,
>= 0.5 x the bare pool, <= 6 ms of CPU per program over all processes.

    .venv/bin/python -m benchmarks.runtime_monty [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from typing import Any

from benchmarks.runtime_throughput import CONCURRENCY, _children, _reaper_cpu_s, workload

MONTY_PROGRAM = "for i in range(10):\n    await tools.echo(i)\nreturn 0.0"
_LANGUAGES = json.dumps(["python", "monty"])


def _bare(programs: int) -> dict[str, float]:
    """A bare pydantic_monty pool: ``programs`` runs of the 10-call program, one thread per
    CPU, each call answered at once."""
    import pydantic_monty as pm

    source = "for i in range(10):\n    echo(i)\n0"
    threads = len(os.sched_getaffinity(0))
    remaining = [programs]
    lock = threading.Lock()
    with pm.Monty(min_processes=threads, max_processes=threads) as pool:

        def one() -> None:
            with pool.checkout() as session:
                snapshot: Any = session.feed_start(source)
                while not isinstance(snapshot, pm.MontyComplete):
                    snapshot = snapshot.resume({"return_value": snapshot.args[0]})

        def client() -> None:
            while True:
                with lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                one()

        for _ in range(threads * 2):
            one()  # warm-up
        cpu_before, started = _tree_cpu_s(), time.perf_counter()
        workers = [threading.Thread(target=client) for _ in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        took = time.perf_counter() - started
        cpu = _tree_cpu_s() - cpu_before
    return {
        "programs_per_s": round(programs / took, 1),
        "cpu_ms_per_program_this_process_and_pool": round(cpu / programs * 1e3, 3),
        "threads": threads,
    }


def _tree_cpu_s() -> float:
    """This process's CPU and its live children's (the pool's monty processes)."""
    return time.process_time() + sum(
        _reaper_cpu_s(child, children=False) for child in _children(os.getpid())
    )


async def main(quick: bool) -> dict[str, object]:
    programs = 100 if quick else 600
    env = {"CODEMODE_RUNTIME_LANGUAGES": _LANGUAGES}
    cpython = await workload("fork-server", programs, **env)
    monty = await workload("fork-server", programs, "monty", MONTY_PROGRAM, **env)
    bare = await asyncio.to_thread(_bare, programs * 2)
    rate = float(monty["programs_per_s"])
    return {
        "benchmark": "runtime_monty",
        "quick": quick,
        "concurrency": CONCURRENCY,
        "calls_per_program": 10,
        "monty_programs_per_s": rate,
        "cpython_fork_programs_per_s": cpython["programs_per_s"],
        "monty_bare_programs_per_s": bare["programs_per_s"],
        "monty_cpu_ms_per_program": monty["worker_cpu_ms_per_run"],
        "cpython_cpu_ms_per_program": cpython["worker_cpu_ms_per_run"],
        "accounting": monty["worker_cpu_accounting"],
        "monty": monty,
        "cpython_fork": cpython,
        "bare": bare,
        "target": {
            "vs_cpython_fork_min": 5,
            "vs_bare_min": 0.5,
            "monty_cpu_ms_per_program_max": 6.0,
        },
        "meets_target": rate >= 5 * float(cpython["programs_per_s"])
        and rate >= 0.5 * float(bare["programs_per_s"])
        and float(monty["worker_cpu_ms_per_run"]) <= 6.0,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick))))
