"""Nested calls per second through the registry's runtime client, per-run streams against the
multiplexed channel (`runtime_channel`), measured in the same run against the same runtime.

The runtime server runs in its own process (real gRPC on loopback); this process drives runs
through `registry_service.runtime_client.GrpcRuntime` (the registry's own port to the
runtime), answering every binding call at once with an empty object: `CONCURRENCY` programs at
a time, each making `CALLS` nested calls one after another. Both channels run the same
workload, alternating rounds so a change in the machine's load hits both alike;
`nested_calls_per_s` is the figure of each, `ratio` multiplexed over per-run. CPU per nested
call (this process, the runtime's own, from `/proc`) is reported beside it: it holds on a
loaded machine where the rate does not.

Target: the multiplexed channel >= 2 x the per-run baseline.

    .venv/bin/python -m benchmarks.runtime_channel [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from benchmarks._support import service_env, subprocess_service
from registry_service.codemode.runtime_port import BindingCall, RunSpec, RunTerminal
from registry_service.runtime_client import GrpcRuntime

CONCURRENCY = 20
CALLS = 50
PROGRAM = f"for i in range({CALLS}):\n    await tools.echo({{'i': i}})\nreturn {CALLS}"
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


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


async def _round(runtime: GrpcRuntime, programs: int, runtime_pid: int) -> dict[str, float]:
    remaining = programs

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await _one(runtime)

    own, served = time.process_time(), _cpu_s(runtime_pid)
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    took = time.perf_counter() - started
    calls = programs * CALLS
    return {
        "seconds": took,
        "calls": calls,
        "client_cpu_s": time.process_time() - own,
        "runtime_cpu_s": _cpu_s(runtime_pid) - served,
    }


def _runtime_pid(port: str) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if b"runtime_service" in cmd and str(os.getpid()).encode() != entry.encode():
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                if parent == os.getpid():
                    return int(entry)
    raise RuntimeError(f"no runtime process (port {port})")


async def main(quick: bool) -> dict[str, object]:
    rounds, programs = (2, 40) if quick else (4, 200)
    env = service_env(CODEMODE_RUNTIME_POOL_SIZE="8", CODEMODE_RUNTIME_WORKER_UID_COUNT="200")
    async with subprocess_service(
        "-m", "runtime_service", "--listen", "127.0.0.1:0",
        ready_prefix="runtime listening on port", env=env,
    ) as port:  # fmt: skip
        pid = _runtime_pid(port)
        target = [f"127.0.0.1:{port}"]
        channels = {
            name: GrpcRuntime(target, 4 << 20, start_timeout_s=10.0, channel=name)
            for name in ("per-run", "multiplexed")
        }
        totals = {name: {"seconds": 0.0, "calls": 0.0, "client_cpu_s": 0.0, "runtime_cpu_s": 0.0}
                  for name in channels}  # fmt: skip
        try:
            for runtime in channels.values():  # warm-up: connections, capabilities, the pool
                await asyncio.gather(*(_one(runtime) for _ in range(CONCURRENCY)))
            for _ in range(rounds):
                for name, runtime in channels.items():
                    await asyncio.sleep(0.3)  # the pool refills outside the measurement
                    for key, value in (await _round(runtime, programs, pid)).items():
                        totals[name][key] += value
        finally:
            for runtime in channels.values():
                await runtime.close()
    figures = {
        name: {
            "nested_calls_per_s": round(t["calls"] / t["seconds"], 1),
            "client_cpu_us_per_call": round(t["client_cpu_s"] / t["calls"] * 1e6, 1),
            "runtime_cpu_us_per_call": round(t["runtime_cpu_s"] / t["calls"] * 1e6, 1),
            "nested_calls": int(t["calls"]),
        }
        for name, t in totals.items()
    }
    ratio = figures["multiplexed"]["nested_calls_per_s"] / figures["per-run"]["nested_calls_per_s"]
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
        "target": {"ratio_min": 2.0},
        "meets_target": ratio >= 2.0,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run")
    print(json.dumps(asyncio.run(main(parser.parse_args().quick)), indent=2))
