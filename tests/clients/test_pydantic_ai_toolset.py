"""The pydantic-ai toolset against real services, driven by pydantic-ai's own test models
(`FunctionModel`, `TestModel`): calls reach the registry under pydantic-ai's call ids, results
and failures (with their Codemode codes) reach the model, malformed arguments are retried."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from typing_extensions import TypedDict

from codemode_client import RegistryClient, ToolProvider
from codemode_client.model_sdks import AgentTools
from codemode_client.model_sdks.pydantic_ai_toolset import CodemodeToolset
from tests.codemode.conftest import Stack


class AddArgs(TypedDict):
    a: int
    b: int


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[RegistryClient]:
    provider = ToolProvider(stack.channel, "math")

    @provider.tool(concurrency_safe=True)
    async def add(args: AddArgs, ctx: Any) -> int:
        """Add two integers."""
        return args["a"] + args["b"]

    async with provider, RegistryClient(stack.running.address) as client:
        await client.create_agent("coder", mode="code")
        await client.create_agent("plain", mode="native")
        yield client


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart | RetryPromptPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart | RetryPromptPart)
    ]


def scripted(*turns: list[ToolCallPart]) -> FunctionModel:
    """Calls the given tools turn by turn, then answers with every tool result it got."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(m, ModelResponse) for m in messages)
        if done < len(turns):
            return ModelResponse(parts=list(turns[done]))
        seen = [p.model_response_str() if isinstance(p, ToolReturnPart) else p.model_response()
                for p in _returns(messages)]  # fmt: skip
        return ModelResponse(parts=[TextPart(" | ".join(seen))])

    return FunctionModel(respond)


async def test_run_code_through_the_toolset(client: RegistryClient) -> None:
    toolset = CodemodeToolset(await AgentTools.load(client, "agents/coder"))
    program = "s = await tools.add({'a': 2, 'b': 3})\nprint('added')\nreturn s"
    call = ToolCallPart("run_code", {"code": program, "description": "Add"}, "pyd-call-1")
    result = await Agent(scripted([call]), toolsets=[toolset]).run("Add 2 and 3")
    assert result.output == "added\n5"  # the model got run_code's logs and result
    history = await client.history("agents/coder")
    assert ("tool/call", "run_code", "pyd-call-1") in [
        (r.kind, r.tool_name, r.call_id) for r in history
    ]
    assert [r.tool_name for r in history if r.kind == "tool/code-dispatch"] == ["add"]


async def test_the_model_sees_only_run_code_and_the_agents_prompt(client: RegistryClient) -> None:
    tools = await AgentTools.load(client, "agents/coder")
    offered: list[tuple[list[str], str | None]] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.append(([t.name for t in info.function_tools], info.instructions))
        return ModelResponse(parts=[TextPart("nothing to do")])

    await Agent(FunctionModel(respond), toolsets=[CodemodeToolset(tools)]).run("hi")
    ((names, instructions),) = offered
    assert names == ["run_code"]
    assert instructions is not None and tools.instructions in instructions


async def test_failures_keep_their_code_and_malformed_arguments_are_retried(
    client: RegistryClient,
) -> None:
    toolset = CodemodeToolset(await AgentTools.load(client, "agents/coder"))
    failing = ToolCallPart(
        "run_code", {"code": "raise ValueError('boom')", "description": "x"}, "c1"
    )
    malformed = ToolCallPart("run_code", '{"code": ', "c2")
    unknown = ToolCallPart("delete_everything", {}, "c3")
    model = scripted([failing], [malformed], [unknown])
    result = await Agent(model, toolsets=[toolset]).run("go")
    answer = result.output.split(" | ")
    assert "Error [CODE_RUN_FAILED]: " in answer[0] and "boom" in answer[0]
    assert "json_invalid" in answer[1]  # pydantic-ai's own retry prompt
    assert "Unknown tool name: 'delete_everything'" in answer[2]  # likewise
    history = await client.history("agents/coder")
    results = [(r.call_id, r.kind) for r in history if r.kind == "tool/result"]
    assert results == [("c1", "tool/result")]  # only the well-formed call reached the registry


async def test_testmodel_calls_a_native_agents_tool(client: RegistryClient) -> None:
    toolset = CodemodeToolset(await AgentTools.load(client, "agents/plain"))
    result = await Agent(TestModel(call_tools=["add"]), toolsets=[toolset]).run("add")
    assert '"add"' in result.output  # TestModel reports each tool's return by name
    history = await client.history("agents/plain")
    assert [r.tool_name for r in history if r.kind == "tool/result"] == ["add"]
