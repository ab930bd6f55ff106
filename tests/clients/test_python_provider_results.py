"""Rich results from a Python `ToolProvider` through the real registry over gRPC: content blocks,
additional contexts, concluding the turn, and outputs that cannot stand."""

from __future__ import annotations

import asyncio
from typing import Any

from typing_extensions import TypedDict

from codemode_client import (
    AdditionalContext,
    ImageContent,
    JsonContent,
    RegistryClient,
    TextContent,
    ToolCallResult,
    ToolFailed,
    ToolOutput,
    ToolProvider,
)
from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from tests.codemode.conftest import Stack

# Not UTF-8, with a NUL: image bytes must arrive untouched.
PNG = b"\x89PNG\r\n\x1a\n\x00\xff\xfe" + bytes(range(256))
BIG = 2**64 + 1  # beyond a double: the JSON block must keep it exact


class Shot(TypedDict):
    width: int
    height: int


def shot_output() -> ToolOutput[Shot]:
    return ToolOutput(
        value={"width": 640, "height": BIG},
        content=[
            TextContent("The page:"),
            ImageContent(PNG, "image/png"),
            JsonContent({"title": "Ünïcode", "n": BIG, "ok": [True, None, 1.5]}),
        ],
        additional_contexts=[
            AdditionalContext([TextContent("Cookies were accepted.")], source="browser"),
            AdditionalContext([ImageContent(b"GIF89a", "image/gif"), TextContent("favicon")]),
        ],
        concludes_turn=True,
    )


async def call(client: RegistryClient, tool: str, agent: str) -> ToolCallResult:
    # A result that is never sent would hang the call: fail fast instead.
    return await asyncio.wait_for(client.call(tool, {}, agent=agent), 20)


async def test_rich_output_reaches_a_model_direct_call_exactly(stack: Stack) -> None:
    provider = ToolProvider(stack.channel, "browser")

    @provider.tool()
    async def shot(args: Any, ctx: Any) -> ToolOutput[Shot]:
        """Screenshot the page."""
        return shot_output()

    @provider.tool()
    async def plain(args: Any, ctx: Any) -> Any:
        return {"a": [1, 2], "b": BIG}

    @provider.tool()
    async def content_only(args: Any, ctx: Any) -> Any:
        return ToolOutput(content=[TextContent("just words")])

    @provider.tool()
    async def null_value(args: Any, ctx: Any) -> Any:
        return ToolOutput(value=None, content=[TextContent("nothing found")])

    @provider.tool(output_schema={"type": "object"})
    async def typed_words(args: Any, ctx: Any) -> Any:
        return ToolOutput(content=[TextContent("words, but an object was promised")])

    async with provider, RegistryClient(stack.running.address) as client:
        tools = {t.name: t for t in await client.list_tools()}
        # `-> ToolOutput[Shot]` declares Shot's schema, as `-> Shot` would.
        schema = jsonvalue.loads(tools["shot"].output_schema_json)
        assert isinstance(schema, dict) and schema["required"] == ["width", "height"]
        agent = (await client.create_agent("viewer", mode="native")).name

        rich = await call(client, "shot", agent)
        assert not rich.is_error, rich.error_message
        expected = shot_output()
        assert rich.has_value and rich.value == expected.value
        assert rich.content == expected.content
        assert rich.additional_contexts == expected.additional_contexts
        assert rich.concludes_turn
        assert rich.text == "The page:"
        assert rich.raw is not None
        assert rich.raw.value_json == '{"width":640,"height":18446744073709551617}'
        assert rich.raw.content[1].image.data == PNG
        assert rich.raw.content[2].json.json == (
            '{"title":"Ünïcode","n":18446744073709551617,"ok":[true,null,1.5]}'
        )

        # A plain return works as it always did: the registry renders the value.
        simple = await call(client, "plain", agent)
        assert simple.value == {"a": [1, 2], "b": BIG} and simple.has_value
        assert simple.content == (TextContent(jsonvalue.render_pretty(simple.value)),)
        assert simple.additional_contexts == () and not simple.concludes_turn

        words = await call(client, "content_only", agent)
        assert not words.is_error and not words.has_value and words.value is None
        assert words.content == (TextContent("just words"),)
        assert words.raw is not None and not words.raw.HasField("value_json")

        null = await call(client, "null_value", agent)
        assert null.has_value and null.value is None
        assert null.content == (TextContent("nothing found"),)

        # A declared output schema promises a value: content alone breaks that promise.
        typed = await call(client, "typed_words", agent)
        assert typed.is_error and typed.error_code == "INVALID_TOOL_OUTPUT"
        assert typed.error_message == (
            'tool "typed_words" returned invalid output: '
            "the result has no value, but the tool declares an output schema"
        )


async def test_a_program_gets_the_value_and_run_code_carries_the_rest(stack: Stack) -> None:
    provider = ToolProvider(stack.channel, "browser")

    @provider.tool()
    async def shot(args: Any, ctx: Any) -> ToolOutput[Shot]:
        return shot_output()

    @provider.tool()
    async def note(args: Any, ctx: Any) -> Any:
        return ToolOutput(content=[TextContent("a note")])

    async with provider, RegistryClient(stack.running.address) as client:
        agent = (await client.create_agent("coder", mode="code")).name
        result = await asyncio.wait_for(
            client.run_code(
                "s = await tools.shot({})\nn = await tools.note({})\nreturn [s, n]",
                "look",
                agent=agent,
            ),
            30,
        )
    assert not result.is_error, result.error_message
    assert result.value == {"logs": [], "result": [{"width": 640, "height": BIG}, None]}
    expected = shot_output()
    # The image-bearing content is forwarded whole, then the tool's own contexts, in order.
    assert result.additional_contexts == (
        AdditionalContext(expected.content, "tools-code-mode"),
        *expected.additional_contexts,
    )
    assert result.concludes_turn


async def test_outputs_that_cannot_stand_fail_as_invalid_tool_output(stack: Stack) -> None:
    provider = ToolProvider(stack.channel, "broken")
    schema: JsonValue = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
    }

    @provider.tool(output_schema=schema)
    async def off_schema(args: Any, ctx: Any) -> Any:
        return ToolOutput(value={"n": "seven"}, content=[TextContent("seven")])

    @provider.tool()
    async def nan_value(args: Any, ctx: Any) -> Any:
        return ToolOutput(value={"x": float("nan")}, content=[TextContent("x")])

    @provider.tool()
    async def nan_plain(args: Any, ctx: Any) -> Any:
        return {"x": float("nan")}

    @provider.tool()
    async def nan_block(args: Any, ctx: Any) -> Any:
        return ToolOutput(value=1, content=[TextContent("ok"), JsonContent(float("inf"))])

    @provider.tool()
    async def surrogate_text(args: Any, ctx: Any) -> Any:
        return ToolOutput(content=[TextContent("bad \ud800 text")])

    @provider.tool()
    async def text_image(args: Any, ctx: Any) -> Any:
        return ToolOutput(
            additional_contexts=[AdditionalContext([ImageContent("png", "image/png")])]  # type: ignore[arg-type]
        )

    @provider.tool()
    async def loose_dict(args: Any, ctx: Any) -> Any:
        return ToolOutput(content=[{"type": "text", "text": "hi"}])  # type: ignore[list-item]

    # The same outputs from an in-process tool: a provider's must fail the same way.
    async def in_process_nan(invocation: Any) -> Any:
        return {"x": float("nan")}

    async def in_process_off_schema(invocation: Any) -> Any:
        return {"n": "seven"}

    stack.registry.register_tool("local_nan", in_process_nan)
    stack.registry.register_tool("local_off_schema", in_process_off_schema, output_schema=schema)

    async with provider, RegistryClient(stack.running.address) as client:
        agent = (await client.create_agent("checker", mode="native")).name

        async def failure(tool: str) -> tuple[str, str, str]:
            result = await call(client, tool, agent)
            assert result.is_error and not result.has_value and not result.concludes_turn
            assert result.raw is not None
            assert result.content == (TextContent(f"Error: {result.error_message}"),)
            return result.error_code, result.raw.error.name, result.error_message

        local_nan, local_schema = await failure("local_nan"), await failure("local_off_schema")
        assert local_nan[:2] == local_schema[:2] == ("INVALID_TOOL_OUTPUT", "ToolOutputError")
        # The registry checks the schema; the provider refuses what it cannot send, alike.
        assert await failure("off_schema") == (
            *local_schema[:2],
            local_schema[2].replace("local_off_schema", "off_schema"),
        )
        assert await failure("nan_plain") == (
            *local_nan[:2],
            local_nan[2].replace("local_nan", "nan_plain"),
        )
        assert await failure("nan_value") == (
            *local_nan[:2],
            local_nan[2].replace("local_nan", "nan_value"),
        )
        expected = {
            "nan_block": "content[1] is not lossless JSON",
            "surrogate_text": "content[0].text holds a lone surrogate",
            "text_image": "additional_contexts[0].content[0].data is str, not bytes",
            "loose_dict": "content[0] is dict, not TextContent, ImageContent or JsonContent",
        }
        for tool, detail in expected.items():
            code, name, message = await failure(tool)
            assert (code, name) == ("INVALID_TOOL_OUTPUT", "ToolOutputError")
            assert message.startswith(f'tool "{tool}" returned invalid output: {detail}'), message


async def test_failures_carry_contexts_and_always_settle(stack: Stack) -> None:
    provider = ToolProvider(stack.channel, "failing")

    @provider.tool()
    async def refuse(args: Any, ctx: Any) -> Any:
        raise ToolFailed(
            "quota exceeded",
            "QUOTA",
            additional_contexts=[AdditionalContext([TextContent("Try after 5pm.")], "billing")],
        )

    @provider.tool()
    async def odd_error(args: Any, ctx: Any) -> Any:
        # Not encodable: must not lose the result (an explicit failure's text reaches the model).
        raise ToolFailed("bad byte \udcff in the file")

    async with provider, RegistryClient(stack.running.address) as client:
        agent = (await client.create_agent("failer", mode="native")).name
        refused = await call(client, "refuse", agent)
        assert refused.is_error and refused.error_code == "QUOTA"
        assert refused.text == "Error: quota exceeded"
        assert refused.additional_contexts == (
            AdditionalContext([TextContent("Try after 5pm.")], "billing"),
        )
        odd = await call(client, "odd_error", agent)
        assert odd.is_error and odd.error_message == "bad byte \ufffd in the file"
