"""The model SDK adapters with the vendors' real SDK clients (`openai`, `anthropic`) pointed at
the scripted model (codemode_cli/scripted_model.py) on loopback, against a real registry,
runtime and tool provider: the calls reach the registry's history, the model gets the results,
`run_code` works through each API, and bad model output is a tool error the model reads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from typing_extensions import TypedDict

from codemode_cli.scripted_model import ScriptedModel
from codemode_client import RegistryClient, ToolOutput, ToolProvider
from codemode_client.model_sdks import (
    AgentTools,
    LoopResult,
    anthropic_messages,
    openai_chat,
    openai_responses,
)
from codemode_client.results import AdditionalContext, TextContent
from tests.codemode.conftest import Stack

PROGRAM = "r = await tools.add({'a': 2, 'b': 3})\nprint('added')\nreturn r['total']"
SCRIPT = {
    "run-code": [
        {"call": {"name": "run_code", "arguments": {"code": PROGRAM, "description": "Add"}}},
        {"say": "The program said: {result}"},
    ],
    "bad-output": [
        {
            "call": [
                {"name": "delete_everything", "arguments": {"path": "/"}},
                {"name": "run_code", "arguments_text": '{"code": "return 1", '},
                {"name": "run_code", "arguments": [1, 2]},
            ]
        },
        {"say": "I read: {result}"},
    ],
    "loops-forever": [
        {"call": {"name": "run_code", "arguments": {"code": "return 1", "description": "one"}}},
        {"call": {"name": "run_code", "arguments": {"code": "return 2", "description": "two"}}},
        {"say": "never reached"},
    ],
    "native-add": [
        {"call": {"name": "add", "arguments": {"a": 40, "b": 2}}},
        {"say": "{result}"},
    ],
    "concludes": [
        {"call": {"name": "finish", "arguments": {}}},
        {"say": "never reached"},
    ],
}
APIS = ["responses", "chat", "messages"]


class AddArgs(TypedDict):
    a: int
    b: int


class Sum(TypedDict):
    total: int


@dataclass
class World:
    client: RegistryClient
    model: ScriptedModel
    code_agent: str
    native_agent: str


@pytest.fixture
def scripted() -> Iterator[ScriptedModel]:
    with ScriptedModel(SCRIPT) as model:
        yield model


@pytest.fixture
async def world(stack: Stack, scripted: ScriptedModel) -> AsyncIterator[World]:
    provider = ToolProvider(stack.channel, "math")

    @provider.tool(concurrency_safe=True)
    async def add(args: AddArgs, ctx: Any) -> Sum:
        """Add two integers."""
        return {"total": args["a"] + args["b"]}

    @provider.tool()
    async def finish(args: dict[str, Any], ctx: Any) -> ToolOutput[Any]:
        """End the turn."""
        return ToolOutput(
            value="done",
            additional_contexts=[AdditionalContext([TextContent("the user left")], "test")],
            concludes_turn=True,
        )

    async with provider, RegistryClient(stack.running.address) as client:
        code = (await client.create_agent("coder", mode="code")).name
        native = (await client.create_agent("plain", mode="native")).name
        yield World(client, scripted, code, native)


async def run(api: str, world: World, agent: str, model: str, max_turns: int = 5) -> LoopResult:
    tools = await AgentTools.load(world.client, agent)
    prompt = "Add 2 and 3 with a program."
    if api == "responses":
        openai = AsyncOpenAI(base_url=f"{world.model.url}/v1", api_key="scripted", max_retries=0)
        return await openai_responses.run(
            openai, tools, model=model, input=prompt, max_turns=max_turns
        )
    if api == "chat":
        openai = AsyncOpenAI(base_url=f"{world.model.url}/v1", api_key="scripted", max_retries=0)
        return await openai_chat.run(
            openai, tools, model=model, messages=prompt, max_turns=max_turns
        )
    anthropic = AsyncAnthropic(base_url=world.model.url, api_key="scripted", max_retries=0)
    return await anthropic_messages.run(
        anthropic, tools, model=model, messages=prompt, max_turns=max_turns
    )


def tool_results_sent(api: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results a request carried to the model, as {call_id, text, is_error}."""
    if api == "responses":
        return [
            {"call_id": i["call_id"], "text": i["output"], "is_error": None}
            for i in body["input"]
            if i.get("type") == "function_call_output"
        ]
    if api == "chat":
        return [
            {"call_id": m["tool_call_id"], "text": m["content"], "is_error": None}
            for m in body["messages"]
            if m["role"] == "tool"
        ]
    return [
        {
            "call_id": b["tool_use_id"],
            "text": "".join(c["text"] for c in b["content"]),
            "is_error": b["is_error"],
        }
        for m in body["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]


def tools_offered(api: str, body: dict[str, Any]) -> list[str]:
    if api == "chat":
        return [t["function"]["name"] for t in body["tools"]]
    return [t["name"] for t in body["tools"]]


@pytest.mark.parametrize("api", APIS)
async def test_run_code_through_each_api_reaches_the_registry_and_the_model(
    api: str, world: World
) -> None:
    result = await run(api, world, world.code_agent, "run-code")
    assert result.stop == "answered" and result.turns == 2
    (reply,) = result.replies
    assert not reply.is_error
    assert reply.result is not None and reply.result.value == {"logs": ["added"], "result": 5}
    assert reply.text == "added\n5"  # what run_code shows the model: its logs, then its result
    assert result.text == f"The program said: {reply.text}"

    first, second = world.model.recorded()
    assert tools_offered(api, first) == ["run_code"]  # code mode: the model sees run_code only
    prompt = await world.client.system_prompt(world.code_agent)
    if api == "chat":
        system = first["messages"][0]["content"]
    else:
        system = first["instructions" if api == "responses" else "system"]
    assert system == prompt and "add" in prompt  # the SDK text reaches the model
    (sent,) = tool_results_sent(api, second)
    assert sent["call_id"] == reply.call.call_id and sent["text"] == "added\n5"
    assert sent["is_error"] in (None, False)

    history = await world.client.history(world.code_agent)
    calls = [(r.kind, r.tool_name, r.call_id) for r in history]
    assert ("tool/call", "run_code", reply.call.call_id) in calls  # the model's call id
    assert ("tool/result", "run_code", reply.call.call_id) in calls
    assert [r.tool_name for r in history if r.kind == "tool/code-dispatch"] == ["add"]


@pytest.mark.parametrize("api", APIS)
async def test_bad_model_output_is_a_tool_error_the_model_reads(api: str, world: World) -> None:
    result = await run(api, world, world.code_agent, "bad-output")
    assert result.stop == "answered"
    unknown, malformed, not_object = result.replies
    assert (unknown.is_error, unknown.code) == (True, "UNKNOWN_TOOL")
    assert unknown.text.startswith("Error [UNKNOWN_TOOL]: ")
    assert (malformed.is_error, malformed.code) == (True, "INVALID_JSON")
    assert malformed.text.startswith("Error [INVALID_JSON]: ")
    assert (not_object.is_error, not_object.code) == (True, "INVALID_ARGS")  # the registry's
    (_, second) = world.model.recorded()
    sent = tool_results_sent(api, second)
    assert [s["text"] for s in sent] == [unknown.text, malformed.text, not_object.text]
    if api == "messages":
        assert [s["is_error"] for s in sent] == [True, True, True]
    assert result.text == f"I read: {not_object.text}"
    # The unknown tool reached the registry and was refused at creation, the arguments that
    # are not an object failed validation; the malformed call was refused before anything ran.
    history = await world.client.history(world.code_agent)
    results = [r for r in history if r.kind == "tool/result"]
    assert [r.tool_name for r in results] == ["delete_everything", "run_code"]


@pytest.mark.parametrize("api", APIS)
async def test_the_loop_is_bounded(api: str, world: World) -> None:
    result = await run(api, world, world.code_agent, "loops-forever", max_turns=2)
    assert (result.stop, result.turns, len(result.replies)) == ("max_turns", 2, 2)
    assert len(world.model.recorded()) == 2


@pytest.mark.parametrize("api", APIS)
async def test_a_native_agent_offers_its_tools_and_a_result_may_conclude_the_turn(
    api: str, world: World
) -> None:
    result = await run(api, world, world.native_agent, "native-add")
    assert json.loads(result.text) == {"total": 42}
    assert sorted(tools_offered(api, world.model.recorded()[0])) == ["add", "finish"]

    concluded = await run(api, world, world.native_agent, "concludes")
    assert (concluded.stop, concluded.turns) == ("concluded", 1)
    (reply,) = concluded.replies
    assert reply.concludes_turn and reply.additional_contexts
    # The context follows the results in the conversation handed back (to continue it).
    assert "the user left" in json.dumps(concluded.conversation[-1])
