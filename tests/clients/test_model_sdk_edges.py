"""The model SDK adapters at their edges, with the real vendor clients and services: images in
results, a model's oversized arguments or unusable call id, an agent that is gone, and the
scripted model's own refusals (what a test sees when its script and its loop disagree)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from codemode_cli.scripted_model import ScriptedModel, check_script
from codemode_client import (
    ImageContent,
    NotFound,
    RegistryClient,
    TextContent,
    ToolOutput,
    ToolProvider,
)
from codemode_client.model_sdks import (
    AgentTools,
    ModelCall,
    anthropic_messages,
    openai_chat,
    openai_responses,
)
from tests.codemode.conftest import Stack

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(32))
BIG = "x" * 70_000  # over the registry's max_argument_bytes below
SCRIPT = {
    "shoot": [{"call": {"name": "screenshot", "arguments": {}}}, {"say": "seen"}],
    "huge": [
        {"call": {"name": "screenshot", "arguments": {"pad": BIG}}},
        {"say": "{result}"},
    ],
    "short": [{"say": "only one turn"}],
}


@pytest.fixture
def scripted() -> Iterator[ScriptedModel]:
    with ScriptedModel(SCRIPT) as model:
        yield model


@pytest.fixture
async def client(make_stack: Any) -> AsyncIterator[RegistryClient]:
    async with make_stack(max_argument_bytes=64 * 1024) as stack:
        assert isinstance(stack, Stack)
        provider = ToolProvider(stack.channel, "camera")

        @provider.tool()
        async def screenshot(args: dict[str, Any], ctx: Any) -> ToolOutput[Any]:
            """Take a screenshot."""
            return ToolOutput(content=[TextContent("the page:"), ImageContent(PNG, "image/png")])

        async with provider, RegistryClient(stack.running.address) as client:
            await client.create_agent("viewer", mode="native")
            yield client


def _openai(model: ScriptedModel) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{model.url}/v1", api_key="scripted", max_retries=0)


async def test_an_image_reaches_the_model_where_the_format_carries_one(
    client: RegistryClient, scripted: ScriptedModel
) -> None:
    tools = await AgentTools.load(client, "agents/viewer")
    data_url = "data:image/png;base64," + base64.b64encode(PNG).decode()

    await openai_responses.run(_openai(scripted), tools, model="shoot", input="look")
    (output,) = [i["output"] for i in scripted.recorded()[-1]["input"] if "output" in i]
    assert output == [
        {"type": "input_text", "text": "the page:"},
        {"type": "input_image", "image_url": data_url},
    ]

    anthropic_client = AsyncAnthropic(base_url=scripted.url, api_key="scripted", max_retries=0)
    await anthropic_messages.run(anthropic_client, tools, model="shoot", messages="look")
    (result,) = scripted.recorded()[-1]["messages"][-1]["content"]
    assert result["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": data_url.split(",")[1]},
    }

    # Chat Completions tool messages are text: the image is named, not dropped silently.
    await openai_chat.run(_openai(scripted), tools, model="shoot", messages="look")
    tool_message = scripted.recorded()[-1]["messages"][-1]
    assert tool_message["content"] == f"the page:\n[image image/png, {len(PNG)} bytes]"


async def test_oversized_arguments_are_the_registrys_refusal_read_by_the_model(
    client: RegistryClient, scripted: ScriptedModel
) -> None:
    tools = await AgentTools.load(client, "agents/viewer")
    result = await openai_responses.run(_openai(scripted), tools, model="huge", input="go")
    (reply,) = result.replies
    assert (reply.is_error, reply.code) == (True, "ARGUMENTS_TOO_LARGE")
    assert "max_argument_bytes" in result.text and len(result.text) < 2_000
    assert [r.kind for r in await client.history("agents/viewer")] == []  # nothing ran


async def test_an_unusable_call_id_is_replaced_and_a_missing_agent_raises(
    client: RegistryClient,
) -> None:
    tools = await AgentTools.load(client, "agents/viewer")
    reply = await tools.call(ModelCall("x" * 600, "screenshot", {}))
    assert not reply.is_error and reply.call_id.startswith("call-")
    assert reply.call.call_id == "x" * 600  # what goes back to the model is its own id
    empty = await tools.call(ModelCall("", "screenshot", None))
    assert not empty.is_error and empty.call_id.startswith("call-")
    # An agent that is gone is the deployment's error, not the model's: it raises.
    await client.delete_agent("agents/viewer")
    with pytest.raises(NotFound):
        await tools.call(ModelCall("c1", "screenshot", {}))


async def test_a_sync_vendor_client_is_refused_with_a_clear_error(
    client: RegistryClient, scripted: ScriptedModel
) -> None:
    tools = await AgentTools.load(client, "agents/viewer")
    sync = openai.OpenAI(base_url=f"{scripted.url}/v1", api_key="scripted", max_retries=0)
    with pytest.raises(TypeError, match="async client"):
        await openai_chat.run(sync, tools, model="short", messages="hi")


async def test_the_scripted_model_refuses_what_its_script_cannot_answer(
    scripted: ScriptedModel,
) -> None:
    client = _openai(scripted)
    with pytest.raises(openai.NotFoundError, match="no script for model 'nope'"):
        await client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.BadRequestError, match="has 1 turns; this is turn 2"):
        await client.chat.completions.create(
            model="short",
            messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}],
        )
    with pytest.raises(openai.BadRequestError, match="does not stream"):
        await client.responses.create(model="short", input="hi", stream=True)
    messages = AsyncAnthropic(base_url=scripted.url, api_key="scripted", max_retries=0)
    with pytest.raises(anthropic.NotFoundError, match="no script"):
        await messages.messages.create(model="nope", max_tokens=10, messages=[])
    bad_scripts: list[object] = [
        [],
        {"m": []},
        {"m": [{"call": {}}]},
        {"m": [{"say": "a", "call": {"name": "x"}}]},
    ]
    for bad in bad_scripts:
        with pytest.raises(ValueError, match=r"script|turn|call"):
            check_script(bad)
    assert json.dumps(scripted.recorded())  # every request was recorded as JSON
