"""Model-direct tool call latency through the registry to a provider in another process.

Topology (four processes besides this client): registry, a provider serving `echo` over its
Connect stream, and a bare gRPC server for the same-run baselines (unary echo, bidi ping-pong)
with its relay provider. Target: call p50 <= 1.6 x (unary round trip p50 + bidi round trip p50).

Reference, not part of the target: the same message pattern on bare grpc.aio (a server stream
relayed as one message over a provider's bidi stream and back, no registry logic): what the
transport alone costs here. The registry's p50 over it is what the registry and its provider
client add.

The call is measured twice: with every progress event (the default: a `started` message, then
the result) and with `progress_events=NONE` (the result only: one response message, like the
unary baseline it is compared with).

    python -m benchmarks.registry_call [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from benchmarks._support import emit, interleaved, subprocess_service, summary_ms
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc

ARGS = '{"path":"/tmp/example.txt","limit":10}'


async def _throughput(op: Callable[[], Awaitable[Any]], callers: int, per_caller: int) -> float:
    async def worker() -> None:
        for _ in range(per_caller):
            await op()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(callers)))
    return callers * per_caller / (time.perf_counter() - start)


async def run(quick: bool) -> dict[str, Any]:
    count, per_caller = (300, 20) if quick else (2000, 100)
    async with (
        subprocess_service(
            "-m",
            "registry_service",
            "--listen",
            "127.0.0.1:0",
            ready_prefix="registry listening on port ",
        ) as reg_port,
        subprocess_service("-m", "benchmarks._baseline_server", ready_prefix="port ") as base_port,
    ):
        registry_address = f"127.0.0.1:{reg_port}"
        async with (
            subprocess_service(
                "-m", "benchmarks._bench_provider", registry_address, ready_prefix="ready"
            ),
            subprocess_service(
                "-m", "benchmarks._baseline_server", "--provider", base_port, ready_prefix="ready"
            ),
        ):
            channel = grpc.aio.insecure_channel(registry_address)
            base = grpc.aio.insecure_channel(f"127.0.0.1:{base_port}")
            stub = rpb_grpc.RegistryServiceStub(channel)
            echo = base.unary_unary("/bench.Baseline/Echo")
            bidi = base.stream_stream("/bench.Baseline/PingPong")
            relay_call = base.unary_stream("/bench.Baseline/RelayCall")
            stream = bidi()
            calls = iter(range(10**9))

            async def call_with(progress: rpb.ProgressEvents.ValueType) -> None:
                request = rpb.ExecuteToolCallRequest(
                    call_id=f"c{next(calls)}",
                    tool_name="echo",
                    arguments_json=ARGS,
                    progress_events=progress,
                )
                async for event in stub.ExecuteToolCall(request):
                    if event.WhichOneof("event") == "result":
                        assert not event.result.is_error, event.result
                        return

            async def tool_call() -> None:
                await call_with(rpb.PROGRESS_EVENTS_ALL)

            async def result_only() -> None:
                await call_with(rpb.PROGRESS_EVENTS_NONE)

            async def unary() -> None:
                await echo(ARGS.encode())

            async def ping() -> None:
                await stream.write(ARGS.encode())
                await stream.read()

            async def relay() -> None:
                async for _ in relay_call(ARGS.encode()):
                    pass

            samples = await interleaved((tool_call, result_only, unary, ping, relay), count)
            call_samples, quiet_samples = samples[tool_call], samples[result_only]
            unary_samples, bidi_samples = samples[unary], samples[ping]
            relay_samples = samples[relay]
            call_tput = await _throughput(tool_call, 50, per_caller)
            quiet_tput = await _throughput(result_only, 50, per_caller)
            unary_tput = await _throughput(unary, 50, per_caller)
            stream.cancel()
            await channel.close()
            await base.close()
    call, un, bi = summary_ms(call_samples), summary_ms(unary_samples), summary_ms(bidi_samples)
    quiet, floor = summary_ms(quiet_samples), summary_ms(relay_samples)
    budget = un["p50_ms"] + bi["p50_ms"]
    return {
        "benchmark": "registry_call",
        "quick": quick,
        "tool_call_1_caller": call,
        "tool_call_50_callers_per_s": round(call_tput),
        "result_only_1_caller": quiet,
        "result_only_50_callers_per_s": round(quiet_tput),
        "baseline": {
            "unary_echo": un,
            "bidi_ping_pong": bi,
            "unary_echo_50_callers_per_s": round(unary_tput),
        },
        "reference_relay_1_caller": floor,
        "reference_relay_ratio_vs_unary_plus_bidi": round(floor["p50_ms"] / budget, 3),
        "registry_over_reference_relay_p50_ms": round(quiet["p50_ms"] - floor["p50_ms"], 4),
        "ratio_p50_vs_unary_plus_bidi": round(call["p50_ms"] / budget, 3),
        "result_only_ratio_p50_vs_unary_plus_bidi": round(quiet["p50_ms"] / budget, 3),
        "target": "tool_call p50 <= 1.6 x (unary p50 + bidi p50)",
        "meets_target_all_events": call["p50_ms"] <= 1.6 * budget,
        "meets_target_result_only": quiet["p50_ms"] <= 1.6 * budget,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (< 1 minute)")
    emit(asyncio.run(run(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
