"""Calls a crash leaves half-written are closed at the next start: a registry SIGKILLed while a
run_code call's nested call and a direct call block in a provider comes back with explicit
INTERRUPTED end records (a `tool/code-dispatch` for the nested call, then the outer
`tool/result`s), visible through ListHistory and WatchHistory, written exactly once (a second
restart adds none). Real registry, runtime and provider processes; the provider is this test.
On SQLite and on PostgreSQL: there, the killed registry's calls are closed once its writer
lease expired (a short one here), by the registry that started after it."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_client import ToolProvider
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from tests.cli._processes import listening_port, service_env, spawn

PROGRAM = """
await tools.quick({"n": 1})
await tools.block({"n": 2})
return "never"
"""
AGENTS = [{"id": "coder", "mode": "code"}, {"id": "direct"}]  # declared: back after a restart


def _start(module: str, tmp: Path, env: dict[str, str]) -> tuple[Any, str]:
    proc, lines = spawn(
        [env["PYTHON"], "-m", module, "--listen", "127.0.0.1:0"], env, tmp, tmp / f"{module}.err"
    )
    line = lines.expect(lambda text: " listening on port " in text, timeout=60)
    return proc, f"127.0.0.1:{listening_port(line)}"


def _stop(*procs: Any) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


async def _histories(address: str) -> dict[str, list[Any]]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rpb_grpc.RegistryServiceStub(channel)
        out: dict[str, list[Any]] = {}
        for agent in ("agents/coder", "agents/direct"):
            page = await stub.ListHistory(rpb.ListHistoryRequest(agent=agent, page_size=1000))
            listed = list(page.records)
            watched: list[Any] = []
            async for response in stub.WatchHistory(rpb.WatchHistoryRequest(agent=agent)):
                watched.append(response.record)
                if len(watched) == len(listed):
                    break
            assert watched == listed  # the watch replays exactly what the list shows
            out[agent] = listed
        return out


def _shape(records: list[Any]) -> list[tuple[str, str, str]]:
    return [(r.call_id, r.kind, r.error_code) for r in records]


async def _closed_histories(address: str) -> dict[str, list[Any]]:
    """The histories once both cut-off calls are closed (at once on SQLite; on PostgreSQL once
    the killed writer's lease expired), bounded."""
    deadline = time.monotonic() + 60
    while True:
        histories = await _histories(address)
        ends = [r for records in histories.values() for r in records if r.kind == "tool/result"]
        if len(ends) == 2 or time.monotonic() > deadline:
            return histories
        await asyncio.sleep(0.2)


@pytest.fixture(params=["sqlite", "postgres"])
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    return {
        "CODEMODE_REGISTRY_HISTORY_STORE": "postgres",
        "CODEMODE_REGISTRY_HISTORY_DSN": request.getfixturevalue("pg_database"),
        "CODEMODE_REGISTRY_HISTORY_WRITER_LEASE_S": "1",
    }


async def test_calls_cut_off_by_a_crash_are_closed_once_at_restart(
    tmp_path: Path, store_env: dict[str, str]
) -> None:
    env = {**service_env(tmp_path), "PYTHON": sys.executable, **store_env}
    env["CODEMODE_REGISTRY_AGENTS"] = json.dumps(AGENTS)
    runtime, runtime_address = _start("runtime_service", tmp_path, env)
    env["CODEMODE_REGISTRY_RUNTIME_TARGETS"] = f'["{runtime_address}"]'
    try:
        registry, address = _start("registry_service", tmp_path, env)
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = rpb_grpc.RegistryServiceStub(channel)
                provider = ToolProvider(channel, "tools")
                blocked: list[str] = []
                both_blocked = asyncio.Event()

                @provider.tool(description="Returns at once")
                async def quick(args: Any, ctx: Any) -> Any:
                    return {"n": args["n"]}

                @provider.tool(description="Never returns")
                async def block(args: Any, ctx: Any) -> Any:
                    blocked.append(ctx.call_id)
                    if len(blocked) == 2:
                        both_blocked.set()
                    await asyncio.Event().wait()

                async with provider:
                    requests = [
                        rpb.ExecuteToolCallRequest(
                            agent="agents/coder",
                            call_id="run-1",
                            tool_name="run_code",
                            arguments_json=jsonvalue.dumps({"code": PROGRAM, "description": "x"}),
                        ),
                        rpb.ExecuteToolCallRequest(
                            agent="agents/direct",
                            call_id="direct-1",
                            tool_name="block",
                            arguments_json='{"n": 3}',
                        ),
                    ]

                    async def execute(request: rpb.ExecuteToolCallRequest) -> None:
                        async for _ in stub.ExecuteToolCall(request, timeout=600):
                            pass

                    calls = [asyncio.create_task(execute(r)) for r in requests]
                    await asyncio.wait_for(both_blocked.wait(), 60)
                    registry.send_signal(signal.SIGKILL)  # mid-call: nothing graceful
                    registry.wait(10)
                    ended = await asyncio.wait_for(
                        asyncio.gather(*calls, return_exceptions=True), 60
                    )
                    assert all(isinstance(e, grpc.aio.AioRpcError) for e in ended), ended
        finally:
            _stop(registry)

        registry, address = _start("registry_service", tmp_path, env)
        try:
            first = await _closed_histories(address)
        finally:
            _stop(registry)
        registry, address = _start("registry_service", tmp_path, env)
        try:
            if store_env:  # past a few leases and sweeps: none may close a call again
                await asyncio.sleep(3)
            second = await _histories(address)
        finally:
            _stop(registry)
    finally:
        _stop(runtime)

    assert _shape(first["agents/coder"]) == [
        ("run-1", "tool/call", ""),
        ("run-1:code:1", "tool/code-dispatch-start", ""),
        ("run-1:code:1", "tool/code-dispatch", ""),
        ("run-1:code:2", "tool/code-dispatch-start", ""),
        ("run-1:code:2", "tool/code-dispatch", "INTERRUPTED"),
        ("run-1", "tool/result", "INTERRUPTED"),
    ]
    assert _shape(first["agents/direct"]) == [
        ("direct-1", "tool/call", ""),
        ("direct-1", "tool/result", "INTERRUPTED"),
    ]
    settle = first["agents/coder"][4]
    assert settle.is_error and (settle.root_call_id, settle.parent_call_id) == ("run-1", "run-1")
    assert jsonvalue.loads(settle.arguments_json) == {"n": 2} and settle.tool_name == "block"
    result = first["agents/coder"][5]
    assert result.is_error and "interrupted" in result.content[0].text.text
    assert second == first  # exactly once: the second restart finds nothing left open
