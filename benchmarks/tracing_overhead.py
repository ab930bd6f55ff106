"""Tracing on vs off: the per-nested-call overhead of run_code (P2 of run_code.py), same run.

Two stacks run side by side, each a runtime and a registry in their own processes: one with
tracing off (`trace_file=off`: no SDK, no interceptors), one with the embedded default (the
SDK, a BatchSpanProcessor appending every span to a JSON-lines file, the gRPC
instrumentation's transport spans). Programs making 0 and 100 sequential nested calls to an
in-process tool run on both, interleaved round by round; per stack the per-call cost is
(p50(t_100) - p50(t_0)) / 100. Target: tracing adds <= 15 % per nested call.
The CPU time the registry and runtime processes spend per nested call (mean, from /proc) is
reported beside it, and the registry's alone (where tracing's cost is): it is far less
sensitive than wall time to other load on the machine; and the CPU of all processes, the
runtime's workers included (each runtime is started in a cgroup of its own,
`benchmarks/_cgroup_meter.py`).

    python -m benchmarks.tracing_overhead [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from benchmarks._cgroup_meter import CgroupMeter, cgroup_meter
from benchmarks._support import emit, process_cpu_s, summary_ms
from codemode_cli.processes import running
from codemode_common.telemetry.jsonl import read_spans
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.tools import Invocation
from registry_service.registry import Registry

N = 100
ZERO = "return 1"
SEQUENTIAL = f"for _ in range({N}):\n    await tools.noop({{}})\nreturn 1"
TARGET = 0.15
ROOT = Path(__file__).resolve().parents[1]


async def _noop(invocation: Invocation) -> JsonValue:
    return invocation.arguments


def install(registry: Registry) -> None:
    """Registry plugin (`benchmarks.tracing_overhead:install`): the in-process `noop` tool."""
    registry.register_tool(
        "noop", _noop, description="Returns its arguments", concurrency_safe=True
    )


@contextlib.asynccontextmanager
async def _process(module: str, ready: str, env: dict[str, str]) -> AsyncIterator[tuple[int, int]]:
    """`python -m <module> --listen 127.0.0.1:0`; yields (the port it printed, its pid). The stop
    is SIGTERM first: a graceful stop flushes the span processor."""
    async with running(
        "-m", module, "--listen", "127.0.0.1:0", ready=ready, env=env, stop_grace=20
    ) as started:
        yield int(started.rest), started.proc.pid


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CODEMODE_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")])
    return env


@dataclass
class Stack:
    name: str
    stub: Any
    pids: tuple[int, int]
    meter: CgroupMeter | None  # the runtime's cgroup: it and every process of its runs
    zero: list[float] = field(default_factory=list)
    sequential: list[float] = field(default_factory=list)
    cpu_zero: list[float] = field(default_factory=list)
    cpu_sequential: list[float] = field(default_factory=list)
    all_zero: list[float] = field(default_factory=list)
    all_sequential: list[float] = field(default_factory=list)
    registry_zero: list[float] = field(default_factory=list)
    registry_sequential: list[float] = field(default_factory=list)

    def cpu_s(self) -> float:
        """The registry's and the runtime's own CPU seconds (what tracing runs in)."""
        return sum(process_cpu_s(pid) for pid in self.pids)

    def registry_cpu_s(self) -> float:
        return process_cpu_s(self.pids[1])

    def all_cpu_s(self) -> float:
        """The registry's and everything in the runtime's cgroup (its workers too); the
        services alone without a cgroup."""
        if self.meter is None:
            return self.cpu_s()
        return process_cpu_s(self.pids[1]) + self.meter.cpu_s()

    def per_call_s(self) -> float:
        return (statistics.median(self.sequential) - statistics.median(self.zero)) / N

    def per_call_by_round_s(self) -> list[float]:
        zero = statistics.median(self.zero)
        return [(t - zero) / N for t in self.sequential]

    def cpu_per_call_s(self) -> float:
        """Mean CPU (background span export included, whenever it ran) per nested call."""
        return (statistics.fmean(self.cpu_sequential) - statistics.fmean(self.cpu_zero)) / N

    def all_cpu_per_call_s(self) -> float:
        return (statistics.fmean(self.all_sequential) - statistics.fmean(self.all_zero)) / N

    def registry_cpu_per_call_s(self) -> float:
        return (
            statistics.fmean(self.registry_sequential) - statistics.fmean(self.registry_zero)
        ) / N


@contextlib.asynccontextmanager
async def _stack(name: str, trace_file: str) -> AsyncIterator[Stack]:
    env = _base_env()
    env["CODEMODE_RUNTIME_TRACE_FILE"] = trace_file
    with cgroup_meter(f"codemode-bench-tracing-{name}") as meter:
        async with _process("runtime_service", "runtime listening on port ", env) as runtime:
            if meter is not None:
                meter.leave()  # the runtime and its workers stay in; this process does not
            async with _registry(name, trace_file, runtime, meter) as stack:
                yield stack


@contextlib.asynccontextmanager
async def _registry(
    name: str, trace_file: str, runtime: tuple[int, int], meter: CgroupMeter | None
) -> AsyncIterator[Stack]:
    runtime_port, runtime_pid = runtime
    env = _base_env()
    env.update(
        CODEMODE_REGISTRY_TRACE_FILE=trace_file,
        CODEMODE_REGISTRY_RUNTIME_TARGETS=json.dumps([f"127.0.0.1:{runtime_port}"]),
        CODEMODE_REGISTRY_DEFAULT_MODE="code",
        CODEMODE_REGISTRY_HISTORY_PATH=":memory:",
        CODEMODE_REGISTRY_PLUGINS=json.dumps(["benchmarks.tracing_overhead:install"]),
    )
    async with _process("registry_service", "registry listening on port ", env) as registry:
        port, pid = registry
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = rpb_grpc.RegistryServiceStub(channel)
            yield Stack(name, stub, (runtime_pid, pid), meter)


_ids = itertools.count(1)


async def _run(stack: Stack, code: str) -> float:
    request = rpb.ExecuteToolCallRequest(
        call_id=f"bench-{next(_ids)}",
        tool_name="run_code",
        arguments_json=json.dumps({"code": code, "description": "tracing benchmark"}),
    )
    started = time.perf_counter()
    result = None
    async for event in stack.stub.ExecuteToolCall(request, timeout=120):
        if event.WhichOneof("event") == "result":
            result = event.result
    took = time.perf_counter() - started
    if result is None or result.is_error:
        raise RuntimeError(f"run_code failed on {stack.name}: {result}")
    return took


async def measure(rounds: int, warmup: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        trace_file = str(Path(tmp) / "traces.jsonl")
        async with _stack("off", "off") as off, _stack("on", trace_file) as on:
            stacks = [off, on]
            for stack in stacks:
                for _ in range(warmup):
                    await _run(stack, ZERO)
                    await _run(stack, SEQUENTIAL)
            rng = random.Random(6)
            for _ in range(rounds):
                order = stacks[:]
                rng.shuffle(order)  # interleaved, in random order: drift hits both alike
                for stack in order:
                    cpu, every = stack.cpu_s(), stack.all_cpu_s()
                    registry = stack.registry_cpu_s()
                    stack.zero.append(await _run(stack, ZERO))
                    cpu_after, every_after = stack.cpu_s(), stack.all_cpu_s()
                    registry_after = stack.registry_cpu_s()
                    stack.cpu_zero.append(cpu_after - cpu)
                    stack.all_zero.append(every_after - every)
                    stack.registry_zero.append(registry_after - registry)
                    stack.sequential.append(await _run(stack, SEQUENTIAL))
                    stack.cpu_sequential.append(stack.cpu_s() - cpu_after)
                    stack.all_sequential.append(stack.all_cpu_s() - every_after)
                    stack.registry_sequential.append(stack.registry_cpu_s() - registry_after)
        spans = list(read_spans(trace_file))  # both traced processes flushed on SIGTERM
    runs = (warmup + rounds) * 2
    per_off, per_on = off.per_call_s(), on.per_call_s()
    overhead = per_on / per_off - 1
    cpu_off, cpu_on = off.cpu_per_call_s(), on.cpu_per_call_s()
    # Each round ran both stacks back to back: the median of the per-round ratios is the
    # figure least moved by load elsewhere on the machine drifting during the run.
    paired = statistics.median(
        b / a - 1 for a, b in zip(off.per_call_by_round_s(), on.per_call_by_round_s(), strict=True)
    )
    return {
        "benchmark": "tracing_overhead",
        "nested_calls_per_program": N,
        "rounds": rounds,
        "tracing_off": {
            "run_0_calls": summary_ms(off.zero),
            f"run_{N}_calls": summary_ms(off.sequential),
            "per_nested_call_us": round(per_off * 1e6, 2),
            "cpu_per_nested_call_us": round(cpu_off * 1e6, 2),
            "registry_cpu_per_nested_call_us": round(off.registry_cpu_per_call_s() * 1e6, 2),
            "all_processes_cpu_per_nested_call_us": round(off.all_cpu_per_call_s() * 1e6, 2),
        },
        "tracing_on": {
            "exporter": "BatchSpanProcessor -> JSON-lines file, gRPC transport spans",
            "run_0_calls": summary_ms(on.zero),
            f"run_{N}_calls": summary_ms(on.sequential),
            "per_nested_call_us": round(per_on * 1e6, 2),
            "cpu_per_nested_call_us": round(cpu_on * 1e6, 2),
            "registry_cpu_per_nested_call_us": round(on.registry_cpu_per_call_s() * 1e6, 2),
            "all_processes_cpu_per_nested_call_us": round(on.all_cpu_per_call_s() * 1e6, 2),
            "spans_written": len(spans),
            "spans_per_nested_call": round(
                sum(s["name"] == "execute_tool noop" for s in spans) / (runs // 2 * N), 3
            ),
        },
        "overhead_per_nested_call": round(overhead, 4),
        "overhead_per_nested_call_us": round((per_on - per_off) * 1e6, 2),
        "overhead_per_nested_call_paired_median": round(paired, 4),
        "cpu_overhead_per_nested_call": round(cpu_on / cpu_off - 1, 4),
        "registry_cpu_overhead_per_nested_call_us": round(
            (on.registry_cpu_per_call_s() - off.registry_cpu_per_call_s()) * 1e6, 2
        ),
        "all_processes_cpu_overhead_per_nested_call": round(
            on.all_cpu_per_call_s() / off.all_cpu_per_call_s() - 1, 4
        ),
        "cpu_accounting": "registry and runtime: /proc of each; all processes: the registry "
        "and the runtime's cgroup (its workers included)"
        if off.meter is not None
        else "registry and runtime: /proc of each (no cgroup: all processes = the services)",
        "target": f"overhead <= {TARGET:.0%} per nested call",
        "meets_target": overhead <= TARGET,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds, warmup = (8, 2) if args.quick else (60, 5)
    emit(asyncio.run(measure(rounds, warmup)))


if __name__ == "__main__":
    main()
