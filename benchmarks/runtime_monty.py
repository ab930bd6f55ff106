"""The Monty tier of ``benchmarks.runtime_throughput`` on its own, with a host used once per run
beside it (what a run without a tenant gets), all in the same run.

The workload of ``benchmarks.runtime_throughput`` (10-call programs, 50 at once, every binding
call answered on the stream, CPU from the benchmark's cgroup: every process of a run):
CPython programs on the fork tier; Monty programs with each client a tenant of its own (its
runs share its kept host, ``runtime_service/kept_hosts.py``); the same Monty programs without a
tenant (a fresh sandboxed bridge and ``monty`` process per run); the same programs with every
client one tenant (``monty_one_tenant``: 50 runs at once on its few kept hosts, the others
waiting for one or on hosts used once); and a bare ``pydantic_monty`` pool in this process, no
services and no sandbox.

Targets (the kept-host tier): >= 5 x the CPython fork tier, >= 0.5 x the bare pool, <= 6 ms of
CPU per program over all processes.

P1 on this tier (``monty_p1``): ``run_code`` with 0 nested calls through a registry, for an
agent whose ``code_language`` is ``monty`` (its runs share its kept host), against a bare
grpc.aio unary round trip taken after the same idle (everything quiet for 50 ms, as
``benchmarks.run_code`` settles), interleaved with the same program for a CPython agent and a
Monty ``Run`` straight on the runtime. ``monty_p1_ratio`` is the Monty p50 over the unary p50;
target <= 2. ``monty_p1_floor_ratio`` is what the two gRPC hops cost bare: the unary plus one
message each way on a bidi stream opened before the samples (the registry's runs are frames on
the one stream it keeps open to a runtime, ``registry_service/runtime_mux.py``, not a stream
each), over the unary; ``monty_p1_direct_floor_ratio`` a new bidi stream's (a direct ``Run``).

    .venv/bin/python -m benchmarks.runtime_monty [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

import grpc

from benchmarks._run_code_support import service, wait_for_pool
from benchmarks._support import summary_ms
from benchmarks.run_code import ZERO, Client, samples_of
from benchmarks.runtime_throughput import (
    CONCURRENCY,
    MONTY_LANGUAGES,
    MONTY_PROGRAM,
    echo_run,
    monty_tier,
    workload,
)
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc

P1_TARGET = 2.0


async def p1(rounds: int) -> dict[str, Any]:
    """``run_code`` P1 for a Monty agent and a CPython agent, and a direct Monty ``Run``,
    beside a bare unary round trip after the same idle; samples interleaved."""
    async with (
        service("-m", "benchmarks._baseline_server", ready_prefix="port ") as base,
        service(
            "-m", "runtime_service", "--listen", "127.0.0.1:0",
            ready_prefix="runtime listening on port ",
            env={"CODEMODE_RUNTIME_LANGUAGES": MONTY_LANGUAGES, "CODEMODE_RUNTIME_POOL_SIZE": "2"},
        ) as runtime,
        service(
            "-m", "registry_service", "--listen", "127.0.0.1:0",
            ready_prefix="registry listening on port ",
            env={
                "CODEMODE_REGISTRY_DEFAULT_MODE": "code",
                "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps([runtime.address]),
                "CODEMODE_REGISTRY_RUNTIME_LANGUAGES": MONTY_LANGUAGES,
                "CODEMODE_REGISTRY_HISTORY_PATH": ":memory:",
            },
        ) as registry,
        grpc.aio.insecure_channel(base.address) as base_channel,
        grpc.aio.insecure_channel(registry.address) as channel,
        grpc.aio.insecure_channel(runtime.address) as runtime_channel,
    ):  # fmt: skip
        client = Client(channel)
        agents = {}
        for language in ("monty", "python"):
            agent = scope_pb2.Agent(mode=scope_pb2.PRESENTATION_MODE_CODE, code_language=language)
            created = await client.stub.CreateAgent(
                rpb.CreateAgentRequest(agent_id=f"bench-{language}", agent=agent)
            )
            agents[language] = created.agent.name
        runtime_stub = runtime_pb2_grpc.RuntimeServiceStub(runtime_channel)
        echo = base_channel.unary_unary("/bench.Baseline/Echo")
        ping_pong = base_channel.stream_stream("/bench.Baseline/PingPong")
        payload = json.dumps({"code": ZERO, "description": "benchmark program"}).encode()

        async def unary_after_idle() -> float:
            started = time.perf_counter()
            await echo(payload)
            return time.perf_counter() - started

        async def bidi_after_idle() -> float:
            # What a Run is at the least: a new bidi stream, one message each way, its end.
            started = time.perf_counter()
            call = ping_pong()
            await call.write(payload)
            await call.read()
            await call.done_writing()
            await call.read()  # the end of the stream
            return time.perf_counter() - started

        # The registry reaches the runtime over one stream it keeps open (``registry_service/
        # runtime_mux.py``): a run there is frames on that stream, not a new stream. Opened once
        # (here, before any sample), each sample is one message each way on it.
        open_stream = ping_pong()

        async def frame_on_open_bidi_after_idle() -> float:
            started = time.perf_counter()
            await open_stream.write(payload)
            await open_stream.read()
            return time.perf_counter() - started

        async def direct() -> float:
            started = time.perf_counter()
            await echo_run(runtime_stub, ZERO, "monty", "bench-direct")
            return time.perf_counter() - started

        async def settle() -> None:
            await wait_for_pool(runtime, 2)  # the CPython pool refilled, nothing running

        for _ in range(5):  # warm-up: connections, the Monty agent's kept host, code paths
            await client.run(ZERO, agents["monty"])
            await client.run(ZERO, agents["python"])
            await direct()
            await unary_after_idle()
            await bidi_after_idle()
            await frame_on_open_bidi_after_idle()
        await settle()
        monty, python, straight, unary, bidi, frame = await samples_of(
            [
                lambda: client.run(ZERO, agents["monty"]),
                lambda: client.run(ZERO, agents["python"]),
                direct,
                unary_after_idle,
                bidi_after_idle,
                frame_on_open_bidi_after_idle,
            ],
            rounds,
            settle,
        )
        await open_stream.done_writing()
    unary_p50 = statistics.median(unary)
    ratio = statistics.median(monty) / unary_p50
    # run_code is a unary to the registry around one frame exchange on the registry's open
    # stream to the runtime (a run's start out, its terminal back): the two bare round trips
    # alone, before any work of either service, of the worker channel or of the program.
    floor = (unary_p50 + statistics.median(frame)) / unary_p50
    # A Run of its own (the direct path) opens a stream per run: a unary's worth of the
    # caller's P1 against a new bidi stream's, bare.
    direct_floor = statistics.median(bidi) / unary_p50
    return {
        "monty_p1_ratio": round(ratio, 3),
        "monty_p1_meets_target": ratio <= P1_TARGET,
        "monty_p1_floor_ratio": round(floor, 3),
        "monty_p1_direct_floor_ratio": round(direct_floor, 3),
        "monty_p1": {
            "run_code_monty": summary_ms(monty),
            "run_code_python": summary_ms(python),
            "direct_run_monty_kept_host": summary_ms(straight),
            "unary_after_same_idle": summary_ms(unary),
            "bidi_stream_after_same_idle": summary_ms(bidi),
            "frame_on_open_bidi_after_same_idle": summary_ms(frame),
            "floor": (
                "(unary + one frame each way on an open bidi stream) p50 / unary p50: "
                "run_code's two gRPC hops bare (the registry's runs share one open stream)"
            ),
            "direct_floor": "new bidi stream p50 / unary p50: a direct Run's one hop, bare",
            "python_ratio_to_unary": round(statistics.median(python) / statistics.median(unary), 3),
            "rounds": rounds,
            "target": f"run_code_monty p50 <= {P1_TARGET} x unary_after_same_idle p50",
        },
    }


async def main(quick: bool, p1_only: bool = False) -> dict[str, object]:
    if p1_only:
        return {"benchmark": "runtime_monty", "quick": quick, "load_average": os.getloadavg(),
                **await p1(20 if quick else 100)}  # fmt: skip
    programs = 100 if quick else 600
    languages = MONTY_LANGUAGES
    cpython = await workload("fork-server", programs, CODEMODE_RUNTIME_LANGUAGES=languages)
    once = await workload(
        "fork-server", programs, "monty", MONTY_PROGRAM, CODEMODE_RUNTIME_LANGUAGES=languages
    )
    kept = await monty_tier(programs * 5, cpython)
    # Every client the same tenant: its runs beyond its kept hosts wait for one of them
    # (kept_host_wait_s) or take a host used once.
    one = await workload(
        "fork-server", programs * 3, "monty", MONTY_PROGRAM, one_tenant=True,
        CODEMODE_RUNTIME_LANGUAGES=languages,
    )  # fmt: skip
    latency = await p1(20 if quick else 100)
    return {
        "benchmark": "runtime_monty",
        "quick": quick,
        "load_average": os.getloadavg(),
        **latency,
        "concurrency": CONCURRENCY,
        "calls_per_program": 10,
        **kept,
        "cpython_fork_programs_per_s": cpython["programs_per_s"],
        "cpython_cpu_ms_per_program": cpython["worker_cpu_ms_per_run"],
        "monty_host_per_run_programs_per_s": once["programs_per_s"],
        "monty_one_tenant_programs_per_s": one["programs_per_s"],
        "monty_one_tenant_cpu_ms_per_program": round(
            float(one["worker_cpu_ms_per_run"]) + float(one["runtime_cpu_ms_per_run"]), 3
        ),
        "monty_host_per_run_cpu_ms_per_program": once["worker_cpu_ms_per_run"],
        "cpython_fork": cpython,
        "monty_host_per_run": once,
        "monty_one_tenant": one,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--p1-only", action="store_true", help="only the P1 figures")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.quick, args.p1_only))))
