"""What a run's output costs the registry is bounded by the run's output budget.

The registry and the runtime run as their own processes (``python -m registry_service``,
``python -m runtime_service``), so the registry's peak RSS (``VmHWM``) is its own, not this test
client's nor the runtime's. A `run_code` program floods its 1 MiB budget with one-byte log lines
(the most lines a budget holds: each costs the runtime's ledger ``LOG_LINE_OVERHEAD`` besides
its text). The registry holds every line once as a string, in the logs of the outer result, and
once in the result's value, text and message; with progress events each line also goes out as
a `log` event, queued for the caller's stream until flow control lets it out: a slow caller
(a loaded machine) leaves more of them queued, each a few times the 32 bytes the line cost the
ledger. All of that is O(the budget): measured, a flood's peak is 0.2-1.3 MiB over the RSS
before it (a record of each run stays in the history store, about 0.15 MiB for these), and
2.0 MiB once at load, with the caller behind; the bound is 4x the budget.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from codemode_cli.processes import running
from codemode_client import RegistryClient
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from tests.runtime.test_output_accounting import peak_rss, reset_peak_rss

BUDGET = 1 << 20
NONE = rpb.PROGRESS_EVENTS_NONE
FLOOD = "while True:\n    print('x', end='')"
WARM_UP = "for i in range(100):\n    print('x', end='')\nreturn {'n': 1}"


@pytest.fixture
async def registry_process() -> AsyncIterator[tuple[int, rpb_grpc.RegistryServiceStub]]:
    runtime_env = {
        **os.environ,
        "CODEMODE_RUNTIME_POOL_SIZE": "1",
        "CODEMODE_RUNTIME_TRACE_FILE": "off",
        # The run's budget is the smaller of this and what the registry's message limit carries.
        "CODEMODE_RUNTIME_MAX_OUTPUT_BYTES": str(BUDGET),
        "CODEMODE_RUNTIME_DEFAULT_MAX_OUTPUT_BYTES": str(BUDGET),
    }
    async with running(
        "-m", "runtime_service", "--listen", "127.0.0.1:0",
        ready="runtime listening on port", env=runtime_env,
    ) as runtime:  # fmt: skip
        registry_env = {
            **os.environ,
            "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps([f"127.0.0.1:{runtime.rest}"]),
            "CODEMODE_REGISTRY_HISTORY_PATH": ":memory:",
            "CODEMODE_REGISTRY_TRACE_FILE": "off",
        }
        async with running(
            "-m", "registry_service", "--listen", "127.0.0.1:0",
            ready="registry listening on port", env=registry_env,
        ) as registry:  # fmt: skip
            address = f"127.0.0.1:{registry.rest}"
            async with RegistryClient(address) as client:
                await client.create_agent("coder", mode="code")
            async with grpc.aio.insecure_channel(
                address, options=[("grpc.max_receive_message_length", 64 << 20)]
            ) as channel:
                yield registry.proc.pid, rpb_grpc.RegistryServiceStub(channel)


async def flood(
    stub: rpb_grpc.RegistryServiceStub, call_id: str, events: int, code: str = FLOOD
) -> tuple[int, Any]:
    """One flood run through `ExecuteToolCall`; the `log` events received and the result."""
    request = rpb.ExecuteToolCallRequest(
        agent="agents/coder",
        call_id=call_id,
        tool_name="run_code",
        arguments_json=jsonvalue.dumps({"code": code, "description": "flood"}),
        progress_events=events,  # type: ignore[arg-type]
        share_logs=True,
    )
    logs = 0
    result = None
    async for message in stub.ExecuteToolCall(request):
        kind = message.WhichOneof("event")
        if kind == "log":
            logs += 1
        elif kind == "result":
            result = message.result
    assert result is not None
    return logs, result


async def test_a_flood_of_tiny_log_lines_costs_the_registry_o_of_its_budget(
    registry_process: tuple[int, rpb_grpc.RegistryServiceStub],
) -> None:
    pid, stub = registry_process
    # Warm-up on a small output (its code paths allocate once). Not a flood: heap a flood frees
    # stays in the process, and a later flood would reuse it unseen.
    await flood(stub, "warm-up", rpb.PROGRESS_EVENTS_UNSPECIFIED, WARM_UP)
    growth: dict[str, list[int]] = {}
    for name, events in (("log events", rpb.PROGRESS_EVENTS_UNSPECIFIED), ("no events", NONE)):
        for n in range(2):
            before = reset_peak_rss(pid)
            logs, result = await flood(stub, f"{name}-{n}", events)
            growth.setdefault(name, []).append(peak_rss(pid) - before)
            assert result.is_error and result.error.code == "CODE_RUN_FAILED", result.error
            assert result.error.message == (
                f"code run failed (output-limit): outer output exceeded {BUDGET} bytes"
            )
            # The logs kept fill the budget (a line costs the ledger 32 bytes besides '"x",').
            (kept,) = result.shared_logs
            lines = kept.count("\n") + 1
            assert set(kept.split("\n")) == {"x"}
            assert lines > BUDGET // 40
            # (A line streamed may be one the budget then had no room to keep.)
            assert logs == 0 if events == NONE else logs >= lines
    kib = {name: [g >> 10 for g in runs] for name, runs in growth.items()}
    print(f"registry peak RSS growth per flood (KiB): {kib}")
    worst = max(max(runs) for runs in growth.values())
    assert worst <= 4 * BUDGET, f"peak RSS grew by {worst >> 10} KiB"
