"""The official Python MCP client against `codemode mcp serve` over stdio: what a code agent and
a native agent expose, a fanning-out program with its progress and history, errors that keep
their code, and cancellation that ends the run."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from mcp import Client

from codemode_client import Approver
from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.policy import Ask, PreDecision
from runtime_service.sandbox_uids import live_processes_of
from tests.codemode.conftest import Stack
from tests.codemode.test_cancellation import outer_result_record
from tests.mcp_serve.conftest import register_tools, stdio_server
from tests.registry.conftest import BOTH, NATIVE, echo_tool

FAN_OUT = (
    "import asyncio\n"
    "rs = await asyncio.gather(*(tools.double({'n': i}) for i in range(5)))\n"
    "print('fanned out')\n"
    "return sum(r['doubled'] for r in rs)"
)


async def history(stack: Stack, agent: str, call_id: str = "") -> list[Any]:
    page = await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, call_id=call_id))
    return list(page.records)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_code_agent_is_run_code_with_its_sdk_and_a_program_fans_out(
    stack: Stack, mode: str
) -> None:
    tools = register_tools(stack)
    agent = await stack.code_agent()
    sdk = (await stack.stub.GetSdk(ppb.GetSdkRequest(scope=agent))).text
    prompt = (await stack.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=agent))).text
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    async with Client(stdio_server(stack.running.address, agent), mode=mode) as client:
        assert client.instructions == prompt  # the agent's prompt sections
        listed = (await client.list_tools()).tools
        assert [t.name for t in listed] == ["run_code"]
        (run_code,) = listed
        assert "async def double" in sdk and run_code.description is not None
        assert run_code.description.endswith(sdk)  # the SDK rides run_code's description
        assert run_code.input_schema["required"] == ["code"] or "code" in str(run_code.input_schema)
        result = await client.call_tool(
            "run_code",
            {"code": FAN_OUT, "description": "double five numbers"},
            progress_callback=on_progress,
        )
    assert not result.is_error, result.content
    assert result.structured_content == {"logs": ["fanned out"], "result": 20}
    assert sorted(tools.doubled) == [0, 1, 2, 3, 4]
    # Every nested call was a progress notification: five starts and five settles, in order.
    messages = [m or "" for _, m in seen]
    assert sum(m.startswith("started tools.double") for m in messages) == 5
    assert sum(m.startswith("settled tools.double") and m.endswith(": ok") for m in messages) == 5
    assert [v for v, _ in seen] == sorted(v for v, _ in seen)
    call_id = result.meta["codemode"]["call_id"] if result.meta else ""
    records = await history(stack, agent, call_id)
    kinds = [r.kind for r in records]
    assert kinds[0] == "tool/call" and kinds[-1] == "tool/result"
    assert kinds.count("tool/code-dispatch") == 5
    assert {r.tool_name for r in records if r.kind == "tool/code-dispatch"} == {"double"}


async def test_a_native_agent_lists_its_tools_with_their_schemas(stack: Stack) -> None:
    register_tools(stack)
    echo_tool(stack.registry, "untyped", input_schema={})  # any arguments at all
    agent = await stack.agent("plain", mode=NATIVE)
    async with Client(stdio_server(stack.running.address, agent), mode="legacy") as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == {"double", "hang", "broken", "untyped"}
        assert listed["double"].input_schema["properties"] == {"n": {"type": "integer"}}
        assert listed["untyped"].input_schema == {"type": "object"}  # MCP requires an object
        echoed = await client.call_tool("untyped", {"any": ["thing", 1]})
        assert echoed.structured_content == {"echo": {"any": ["thing", 1]}}
        result = await client.call_tool("double", {"n": 21})
        assert not result.is_error
        assert result.structured_content == {"doubled": 42}
        failed = await client.call_tool("broken", {})
        assert failed.is_error
        assert failed.meta is not None
        code = failed.meta["codemode"]["error_code"]
        assert code and f"[{code}]" in str(failed.content[0])
        invalid = await client.call_tool("double", {"n": "not a number"})
        assert invalid.is_error
        assert invalid.meta is not None and invalid.meta["codemode"]["error_code"] == "INVALID_ARGS"


async def test_a_both_agent_lists_its_tools_and_run_code_as_its_model_sees_them(
    stack: Stack,
) -> None:
    register_tools(stack)
    agent = await stack.agent("both", mode=BOTH)
    wire = await stack.stub.GetWireSchemas(ppb.GetWireSchemasRequest(scope=agent))
    sdk = (await stack.stub.GetSdk(ppb.GetSdkRequest(scope=agent))).text
    async with Client(stdio_server(stack.running.address, agent), mode="legacy") as client:
        listed = (await client.list_tools()).tools
        # Exactly the model's list, in its order: every tool, then run_code with the SDK.
        assert [t.name for t in listed] == [s.name for s in wire.schemas]
        assert {"double", "run_code"} <= {t.name for t in listed}
        run_code = next(t for t in listed if t.name == "run_code")
        assert run_code.description is not None and run_code.description.endswith(sdk)
        direct = await client.call_tool("double", {"n": 4})
        assert not direct.is_error and direct.structured_content == {"doubled": 8}
        program = await client.call_tool("run_code", {"code": FAN_OUT, "description": "both ways"})
    assert not program.is_error, program.content
    assert program.structured_content == {"logs": ["fanned out"], "result": 20}


async def test_errors_keep_the_codemode_code(stack: Stack) -> None:
    register_tools(stack)
    agent = await stack.code_agent()
    async with Client(stdio_server(stack.running.address, agent), mode="legacy") as client:
        # Under `code` a direct call of another tool is refused at creation: UNKNOWN_TOOL.
        unknown = await client.call_tool("double", {"n": 1})
        assert unknown.is_error and unknown.meta is not None
        assert unknown.meta["codemode"]["error_code"] == "UNKNOWN_TOOL"
        assert "[UNKNOWN_TOOL]" in str(unknown.content)
        raised = await client.call_tool(
            "run_code", {"code": "raise ValueError('no')", "description": "fails"}
        )
        assert raised.is_error and raised.meta is not None
        assert raised.meta["codemode"]["error_code"]
        assert "ValueError" in str(raised.content)
        # A value that is not lossless JSON fails its own call, before any call exists.
        negative_zero = await client.call_tool("run_code", {"code": "return 1", "x": -0.0})
        assert negative_zero.is_error and negative_zero.meta is not None
        assert negative_zero.meta["codemode"]["error_code"] == "INVALID_ARGS"
        assert "negative zero" in str(negative_zero.content)
    assert not [r for r in await history(stack, agent) if r.arguments_json.find("-0") >= 0]


async def test_a_call_over_its_deadline_is_a_tool_error_with_the_status(stack: Stack) -> None:
    tools = register_tools(stack)
    agent = await stack.agent("slow", mode=NATIVE)
    server = stdio_server(stack.running.address, agent, "--call-timeout", "1")
    async with Client(server, mode="legacy") as client:
        late = await client.call_tool("hang", {})
        assert late.is_error and late.meta is not None
        assert late.meta["codemode"]["error_code"] == "DEADLINE_EXCEEDED"
        assert str(late.content[0]).count("[DEADLINE_EXCEEDED]") == 1
        await asyncio.wait_for(tools.hang_aborted.wait(), 30)  # the registry aborted it
        assert not (await client.call_tool("double", {"n": 1})).is_error  # and serves on


async def test_cancelling_the_mcp_call_ends_the_run_and_aborts_its_nested_call(
    stack: Stack,
) -> None:
    tools = register_tools(stack)
    agent = await stack.code_agent()
    program = "import os\nawait tools.hang({'uid': os.getuid()})\nreturn 'unreachable'"
    async with Client(stdio_server(stack.running.address, agent), mode="legacy") as client:
        call = asyncio.create_task(
            client.call_tool("run_code", {"code": program, "description": "hangs"})
        )
        await asyncio.wait_for(tools.hang_started.wait(), 30)
        call.cancel()  # the SDK sends notifications/cancelled for the request
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(tools.hang_aborted.wait(), 30)
        # The server goes on serving after a cancelled call.
        assert [t.name for t in (await client.list_tools()).tools] == ["run_code"]
    records = await outer_result_record(stack, agent)
    outer = records[-1]
    assert (outer.tool_name, outer.is_error, outer.error_code) == ("run_code", True, "ABORTED")
    (uid,) = tools.workers
    assert uid != os.getuid(), "needs a sandbox uid (root)"
    assert not live_processes_of(uid)  # the run's worker is gone
    nested = [(r.kind, r.tool_name, r.error_code) for r in records[1:-1]]
    assert nested == [
        ("tool/code-dispatch-start", "hang", ""),
        ("tool/code-dispatch", "hang", "ABORTED"),
    ]


async def test_an_approval_reaches_the_agents_approver_and_is_reported_as_progress(
    stack: Stack,
) -> None:
    tools = register_tools(stack)
    agent = await stack.agent("asking", mode=NATIVE)
    asked: list[str] = []

    async def ask(e: Any, d: PreDecision) -> PreDecision:
        return Ask("doubling needs a person") if e.name == "double" else d

    def decide(request: Any) -> bool:
        asked.append(request.tool_name)
        return True

    stack.registry.catalog.hooks("").pre_execute.append(ask)
    seen: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message or "")

    async with (
        Approver(stack.channel, "oncall", decide),
        Client(stdio_server(stack.running.address, agent), mode="legacy") as client,
    ):
        result = await client.call_tool("double", {"n": 4}, progress_callback=on_progress)
    assert not result.is_error, result.content
    assert result.structured_content == {"doubled": 8}
    assert asked == ["double"] and tools.doubled == [4]
    assert seen == ["waiting for approval: doubling needs a person", "approval allowed_once"]
