"""Approval round trip: a tool call that asks for approval, answered at once by an approver
that always allows, from the call's start to its result.

Three setups in one run, rounds alternating so drift hits all alike:
- `memory` (the same-run baseline): one registry, approvals in its memory, the approver on it;
- `store_same_replica`: two registries on one PostgreSQL with approvals in the store, the call
  and the approver on the same one (what the store adds: a record written and answered);
- `store_cross_replica`: the call on A, the approver on B (the request reaches B by NOTIFY, the
  answer reaches A the same way).

The registries run in this process on a throwaway loopback cluster (`scripts/postgres`); the
target is that an approval answered on another replica costs a person nothing they notice:
p50 under 100 ms on loopback (the poll, `approval_poll_s`, only bounds a missed notification).

    python -m benchmarks.approvals [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc

from benchmarks._support import emit, sequential, summary_ms
from benchmarks.scale_out import postgres
from codemode_client import Approver
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from registry_service.config import RegistrySettings
from registry_service.domain.policy import Ask, PreDecision
from registry_service.server import RunningRegistry, start

TARGET_CROSS_P50_MS = 100.0


@contextlib.asynccontextmanager
async def registry(**settings: Any) -> AsyncIterator[tuple[RunningRegistry, grpc.aio.Channel]]:
    running = await start(RegistrySettings(listen="127.0.0.1:0", trace_file="off", **settings))

    async def ask(e: Any, d: PreDecision) -> PreDecision:
        return Ask("benchmark") if e.name == "write" else d

    running.registry.catalog.hooks("").pre_execute.append(ask)

    async def write(_invocation: Any) -> Any:
        return "written"

    running.registry.register_tool("write", write)
    channel = grpc.aio.insecure_channel(running.address)
    try:
        yield running, channel
    finally:
        await channel.close()
        await running.stop(0)


async def call(channel: grpc.aio.Channel, n: list[int]) -> None:
    n[0] += 1
    request = rpb.ExecuteToolCallRequest(
        agent="agents/bench", call_id=f"c-{n[0]}", tool_name="write", arguments_json="{}"
    )
    responses = [r async for r in rpb_grpc.RegistryServiceStub(channel).ExecuteToolCall(request)]
    assert responses and not responses[-1].result.is_error, responses[-1:]


def allow(_request: rpb.ApprovalRequest) -> bool:
    return True


async def run(quick: bool) -> dict[str, Any]:
    count, rounds = (30, 2) if quick else (100, 5)
    samples: dict[str, list[float]] = {
        "memory": [],
        "store_same_replica": [],
        "store_cross_replica": [],
    }
    with postgres() as pg:
        shared = {"history_store": "postgres", "history_dsn": pg.dsn}
        async with (
            registry(history_path=":memory:") as (_, memory),
            registry(**shared) as (_, a),
            registry(**shared) as (_, b),
        ):
            for channel in (memory, a):
                stub = rpb_grpc.RegistryServiceStub(channel)
                await stub.CreateAgent(rpb.CreateAgentRequest(agent_id="bench"))
            n = [0]
            for _ in range(rounds):
                for setup, caller, answerer in (
                    ("memory", memory, memory),
                    ("store_same_replica", a, a),
                    ("store_cross_replica", a, b),
                ):
                    async with Approver(answerer, f"{setup}-approver", allow):
                        await call(caller, n)  # warm: the stream is open and seen
                        samples[setup] += await sequential(
                            functools.partial(call, caller, n), count
                        )
    figures = {setup: summary_ms(values) for setup, values in samples.items()}
    cross = figures["store_cross_replica"]["p50_ms"]
    return {
        "benchmark": "approvals",
        "quick": quick,
        "load_average": os.getloadavg(),
        "round_trip": figures,
        "baseline": "memory",
        "store_over_memory_p50_ms": round(
            figures["store_same_replica"]["p50_ms"] - figures["memory"]["p50_ms"], 3
        ),
        "target": {"store_cross_replica_p50_ms_under": TARGET_CROSS_P50_MS},
        "target_met": cross < TARGET_CROSS_P50_MS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    args = parser.parse_args()
    emit(asyncio.run(run(args.quick)))


if __name__ == "__main__":
    main()
