"""The Monty tier of ``benchmarks.runtime_throughput`` on its own, with a host used once per run
beside it (what a run without a tenant gets), all in the same run.

The workload of ``benchmarks.runtime_throughput`` (10-call programs, 50 at once, every binding
call answered on the stream, CPU from the benchmark's cgroup: every process of a run):
CPython programs on the fork tier; Monty programs with each client a tenant of its own (its
runs share its kept host, ``runtime_service/kept_hosts.py``); the same Monty programs without a
tenant (a fresh sandboxed bridge and ``monty`` process per run); and a bare ``pydantic_monty``
pool in this process, no services and no sandbox.

Targets (the kept-host tier): >= 5 x the CPython fork tier, >= 0.5 x the bare pool, <= 6 ms of
CPU per program over all processes.

    .venv/bin/python -m benchmarks.runtime_monty [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json

from benchmarks.runtime_throughput import (
    CONCURRENCY,
    MONTY_LANGUAGES,
    MONTY_PROGRAM,
    monty_tier,
    workload,
)


async def main(quick: bool) -> dict[str, object]:
    programs = 100 if quick else 600
    languages = MONTY_LANGUAGES
    cpython = await workload("fork-server", programs, CODEMODE_RUNTIME_LANGUAGES=languages)
    once = await workload(
        "fork-server", programs, "monty", MONTY_PROGRAM, CODEMODE_RUNTIME_LANGUAGES=languages
    )
    kept = await monty_tier(programs * 5, cpython)
    return {
        "benchmark": "runtime_monty",
        "quick": quick,
        "concurrency": CONCURRENCY,
        "calls_per_program": 10,
        **kept,
        "cpython_fork_programs_per_s": cpython["programs_per_s"],
        "cpython_cpu_ms_per_program": cpython["worker_cpu_ms_per_run"],
        "monty_host_per_run_programs_per_s": once["programs_per_s"],
        "monty_host_per_run_cpu_ms_per_program": once["worker_cpu_ms_per_run"],
        "cpython_fork": cpython,
        "monty_host_per_run": once,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick))))
