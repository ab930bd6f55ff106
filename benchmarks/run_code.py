"""`run_code` end to end: client -> registry -> runtime -> worker -> nested calls -> back.

Topology: the registry and the runtime each in their own process (the registry loads the
in-process tools `noop` and `sleep100` from `benchmarks._run_code_tools`), a bare gRPC server
for the same-run baselines in a third, and the benchmark client here. Figures and targets:

- P1: `run_code` with 0 nested calls: p50 <= 3 ms and <= 5 x a bare unary round trip.
- P2: overhead per nested call to an in-process tool, (t_100 - t_0) / 100 at the p50:
  <= 1.5 x (bare pipe round trip + bare bidi round trip).
- P3: 10 independent 100 ms concurrency-safe calls under `asyncio.gather` in one program:
  <= 1.2 x the program making one such call.
- P4: nested calls per second, 50 concurrent programs: >= 2,500/s. Measured with every progress
  event, batched as the clients ask for them (`batch_progress`); also reported unbatched and with
  the result only.
- P5: 200 concurrent programs x 10 nested calls: every result successful, 2,000 settle records.

CPU is counted for every process: the registry's and the runtime's own from /proc, the runtime's
workers (fork server, every run's init and worker, the pool refills) from a cgroup the runtime
is started in (`benchmarks/_cgroup_meter.py`), the client's from this process. Keys:
`nested_call_cpu_us` (P4, all processes, target <= 600), `run_fixed_cpu_ms_services` (registry +
runtime + client for a 0-call run, target <= 4), `echo_1mb_cpu_ratio` (a 1 MB value echoed by a
nested call, all processes, over a stdlib `json` round trip of it sampled between the runs;
target <= 4; beside it `worker_channel_cpu_ms`, the channel's four hops of it in this process,
frames spelled plain and raw),
`P1_ratio_to_unary` and `P2_ratio_to_bidi` (bare grpc.aio round trips of the same run).

Per language, in the same run and interleaved with Python's P1/P2 samples: the same
programs in TypeScript through a second registry whose deployment language is `typescript` (the
same runtime, no agent, so the path differs only by the language). Targets: TypeScript's P1 p50
<= 2 x Python's, its per-nested-call overhead <= 1.2 x Python's; under `languages`.

Sequential samples (P1-P3) each start from a settled stack: the pool refilled and no CPU
used by the runtime or its workers for 50 ms, so no worker boot overlaps a sample. Waking idle
processes costs extra on a VM, so P1 also reports a unary round trip taken after the same
settling (`baseline_unary_after_same_idle`) next to the usual back-to-back one.

`--profile` runs the registry and the runtime under cProfile and adds their hottest functions
(the figures of a profiled run are slower than normal).

    python -m benchmarks.run_code [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc

from benchmarks._cgroup_meter import CgroupMeter, cgroup_meter
from benchmarks._run_code_support import (
    Service,
    pipe_round_trips,
    profile_top,
    service,
    wait_for_pool,
)
from benchmarks._support import emit, summary_ms
from codemode_client import unbatched
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc

ZERO = "return 1"
SEQUENTIAL_N = 100
SEQUENTIAL = f"for _ in range({SEQUENTIAL_N}):\n    await tools.noop({{}})\nreturn 1"
TS_ZERO = "return 1;"
TS_SEQUENTIAL = (
    f"for (let i = 0; i < {SEQUENTIAL_N}; i++) {{\n  await tools.noop({{}});\n}}\nreturn 1;"
)
TS_POOL_SIZE = 4
"""Idle TypeScript workers: the sequential samples take one at a time."""
SLEEP_ONE = "await tools.sleep100({})\nreturn 1"
SLEEP_TEN = (
    "import asyncio\nawait asyncio.gather(*(tools.sleep100({}) for _ in range(10)))\nreturn 1"
)
ECHO_ITEMS = 16_000
_ECHO_BUILD_VALUE = (
    f"value = [{{'id': i, 'name': f'item {{i}}', 'tags': ['a', 'b'], 'score': i / 2}}"
    f" for i in range({ECHO_ITEMS})]\n"
)
ECHO_BUILD = _ECHO_BUILD_VALUE + "return len(value)"
ECHO_1MB = _ECHO_BUILD_VALUE + "echoed = await tools.noop({'v': value})\nreturn len(echoed['v'])"
ECHO_VALUE = {
    "v": [
        {"id": i, "name": f"item {i}", "tags": ["a", "b"], "score": i / 2}
        for i in range(ECHO_ITEMS)
    ]
}
"""The value the 1 MB echo sends (the program builds the same one)."""
ECHO_CPU_RATIO_TARGET = 4.0
RUN_FIXED_CPU_TARGET_MS = 4.0
P4_PROGRAMS = 50
NESTED_CALL_CPU_TARGET_US = 600.0
"""CPU per nested call over every process (registry, runtime, workers, client) in P4."""
P5_PROGRAMS, P5_CALLS = 200, 10
P5_PROGRAM = f"for i in range({P5_CALLS}):\n    await tools.noop({{'i': i}})\nreturn 1"
CALL_TIMEOUT_S = 180.0
SETTLE = "tool/code-dispatch"
SETTLE_START = "tool/code-dispatch-start"


def p4_program(sequential: int, gathers: int) -> str:
    """`sequential` awaited calls, then `gathers` rounds of 10 calls under asyncio.gather."""
    return (
        "import asyncio\n"
        f"for i in range({sequential}):\n"
        "    await tools.noop({'i': i})\n"
        f"for _ in range({gathers}):\n"
        "    await asyncio.gather(*(tools.noop({'j': j}) for j in range(10)))\n"
        "return 1"
    )


@dataclass
class Outcome:
    seconds: float
    ok: bool
    message: str = ""
    events: int = 0  # progress events before the result (nested_started, nested_settled, ...)
    messages: int = 0  # stream messages that carried them (fewer when batched)


class Client:
    """ExecuteToolCall(run_code) against the registry."""

    def __init__(self, channel: Any, call_prefix: str = "bench") -> None:
        """`call_prefix` starts every call id: clients of one agent on several registry
        replicas need their own, or their call ids would repeat in the shared history."""
        self.stub = rpb_grpc.RegistryServiceStub(channel)
        self._prefix = call_prefix
        self._ids = itertools.count(1)

    async def create_agent(self, agent_id: str) -> str:
        response = await self.stub.CreateAgent(
            rpb.CreateAgentRequest(
                agent_id=agent_id,
                agent=scope_pb2.Agent(mode=scope_pb2.PRESENTATION_MODE_CODE),
            )
        )
        return str(response.agent.name)

    async def outcome(
        self, code: str, agent: str = "", *, quiet: bool = False, batch: bool = False
    ) -> Outcome:
        """One program; `quiet` asks for the result only (progress_events=NONE), `batch` lets
        the registry batch progress events that are ready together (as the clients do)."""
        request = rpb.ExecuteToolCallRequest(
            agent=agent,
            call_id=f"{self._prefix}-{next(self._ids)}",
            tool_name="run_code",
            arguments_json=json.dumps({"code": code, "description": "benchmark program"}),
            progress_events=rpb.PROGRESS_EVENTS_NONE if quiet else rpb.PROGRESS_EVENTS_ALL,
            batch_progress=batch,
        )
        started = time.perf_counter()
        result = None
        events = messages = 0
        async with asyncio.timeout(CALL_TIMEOUT_S):
            async for message in self.stub.ExecuteToolCall(request):
                if message.WhichOneof("event") == "result":
                    result = message.result
                else:
                    messages += 1
                    events += sum(1 for _ in unbatched(message))
        took = time.perf_counter() - started
        if result is None:
            return Outcome(took, False, "the stream ended without a result", events, messages)
        if result.is_error:
            return Outcome(took, False, result.error.message, events, messages)
        return Outcome(took, True, "", events, messages)

    async def checked(
        self, code: str, agent: str = "", *, quiet: bool = False, batch: bool = False
    ) -> Outcome:
        """One program; fails the benchmark if it does not succeed."""
        outcome = await self.outcome(code, agent, quiet=quiet, batch=batch)
        if not outcome.ok:
            raise RuntimeError(f"run_code failed: {outcome.message}")
        return outcome

    async def run(self, code: str, agent: str = "", *, quiet: bool = False) -> float:
        return (await self.checked(code, agent, quiet=quiet)).seconds

    async def count_history(self, agent: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        settled_ids: set[str] = set()
        token = ""
        while True:
            page = await self.stub.ListHistory(
                rpb.ListHistoryRequest(agent=agent, page_size=1000, page_token=token)
            )
            for record in page.records:
                counts[record.kind] = counts.get(record.kind, 0) + 1
                if record.kind == SETTLE:
                    settled_ids.add(record.call_id)
            token = page.next_page_token
            if not token:
                break
        counts["distinct_settled_call_ids"] = len(settled_ids)
        return counts


async def direct_run(stub: Any, program: str, language: str = "python") -> float:
    """A Run straight on the runtime, this process answering every binding call."""
    started = time.perf_counter()
    call = stub.Run()
    start = pb.RunStart(program=program, language=language, binding_names=["noop"])
    await call.write(pb.RunRequest(start=start))
    async for message in call:
        kind = message.WhichOneof("kind")
        if kind == "binding_call":
            reply = pb.CallResult(
                call_id=message.binding_call.call_id,
                value_json=message.binding_call.arguments_json,
            )
            await call.write(pb.RunRequest(call_result=reply))
        elif kind == "terminal":
            if message.terminal.WhichOneof("outcome") != "success":
                raise RuntimeError(f"direct run failed: {message.terminal}")
            break
    took = time.perf_counter() - started
    await call.done_writing()
    return took


@dataclass
class Round:
    """One P4 round: wall time, CPU seconds by consumer, outer stream events and messages."""

    wall_s: float
    cpu: dict[str, float]
    events: int
    messages: int


@dataclass(frozen=True)
class CpuMark:
    """CPU seconds used so far by each process of the stack: the registry's and the runtime's
    own (/proc), every process in the runtime's cgroup (the runtime, its fork server, every
    run's init and worker, the pool refills; None without a cgroup) and this client's."""

    registry: float
    runtime: float
    runtime_cgroup: float | None
    client: float

    @staticmethod
    def read(registry: Service, runtime: Service) -> CpuMark:
        meter = runtime.meter
        return CpuMark(
            registry.cpu().own_s,
            runtime.cpu().own_s,
            meter.cpu_s() if meter is not None else None,
            time.process_time(),
        )


def cpu_between(
    start: CpuMark,
    end: CpuMark,
    settled: CpuMark,
    runtime: Service,
    workers_before: dict[int, float],
) -> dict[str, float]:
    """CPU seconds per process from `start` to `end` (the work) and, for the runtime and its
    workers, on to `settled` (the pool refilled, every finished worker reaped: what the work
    cost them in full). Without a cgroup the workers' share is a /proc lower bound."""
    cpu = {
        "registry": end.registry - start.registry,
        "runtime": settled.runtime - start.runtime,
        "client": end.client - start.client,
    }
    if start.runtime_cgroup is not None and settled.runtime_cgroup is not None:
        cpu["workers"] = settled.runtime_cgroup - start.runtime_cgroup - cpu["runtime"]
    else:
        cpu["workers"] = _workers_lower_bound(runtime, workers_before)
    return cpu


async def throughput_round(
    client: Client,
    registry: Service,
    runtime: Service,
    code: str,
    settle: Callable[[], Awaitable[None]],
    *,
    quiet: bool = False,
    batch: bool = False,
) -> Round:
    workers_before = runtime.children_cpu()
    start = CpuMark.read(registry, runtime)
    started = time.perf_counter()
    outcomes = await asyncio.gather(
        *(client.checked(code, quiet=quiet, batch=batch) for _ in range(P4_PROGRAMS))
    )
    wall = time.perf_counter() - started
    end = CpuMark.read(registry, runtime)
    await settle()
    cpu = cpu_between(start, end, CpuMark.read(registry, runtime), runtime, workers_before)
    return Round(wall, cpu, sum(o.events for o in outcomes), sum(o.messages for o in outcomes))


async def samples_of(
    ops: list[Callable[[], Awaitable[float]]],
    rounds: int,
    settle: Callable[[], Awaitable[None]],
) -> list[list[float]]:
    """Interleaves the operations `rounds` times, settling after each; one list per op."""
    out: list[list[float]] = [[] for _ in ops]
    for _ in range(rounds):
        for index, op in enumerate(ops):
            out[index].append(await op())
            await settle()
    return out


async def timed(op: Callable[[], Awaitable[Any]], count: int, warmup: int = 50) -> list[float]:
    took = []
    for i in range(count + warmup):
        started = time.perf_counter()
        await op()
        if i >= warmup:
            took.append(time.perf_counter() - started)
    return took


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


@contextlib.asynccontextmanager
async def stack(
    pool_size: int, profile_dir: str | None
) -> AsyncIterator[tuple[Service, Service, Service, Service]]:
    """Baseline server, runtime (workers in its pools) and two registries wired to it: the
    second one's deployment language is TypeScript."""

    def profile(name: str) -> str | None:
        return os.path.join(profile_dir, name) if profile_dir else None

    runtime_env = {
        "CODEMODE_RUNTIME_POOL_SIZE": str(pool_size),
        "CODEMODE_RUNTIME_TYPESCRIPT_POOL_SIZE": str(TS_POOL_SIZE),
    }
    async with service("-m", "benchmarks._baseline_server", ready_prefix="port ") as base:
        # Entered once the baseline server runs: only the runtime starts inside the cgroup.
        with cgroup_meter("codemode-bench-run-code") as meter:
            async with (
                _metered_runtime(meter, runtime_env, profile("runtime.prof")) as runtime,
                _registries(runtime, profile("registry.prof")) as registries,
            ):
                yield base, runtime, *registries


@contextlib.asynccontextmanager
async def _metered_runtime(
    meter: CgroupMeter | None, env: dict[str, str], profile_to: str | None
) -> AsyncIterator[Service]:
    """The runtime, started from inside `meter`'s cgroup (it, its fork server, every run's
    processes and the pool refills are counted there), this process moving back out at once."""
    async with service(
        "-m", "runtime_service", "--listen", "127.0.0.1:0",
        ready_prefix="runtime listening on port ", env=env, profile_to=profile_to,
    ) as runtime:  # fmt: skip
        if meter is not None:
            meter.leave()
        runtime.meter = meter
        yield runtime


@contextlib.asynccontextmanager
async def _registries(
    runtime: Service, profile_to: str | None
) -> AsyncIterator[tuple[Service, Service]]:
    """Two registries wired to `runtime`; the second one's deployment language is TypeScript."""
    registry_env = {
        "CODEMODE_REGISTRY_DEFAULT_MODE": "code",
        "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps([runtime.address]),
        "CODEMODE_REGISTRY_HISTORY_PATH": ":memory:",
        "CODEMODE_REGISTRY_MAX_PARALLEL_SUB_CALLS": "16",
        # P4/P5 run 50 and 200 programs of one agent at once: no admission run limits.
        "CODEMODE_REGISTRY_LIMITS": json.dumps({"max_concurrent_runs": None}),
        "CODEMODE_REGISTRY_AGENT_LIMITS": json.dumps({"max_concurrent_runs": None}),
        "CODEMODE_REGISTRY_PLUGINS": json.dumps(["benchmarks._run_code_tools:install"]),
        "CODEMODE_REGISTRY_RUNTIME_LANGUAGES": json.dumps(["python", "typescript"]),
    }
    ts_env = {**registry_env, "CODEMODE_REGISTRY_CODE_LANGUAGE": "typescript"}
    async with (
        service(
            "-m", "registry_service", "--listen", "127.0.0.1:0",
            ready_prefix="registry listening on port ",
            env=registry_env, profile_to=profile_to,
        ) as registry,
        service(
            "-m", "registry_service", "--listen", "127.0.0.1:0",
            ready_prefix="registry listening on port ", env=ts_env,
        ) as ts_registry,
    ):  # fmt: skip
        yield registry, ts_registry


async def run(quick: bool, pool_size: int, profile: bool) -> dict[str, Any]:
    rounds = 8 if quick else 60  # --quick stays under a minute with both languages
    p3_rounds = 5 if quick else 15
    baseline_count = 300 if quick else 2000
    p4_sequential, p4_gathers = (50, 5) if quick else (100, 10)
    profile_dir = tempfile.mkdtemp(prefix="bench-run-code-") if profile else None
    result: dict[str, Any] = {"benchmark": "run_code", "quick": quick, "profiled": profile}
    load_start = os.getloadavg()[0]
    workers = pool_size + TS_POOL_SIZE  # idle in both pools
    async with stack(pool_size, profile_dir) as (base, runtime, registry, ts_registry):
        runtime_meter = runtime.meter
        await wait_for_pool(runtime, workers)
        async with (
            grpc.aio.insecure_channel(registry.address) as channel,
            grpc.aio.insecure_channel(ts_registry.address) as ts_channel,
            grpc.aio.insecure_channel(base.address) as base_channel,
            grpc.aio.insecure_channel(runtime.address) as runtime_channel,
        ):
            client = Client(channel)
            ts_client = Client(ts_channel)  # TypeScript programs, otherwise the same path

            async def settle() -> None:
                await wait_for_pool(runtime, workers)

            runtime_stub = runtime_pb2_grpc.RuntimeServiceStub(runtime_channel)
            echo = base_channel.unary_unary("/bench.Baseline/Echo")
            ping_pong = base_channel.stream_stream("/bench.Baseline/PingPong")()
            payload = json.dumps({"code": ZERO, "description": "benchmark program"}).encode()

            async def unary() -> None:
                await echo(payload)

            async def bidi() -> None:
                await ping_pong.write(payload)
                await ping_pong.read()

            # Same-run baselines, measured while the stack is idle.
            unary_samples = await timed(unary, baseline_count)
            bidi_samples = await timed(bidi, baseline_count)
            ping_pong.cancel()
            pipe_samples = await pipe_round_trips(baseline_count)

            # Warm-up: connections, imports and code paths on both services.
            for _ in range(2 if quick else 5):
                await client.run(ZERO)
                await client.run(SEQUENTIAL)
                await client.run(SLEEP_ONE)
                await direct_run(runtime_stub, ZERO)
                await direct_run(runtime_stub, SEQUENTIAL)
                await ts_client.run(TS_ZERO)
                await ts_client.run(TS_SEQUENTIAL)
                await direct_run(runtime_stub, TS_ZERO, "typescript")
                await direct_run(runtime_stub, TS_SEQUENTIAL, "typescript")
            await settle()

            async def unary_after_idle() -> float:
                started = time.perf_counter()
                await echo(payload)
                return time.perf_counter() - started

            (
                zero,
                seq,
                quiet_zero,
                quiet_seq,
                direct_zero,
                direct_seq,
                unary_idle,
                ts_zero,
                ts_seq,
                ts_direct_zero,
                ts_direct_seq,
            ) = await samples_of(
                [
                    lambda: client.run(ZERO),
                    lambda: client.run(SEQUENTIAL),
                    lambda: client.run(ZERO, quiet=True),
                    lambda: client.run(SEQUENTIAL, quiet=True),
                    lambda: direct_run(runtime_stub, ZERO),
                    lambda: direct_run(runtime_stub, SEQUENTIAL),
                    unary_after_idle,
                    lambda: ts_client.run(TS_ZERO),
                    lambda: ts_client.run(TS_SEQUENTIAL),
                    lambda: direct_run(runtime_stub, TS_ZERO, "typescript"),
                    lambda: direct_run(runtime_stub, TS_SEQUENTIAL, "typescript"),
                ],
                rounds,
                settle,
            )
            agent = await client.create_agent("bench-history")
            zero_agent, seq_agent = await samples_of(
                [lambda: client.run(ZERO, agent), lambda: client.run(SEQUENTIAL, agent)],
                rounds,
                settle,
            )
            one, ten = await samples_of(
                [lambda: client.run(SLEEP_ONE), lambda: client.run(SLEEP_TEN)], p3_rounds, settle
            )

            # CPU over every process: a 0-call run, and a 1 MB value echoed by a nested call
            # (less the same program that only builds the value).
            fixed_runs, echo_runs = (40, 5) if quick else (100, 20)
            await settle()
            fixed = await cpu_per_run(client, registry, runtime, ZERO, fixed_runs, settle=settle)
            # The stdlib baseline is sampled between these runs, under the load they see (on a
            # shared host one sample taken apart swung 35-61 ms), its CPU kept out of theirs.
            round_trips: list[float] = []

            def json_sample() -> None:
                round_trips.append(json_round_trip_cpu_s(ECHO_VALUE, repeats=1))

            built = await cpu_per_run(
                client,
                registry,
                runtime,
                ECHO_BUILD,
                echo_runs,
                settle=settle,
                between=json_sample,
            )
            echoed = await cpu_per_run(
                client,
                registry,
                runtime,
                ECHO_1MB,
                echo_runs,
                settle=settle,
                between=json_sample,
            )

            # P4: throughput, 50 concurrent programs, a few rounds from a settled stack.
            p4_code = p4_program(p4_sequential, p4_gathers)
            p4_rounds, p4_unbatched, p4_quiet = [], [], []
            for _ in range(1 if quick else 3):  # alternating: drift hits all alike
                await settle()
                p4_rounds.append(
                    await throughput_round(client, registry, runtime, p4_code, settle, batch=True)
                )
                await settle()
                p4_unbatched.append(
                    await throughput_round(client, registry, runtime, p4_code, settle)
                )
                await settle()
                p4_quiet.append(
                    await throughput_round(client, registry, runtime, p4_code, settle, quiet=True)
                )

            # P5: 200 concurrent programs x 10 nested calls, with history.
            await settle()
            p5_agent = await client.create_agent("bench-p5")
            started = time.perf_counter()
            outcomes = await asyncio.gather(
                *(client.outcome(P5_PROGRAM, p5_agent) for _ in range(P5_PROGRAMS)),
                return_exceptions=True,
            )
            p5_wall = time.perf_counter() - started
            p5_history = await client.count_history(p5_agent)

    # The machine may be shared: other load skews every figure.
    result["machine"] = {
        "cpus": os.cpu_count(),
        "load_avg_1m_start": round(load_start, 2),
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
    }
    un, bi, pipe = summary_ms(unary_samples), summary_ms(bidi_samples), summary_ms(pipe_samples)
    result["baseline"] = {"unary_echo": un, "bidi_ping_pong": bi, "pipe_round_trip": pipe}

    # P1
    p1 = summary_ms(zero)
    p1_ratio = p1["p50_ms"] / un["p50_ms"]
    result["P1_zero_nested_calls"] = {
        "run_code": p1,
        "baseline_unary_p50_ms": un["p50_ms"],
        "ratio_p50_vs_unary": round(p1_ratio, 3),
        "baseline_unary_after_same_idle": summary_ms(unary_idle),
        "ratio_p50_vs_unary_after_same_idle": round(
            p1["p50_ms"] / (statistics.median(unary_idle) * 1e3), 3
        ),
        "runtime_direct_run": summary_ms(direct_zero),
        "registry_share_p50_ms": round(p1["p50_ms"] - statistics.median(direct_zero) * 1e3, 4),
        "with_agent_history": summary_ms(zero_agent),
        "result_only": summary_ms(quiet_zero),
        "target": "p50 <= 3 ms and <= 5 x unary p50 (the back-to-back unary baseline)",
        "meets_target": p1["p50_ms"] <= 3.0 and p1_ratio <= 5.0,
    }

    # P2
    def per_call(n_samples: list[float], zero_samples: list[float]) -> float:
        return (statistics.median(n_samples) - statistics.median(zero_samples)) / SEQUENTIAL_N

    overhead = per_call(seq, zero)
    budget = statistics.median(pipe_samples) + statistics.median(bidi_samples)
    result["P2_per_nested_call"] = {
        "per_call_overhead_ms": _ms(overhead),
        "run_0_calls": p1,
        f"run_{SEQUENTIAL_N}_calls": summary_ms(seq),
        "baseline_pipe_plus_bidi_p50_ms": _ms(budget),
        "ratio_vs_pipe_plus_bidi": round(overhead / budget, 3),
        "baseline_bidi_p50_ms": bi["p50_ms"],
        "ratio_p50_vs_bidi": round(overhead * 1e3 / bi["p50_ms"], 3),
        "runtime_direct_per_call_ms": _ms(per_call(direct_seq, direct_zero)),
        "with_agent_history_per_call_ms": _ms(per_call(seq_agent, zero_agent)),
        "result_only_per_call_ms": _ms(per_call(quiet_seq, quiet_zero)),
        "target": "per-call overhead <= 1.5 x (pipe p50 + bidi p50), no agent (no history)",
        "meets_target": overhead <= 1.5 * budget,
    }

    # Fixed CPU of a run, the 1 MB echo
    services = fixed["registry"] + fixed["runtime"] + fixed["client"]
    result["run_fixed_cpu_ms_services"] = _ms(services)
    result["run_fixed_cpu"] = {
        "ms_per_run": {k: _ms(v) for k, v in fixed.items()},
        "ms_all_processes": _ms(sum(fixed.values())),
        "runs": fixed_runs,
        "target": f"registry + runtime + client <= {RUN_FIXED_CPU_TARGET_MS} ms per 0-call run",
        "meets_target": services * 1e3 <= RUN_FIXED_CPU_TARGET_MS,
    }
    echo_cpu = {k: echoed[k] - built[k] for k in echoed}
    json_round_trip = statistics.median(round_trips)
    ratio = sum(echo_cpu.values()) / json_round_trip
    result["echo_1mb_cpu_ratio"] = round(ratio, 2)
    result["echo_1mb"] = {
        "value_bytes": len(json.dumps(ECHO_VALUE, separators=(",", ":"))),
        "cpu_ms_per_echo": {k: _ms(v) for k, v in echo_cpu.items()},
        "cpu_share": _shares(echo_cpu),
        "cpu_ms_all_processes": _ms(sum(echo_cpu.values())),
        "baseline_stdlib_json_round_trip_ms": _ms(json_round_trip),
        "baseline_samples": len(round_trips),
        "worker_channel_cpu_ms": worker_channel_cpu_ms(ECHO_VALUE),
        "runs": echo_runs,
        "target": f"all processes' CPU <= {ECHO_CPU_RATIO_TARGET} x a stdlib json round trip",
        "meets_target": ratio <= ECHO_CPU_RATIO_TARGET,
    }

    # P3
    one_p50, ten_p50 = statistics.median(one), statistics.median(ten)
    result["P3_gather_10_x_100ms"] = {
        "ten_under_gather": summary_ms(ten),
        "one_call": summary_ms(one),
        "ratio_p50": round(ten_p50 / one_p50, 3),
        "target": "10 gathered 100 ms calls <= 1.2 x one call",
        "meets_target": ten_p50 <= 1.2 * one_p50,
    }

    # P4
    calls_per_program = p4_sequential + 10 * p4_gathers
    p4_calls = P4_PROGRAMS * calls_per_program
    rates = [p4_calls / r.wall_s for r in p4_rounds]
    rate = statistics.median(rates)
    unbatched_rates = [p4_calls / r.wall_s for r in p4_unbatched]
    quiet_rates = [p4_calls / r.wall_s for r in p4_quiet]
    quiet_rate = statistics.median(quiet_rates)
    p4_cpu = {k: sum(r.cpu[k] for r in p4_rounds) for k in p4_rounds[0].cpu}
    all_calls = p4_calls * len(p4_rounds)
    result["P4_throughput"] = {
        "nested_calls_per_s": round(rate),
        "rounds_per_s": [round(r) for r in rates],
        "programs": P4_PROGRAMS,
        "calls_per_program": calls_per_program,
        "nested_call_cpu_us": _us(sum(p4_cpu.values()) / all_calls),
        "nested_call_cpu_target_us": NESTED_CALL_CPU_TARGET_US,
        "meets_nested_call_cpu_target": sum(p4_cpu.values()) / all_calls * 1e6
        <= NESTED_CALL_CPU_TARGET_US,
        "cpu_us_per_nested_call": {k: _us(v / all_calls) for k, v in p4_cpu.items()},
        "cpu_share": _shares(p4_cpu),
        "cpu_accounting": _accounting(runtime_meter),
        "cpu_busy_share": round(
            sum(p4_cpu.values()) / (sum(r.wall_s for r in p4_rounds) * (os.cpu_count() or 1)), 3
        ),
        "outer_stream_events_per_nested_call": round(
            sum(r.events for r in p4_rounds) / all_calls, 2
        ),
        "outer_stream_messages_per_nested_call": round(
            sum(r.messages for r in p4_rounds) / all_calls, 2
        ),
        "unbatched_nested_calls_per_s": round(statistics.median(unbatched_rates)),
        "unbatched_rounds_per_s": [round(r) for r in unbatched_rates],
        "cpus": os.cpu_count(),
        "result_only_nested_calls_per_s": round(quiet_rate),
        "result_only_rounds_per_s": [round(r) for r in quiet_rates],
        "target": ">= 2500 nested calls/s (median of the rounds), every progress event "
        "delivered as the clients ask for them (batch_progress)",
        "meets_target": rate >= 2500,
        "meets_target_result_only": quiet_rate >= 2500,
    }

    # P5
    failures = [o for o in outcomes if not isinstance(o, Outcome) or not o.ok]
    expected = P5_PROGRAMS * P5_CALLS
    result["P5_no_lost_calls"] = {
        "programs": P5_PROGRAMS,
        "calls_per_program": P5_CALLS,
        "successful_programs": P5_PROGRAMS - len(failures),
        "first_failure": str(failures[0]) if failures else "",
        "settle_records": p5_history.get(SETTLE, 0),
        "start_records": p5_history.get(SETTLE_START, 0),
        "distinct_settled_call_ids": p5_history["distinct_settled_call_ids"],
        "outer_results": p5_history.get("tool/result", 0),
        "wall_s": round(p5_wall, 3),
        "target": f"all {P5_PROGRAMS} succeed; {expected} settle records",
        "meets_target": not failures
        and p5_history.get(SETTLE, 0) == expected
        and p5_history["distinct_settled_call_ids"] == expected,
    }

    result["P1_ratio_to_unary"] = result["P1_zero_nested_calls"]["ratio_p50_vs_unary"]
    result["P2_ratio_to_bidi"] = result["P2_per_nested_call"]["ratio_p50_vs_bidi"]
    result["nested_call_cpu_us"] = result["P4_throughput"]["nested_call_cpu_us"]
    result["meets_all_targets"] = all(
        v["meets_target"]
        for k, v in result.items()
        if isinstance(v, dict) and "meets_target" in v and k != "languages"
    )
    result["languages"] = _languages(
        {
            "python": (zero, seq, direct_zero, direct_seq),
            "typescript": (ts_zero, ts_seq, ts_direct_zero, ts_direct_seq),
        }
    )
    result["notes"] = _notes(result, p4_cpu, all_calls)
    if profile_dir:
        result["profile"] = _profiles(profile_dir)
        for name, prof in result["profile"].items():
            top = ", ".join(
                f"{row['function']} {round(row['share_of_busy'] * 100)}%"
                for row in prof["top_own_time"][:4]
            )
            result["notes"].append(f"profile {name} (busy {prof['busy_s']} s): {top}")
    return result


def _languages(samples: dict[str, tuple[list[float], ...]]) -> dict[str, Any]:
    """P1 and the per-nested-call overhead of each language (samples interleaved in one run:
    run_code 0 calls, 100 calls, then the same Runs straight on the runtime), and TypeScript's
    ratios to Python's against the per-language targets."""
    out: dict[str, Any] = {}
    for language, (zero, seq, direct_zero, direct_seq) in samples.items():
        per_call = (statistics.median(seq) - statistics.median(zero)) / SEQUENTIAL_N
        direct = (statistics.median(direct_seq) - statistics.median(direct_zero)) / SEQUENTIAL_N
        out[language] = {
            "P1_run_code": summary_ms(zero),
            f"run_{SEQUENTIAL_N}_calls": summary_ms(seq),
            "per_nested_call_ms": _ms(per_call),
            "runtime_direct_run": summary_ms(direct_zero),
            "runtime_direct_per_call_ms": _ms(direct),
        }
    python, typescript = out["python"], out["typescript"]
    p1_ratio = typescript["P1_run_code"]["p50_ms"] / python["P1_run_code"]["p50_ms"]
    call_ratio = typescript["per_nested_call_ms"] / python["per_nested_call_ms"]
    out["typescript_vs_python"] = {
        "P1_p50_ratio": round(p1_ratio, 3),
        "per_nested_call_ratio": round(call_ratio, 3),
        "target": {"P1_p50_ratio_max": 2.0, "per_nested_call_ratio_max": 1.2},
        "meets_target": p1_ratio <= 2.0 and call_ratio <= 1.2,
    }
    return out


def _profiles(profile_dir: str) -> dict[str, Any]:
    paths = {name: os.path.join(profile_dir, f"{name}.prof") for name in ("registry", "runtime")}
    return {name: profile_top(path) for name, path in paths.items() if os.path.exists(path)}


async def cpu_per_run(
    client: Client,
    registry: Service,
    runtime: Service,
    code: str,
    count: int,
    *,
    settle: Callable[[], Awaitable[None]],
    between: Callable[[], None] | None = None,
) -> dict[str, float]:
    """CPU seconds per run by process, `count` runs of `code` one after another; `between`
    runs after each (a same-run baseline's sample), its CPU not counted as the client's."""
    workers_before = runtime.children_cpu()
    start = CpuMark.read(registry, runtime)
    apart = 0.0
    for _ in range(count):
        await client.run(code)
        if between is not None:
            started = time.process_time()
            between()
            apart += time.process_time() - started
    end = CpuMark.read(registry, runtime)
    await settle()
    cpu = cpu_between(start, end, CpuMark.read(registry, runtime), runtime, workers_before)
    cpu["client"] -= apart
    return {k: v / count for k, v in cpu.items()}


def worker_channel_cpu_ms(value: Any, repeats: int = 7) -> dict[str, dict[str, float]]:
    """This process's CPU (median ms) for the worker-channel work of one echo of `value`, by
    hop, with its frames spelled plain (the text escaped inside the JSON frame) and raw (beside
    it): the worker's call, the runtime reading it, the runtime's reply, the worker reading it
    -- the same functions the processes run, so the saving is told apart from the noise of
    the all-process figures."""
    from runtime_service import frame_decoding
    from runtime_service import run as runs
    from runtime_service.outcome import BindingResult
    from runtime_service.worker import flatwire, framing

    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    def call(raw: str | None) -> bytes:
        tokens = flatwire.encode(value)
        return framing.pack({"t": "call", "id": 1, "name": "noop", "args": tokens}, raw)

    def reply(raw: str | None) -> bytes:
        tokens = runs._reply_tokens(BindingResult.success_json(text))
        return framing.pack({"t": "reply", "id": 1, "ok": True, "value": tokens}, raw)

    def read_reply(payload: bytes) -> object:
        message, _ = framing.unpack(payload, json.loads)
        return flatwire.decode(message["value"])  # type: ignore[index]

    def cpu(fn: Callable[[], object]) -> float:
        samples = []
        for _ in range(repeats):
            started = time.process_time()
            fn()
            samples.append(time.process_time() - started)
        return round(statistics.median(samples) * 1e3, 2)

    def hops(call_field: str | None, reply_field: str | None) -> dict[str, float]:
        sent, answered = call(call_field)[4:], reply(reply_field)[4:]
        figures = {
            "worker_call": cpu(partial(call, call_field)),
            "runtime_reads_call": cpu(partial(frame_decoding.decode_frame, sent, 1 << 30)),
            "runtime_reply": cpu(partial(reply, reply_field)),
            "worker_reads_reply": cpu(partial(read_reply, answered)),
        }
        figures["sum"] = round(sum(figures.values()), 2)
        return figures

    # Alternated, the lower of two rounds each: the first round also pays for warming up.
    rounds = [(hops(None, None), hops("args", "value")) for _ in range(2)]
    plain, raw = (
        {hop: min(figures[hop] for figures in side) for hop in side[0]}
        for side in zip(*rounds, strict=True)
    )
    for side in (plain, raw):
        side["sum"] = round(sum(ms for hop, ms in side.items() if hop != "sum"), 2)
    return {"plain": plain, "raw": raw}


def json_round_trip_cpu_s(value: Any, repeats: int = 9) -> float:
    """This process's CPU for stdlib `json.loads(json.dumps(value))`, the median of `repeats`."""
    samples = []
    for _ in range(repeats):
        started = time.process_time()
        json.loads(json.dumps(value))
        samples.append(time.process_time() - started)
    return statistics.median(samples)


def _shares(cpu: dict[str, float]) -> dict[str, float]:
    total = sum(cpu.values()) or 1.0
    return {k: round(v / total, 3) for k, v in cpu.items()}


def _accounting(meter: CgroupMeter | None) -> str:
    if meter is None:
        return "no cgroup: workers from /proc, a lower bound (fork server, inits, refills missed)"
    return (
        "registry, runtime: /proc of each; workers: the runtime's cgroup less the runtime "
        "(fork server, every run's init and worker, pool refills; exact); client: this process"
    )


def _workers_lower_bound(runtime: Service, workers_before: dict[int, float]) -> float:
    """Without a cgroup: the /proc CPU of the workers that were idle in the pool before and
    are gone now (their whole lives, boot included). It misses the processes of a run that
    are not a worker (a run's init) and whatever a reaper does not sum, so it is a lower
    bound (about a tenth of the cgroup's figure here)."""
    workers_now = runtime.children_cpu()
    return sum(cpu for pid, cpu in workers_before.items() if pid not in workers_now)


def _notes(result: dict[str, Any], cpu: dict[str, float], calls: int) -> list[str]:
    """What dominates, for each missed target, from this run's own decomposition."""
    notes = []
    p1, p2 = result["P1_zero_nested_calls"], result["P2_per_nested_call"]
    if not p1["meets_target"]:
        notes.append(
            f"P1: of the {p1['run_code']['p50_ms']} ms p50, a Run straight on the runtime "
            f"(same pool) takes {p1['runtime_direct_run']['p50_ms']} ms; the registry hop adds "
            f"{p1['registry_share_p50_ms']} ms (a bare unary round trip: "
            f"{p1['baseline_unary_p50_ms']} ms)"
        )
    if not p2["meets_target"]:
        direct = p2["runtime_direct_per_call_ms"]
        notes.append(
            f"P2: {p2['per_call_overhead_ms']} ms per nested call: runtime + worker (answered "
            f"by a bare client) {direct} ms, the registry "
            f"{round(p2['per_call_overhead_ms'] - direct, 4)} ms; with an agent (history "
            f"records) {p2['with_agent_history_per_call_ms']} ms"
        )
    p4 = result["P4_throughput"]
    if not p4["meets_target"]:
        total = sum(cpu.values())
        notes.append(
            f"P4: {_us(total / calls)} us CPU per nested call over all processes, the "
            f"{p4['cpus']} CPUs {round(p4['cpu_busy_share'] * 100)}% busy: "
            + ", ".join(f"{k} {round(v / total * 100)}%" for k, v in cpu.items())
            + f"; the outer stream carries {p4['outer_stream_events_per_nested_call']} "
            f"progress events per nested call in {p4['outer_stream_messages_per_nested_call']} "
            "messages"
        )
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (< 1 minute)")
    parser.add_argument("--pool-size", type=int, default=56, help="runtime worker pool size")
    parser.add_argument("--profile", action="store_true", help="cProfile registry and runtime")
    args = parser.parse_args()
    emit(asyncio.run(run(args.quick, args.pool_size, args.profile)))


if __name__ == "__main__":
    main()
