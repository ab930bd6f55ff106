"""Nested calls per second through the registry's runtime client, per-run streams against the
multiplexed channel (`runtime_channel`), measured in the same run against the same runtime.

The runtime server runs in its own process (real gRPC on loopback); this process drives runs
through `registry_service.runtime_client.GrpcRuntime` (the registry's own port to the
runtime), answering every binding call at once with an empty object: `CONCURRENCY` programs at
a time, each making `CALLS` nested calls one after another. Both channels run the same
workload, alternating rounds so a change in the machine's load hits both alike;
`nested_calls_per_s` is the figure of each, `ratio` multiplexed over per-run. CPU per nested
call is reported beside it, since it holds on a loaded machine where the rate does not: this
process's (the registry's side), the runtime process's own (`/proc`) and its workers' (every
process in the cgroup the runtime is started in, `benchmarks/_cgroup_meter.py`, less the
runtime's own: the fork server, every run's init and worker, the pool refills), with the share
of each; without a cgroup the workers are not measured (null).

Target: the multiplexed channel >= 2 x the per-run baseline. Where every core is busy, the
workers' own CPU per call bounds it: `ratio_ceiling_workers_bound` is the ratio the
multiplexed channel would reach if the registry and the runtime process cost nothing.

    .venv/bin/python -m benchmarks.runtime_channel [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from benchmarks._cgroup_meter import CgroupMeter, cgroup_meter
from benchmarks._support import child_running, process_cpu_s, service_env, subprocess_service
from registry_service.codemode.runtime_port import BindingCall, RunSpec, RunTerminal
from registry_service.runtime_client import GrpcRuntime

CONCURRENCY = 20
CALLS = 50
PROGRAM = f"for i in range({CALLS}):\n    await tools.echo({{'i': i}})\nreturn {CALLS}"


async def _one(runtime: GrpcRuntime) -> None:
    spec = RunSpec(PROGRAM, "", ("echo",), b"t", 60.0)
    stream = await runtime.open_run(spec)
    try:
        async for event in stream.events():
            if isinstance(event, BindingCall):
                stream.reply(event.call_id, True, "{}")
            elif isinstance(event, RunTerminal):
                assert not event.kind, event
    finally:
        await stream.close()


async def _round(
    runtime: GrpcRuntime, programs: int, runtime_pid: int, meter: CgroupMeter | None
) -> dict[str, float]:
    remaining = programs

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await _one(runtime)

    await _settled(meter)  # the previous round's pool refill is not this one's
    own, served = time.process_time(), process_cpu_s(runtime_pid)
    group = meter.cpu_s() if meter is not None else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    took = time.perf_counter() - started
    client_cpu = time.process_time() - own
    await _settled(meter)  # this round's runs cost their pool refill too: counted here
    runtime_cpu = process_cpu_s(runtime_pid) - served
    return {
        "seconds": took,
        "calls": programs * CALLS,
        "client_cpu_s": client_cpu,
        "runtime_cpu_s": runtime_cpu,
        "workers_cpu_s": meter.cpu_s() - group - runtime_cpu if meter is not None else 0.0,
    }


async def _settled(meter: CgroupMeter | None) -> None:
    """Returns once the runtime's cgroup used no CPU for 100 ms (the pool is refilled), or
    after 10 s; without a cgroup, after a fixed pause."""
    if meter is None:
        await asyncio.sleep(0.3)
        return
    last, deadline = meter.cpu_s(), time.monotonic() + 10.0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        now = meter.cpu_s()
        if now - last < 0.001:  # a millisecond: the runtime's idle housekeeping
            return
        last = now


def _runtime_pid(port: str) -> int:
    try:
        return child_running(os.getpid(), b"runtime_service")
    except RuntimeError:
        raise RuntimeError(f"no runtime process (port {port})") from None


async def main(quick: bool) -> dict[str, object]:
    rounds, programs = (2, 40) if quick else (4, 200)
    env = service_env(CODEMODE_RUNTIME_POOL_SIZE="8", CODEMODE_RUNTIME_WORKER_UID_COUNT="200")
    with cgroup_meter("codemode-bench-runtime-channel") as meter:
        async with subprocess_service(
            "-m", "runtime_service", "--listen", "127.0.0.1:0",
            ready_prefix="runtime listening on port", env=env,
        ) as port:  # fmt: skip
            if meter is not None:
                meter.leave()  # only the runtime (and what it starts) is in the cgroup
            totals = await _measure(port, rounds, programs, meter)
    figures = {name: _figures(t, meter is not None) for name, t in totals.items()}
    rates = {name: t["calls"] / t["seconds"] for name, t in totals.items()}
    ratio = rates["multiplexed"] / rates["per-run"]
    return {
        "benchmark": "runtime_channel",
        "quick": quick,
        "concurrency": CONCURRENCY,
        "calls_per_program": CALLS,
        "nested_calls_per_s": figures["multiplexed"]["nested_calls_per_s"],
        "baseline_nested_calls_per_s": figures["per-run"]["nested_calls_per_s"],
        "ratio": round(ratio, 2),
        "multiplexed": figures["multiplexed"],
        "per_run": figures["per-run"],
        # Where CPU bounds the rate (every core busy): the highest ratio the multiplexed
        # channel could reach if the registry's and the runtime's own work cost nothing, its
        # workers' CPU per call left alone.
        "ratio_ceiling_workers_bound": _ceiling(totals) if meter is not None else None,
        "cpu_source": "client: this process; runtime: /proc; workers: the runtime's cgroup"
        if meter is not None
        else "no cgroup: workers not measured",
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "target": {"ratio_min": 2.0},
        "meets_target": ratio >= 2.0,
    }


def _ceiling(totals: dict[str, dict[str, float]]) -> float:
    per_run, mux = totals["per-run"], totals["multiplexed"]
    keys = ("client_cpu_s", "runtime_cpu_s", "workers_cpu_s")
    baseline = sum(per_run[k] for k in keys) / per_run["calls"]
    return round(baseline / (mux["workers_cpu_s"] / mux["calls"]), 2)


def _figures(t: dict[str, float], metered: bool) -> dict[str, object]:
    calls = t["calls"]
    parts = {"client": t["client_cpu_s"], "runtime": t["runtime_cpu_s"]}
    if metered:
        parts["workers"] = t["workers_cpu_s"]
    total = sum(parts.values())
    return {
        "nested_calls_per_s": round(calls / t["seconds"], 1),
        "client_cpu_us_per_call": round(t["client_cpu_s"] / calls * 1e6, 1),
        "runtime_cpu_us_per_call": round(t["runtime_cpu_s"] / calls * 1e6, 1),
        "workers_cpu_us_per_call": round(t["workers_cpu_s"] / calls * 1e6, 1) if metered else None,
        # Mostly each run's worker start (its fork, isolation and boot), whichever channel.
        "workers_cpu_ms_per_program": round(t["workers_cpu_s"] / (calls / CALLS) * 1e3, 2)
        if metered
        else None,
        "total_cpu_us_per_call": round(total / calls * 1e6, 1),
        "cpu_shares": {name: round(value / total, 3) for name, value in parts.items()},
        "nested_calls": int(calls),
    }


async def _measure(
    port: str, rounds: int, programs: int, meter: CgroupMeter | None
) -> dict[str, dict[str, float]]:
    pid = _runtime_pid(port)
    target = [f"127.0.0.1:{port}"]
    channels = {
        name: GrpcRuntime(target, 4 << 20, start_timeout_s=10.0, channel=name)
        for name in ("per-run", "multiplexed")
    }
    keys = ("seconds", "calls", "client_cpu_s", "runtime_cpu_s", "workers_cpu_s")
    totals = {name: dict.fromkeys(keys, 0.0) for name in channels}
    try:
        for runtime in channels.values():  # warm-up: connections, capabilities, the pool
            await asyncio.gather(*(_one(runtime) for _ in range(CONCURRENCY)))
        for _ in range(rounds):
            for name, runtime in channels.items():
                await asyncio.sleep(0.3)  # the pool refills outside the measurement
                for key, value in (await _round(runtime, programs, pid, meter)).items():
                    totals[name][key] += value
    finally:
        for runtime in channels.values():
            await runtime.close()
    return totals


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run")
    print(json.dumps(asyncio.run(main(parser.parse_args().quick)), indent=2))
