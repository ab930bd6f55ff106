"""History is durable before the outer result exists: a registry SIGKILLed right after a run
with nested calls comes back with every record of it (real registry, runtime and provider
processes; the provider is this test, over gRPC)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import grpc

from codemode_client import ToolFailed, ToolProvider
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2
from tests.cli._processes import listening_port, service_env, spawn

PROGRAM = """
total = 0
for n in (1, 2):
    total += (await tools.add({"a": total, "b": n}))["sum"]
try:
    await tools.add({"a": -1, "b": 0})
except ToolCallError as error:
    print("refused:", error)
return total
"""


def _start(module: str, tmp: Path, env: dict[str, str]) -> tuple[Any, str]:
    proc, lines = spawn(
        [env["PYTHON"], "-m", module, "--listen", "127.0.0.1:0"], env, tmp, tmp / f"{module}.err"
    )
    line = lines.expect(lambda text: " listening on port " in text, timeout=60)
    return proc, f"127.0.0.1:{listening_port(line)}"


async def test_a_killed_registry_keeps_every_record_of_a_finished_run(tmp_path: Path) -> None:
    env = {**service_env(tmp_path), "PYTHON": sys.executable}
    runtime, runtime_address = _start("runtime_service", tmp_path, env)
    env["CODEMODE_REGISTRY_RUNTIME_TARGETS"] = f'["{runtime_address}"]'
    registry, address = _start("registry_service", tmp_path, env)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = rpb_grpc.RegistryServiceStub(channel)
            provider = ToolProvider(channel, "math")

            @provider.tool(description="Adds two numbers")
            async def add(args: Any, ctx: Any) -> Any:
                if args["a"] < 0:
                    raise ToolFailed("negative input", "NEGATIVE")
                return {"sum": args["a"] + args["b"]}

            async with provider:
                mode = scope_pb2.PRESENTATION_MODE_CODE
                await stub.CreateAgent(
                    rpb.CreateAgentRequest(agent_id="coder", agent=scope_pb2.Agent(mode=mode))
                )
                request = rpb.ExecuteToolCallRequest(
                    agent="agents/coder",
                    call_id="run-1",
                    tool_name="run_code",
                    arguments_json=jsonvalue.dumps({"code": PROGRAM, "description": "sums"}),
                    progress_events=rpb.PROGRESS_EVENTS_NONE,
                )
                [response] = [r async for r in stub.ExecuteToolCall(request)]
                assert not response.result.is_error, response.result.error.message
                assert jsonvalue.loads(response.result.value_json) == {
                    "logs": ["refused: negative input"],
                    "result": 4,
                }
                registry.send_signal(signal.SIGKILL)  # no shutdown, no flush, nothing graceful
                registry.wait(10)
    finally:
        for proc in (registry, runtime):
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)

    registry, address = _start("registry_service", tmp_path, env)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = rpb_grpc.RegistryServiceStub(channel)
            # The agent is stored too: it is there after the kill, with its history.
            await stub.GetAgent(rpb.GetAgentRequest(name="agents/coder"))
            page = await stub.ListHistory(rpb.ListHistoryRequest(agent="agents/coder"))
    finally:
        registry.kill()
        registry.wait(10)

    records = list(page.records)
    assert [r.kind for r in records] == [
        "tool/call",
        *["tool/code-dispatch-start", "tool/code-dispatch"] * 3,
        "tool/result",
    ]
    nested = [r for r in records if r.kind.startswith("tool/code-dispatch")]
    assert {r.root_call_id for r in nested} == {"run-1"}
    assert {r.parent_call_id for r in nested} == {"run-1"}
    assert [r.call_id for r in nested] == [f"run-1:code:{n}" for n in (1, 1, 2, 2, 3, 3)]
    settles = [r for r in nested if r.kind == "tool/code-dispatch"]
    assert [jsonvalue.loads(r.arguments_json) for r in settles] == [
        {"a": 0, "b": 1},
        {"a": 1, "b": 2},
        {"a": -1, "b": 0},
    ]
    assert [(r.is_error, r.error_code) for r in settles] == [
        (False, ""),
        (False, ""),
        (True, "NEGATIVE"),
    ]
    assert records[-1].content[0].text.text.startswith("refused:")
