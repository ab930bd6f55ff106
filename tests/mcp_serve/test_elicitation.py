"""`mcp serve --elicit-approvals`: an approval of the server's own call (direct, or nested in
its `run_code` program) is asked of the MCP client's user through elicitation; other calls'
approvals stay with the agent's other approvers."""

from __future__ import annotations

import asyncio
from typing import Any

import mcp_types as types
from mcp import Client

from codemode_client import Approver, RegistryClient
from registry_service.domain.policy import Ask, PreDecision
from tests.codemode.conftest import Stack
from tests.mcp_serve.conftest import register_tools, stdio_server


def ask_for_double(stack: Stack) -> None:
    async def ask(e: Any, d: PreDecision) -> PreDecision:
        return Ask("doubling needs a person") if e.name == "double" else d

    stack.registry.catalog.hooks("").pre_execute.append(ask)


async def test_the_mcp_clients_user_approves_or_rejects_the_servers_calls(stack: Stack) -> None:
    tools = register_tools(stack)
    ask_for_double(stack)
    agent = await stack.code_agent()
    answers = iter([True, False])
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": next(answers)})

    program = "return (await tools.double({'n': 5}))['doubled']"
    server = stdio_server(stack.running.address, agent, "--elicit-approvals")
    async with Client(server, mode="legacy", elicitation_callback=elicit) as client:
        allowed = await client.call_tool("run_code", {"code": program, "description": "ok"})
        assert not allowed.is_error, allowed.content
        assert allowed.structured_content == {"logs": [], "result": 10}
        rejected = await client.call_tool("run_code", {"code": program, "description": "no"})
        assert rejected.is_error, rejected  # the nested call was rejected: the program raised
    assert tools.doubled == [5]
    assert len(asked) == 2
    assert "double" in asked[0] and "doubling needs a person" in asked[0]


async def test_approvals_of_other_callers_are_left_to_other_approvers(stack: Stack) -> None:
    tools = register_tools(stack)
    ask_for_double(stack)
    agent = await stack.code_agent()
    decided: list[str] = []

    def oncall(request: Any) -> bool:
        decided.append(request.call_id)
        return True

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("the MCP user was asked about another caller's call")

    program = "return (await tools.double({'n': 3}))['doubled']"
    server = stdio_server(stack.running.address, agent, "--elicit-approvals")
    async with (
        Client(server, mode="legacy", elicitation_callback=elicit) as client,
        Approver(stack.channel, "oncall", oncall),
        RegistryClient(stack.running.address) as backend,
    ):
        assert [t.name for t in (await client.list_tools()).tools] == ["run_code"]
        result = await asyncio.wait_for(
            backend.run_code(program, "a backend's call", agent=agent, call_id="backend-1"), 60
        )
    assert not result.is_error, result.error_message
    assert decided == ["backend-1:code:1"] and tools.doubled == [3]
