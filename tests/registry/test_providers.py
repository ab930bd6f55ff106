"""Provider streams: registration over Connect, invocations, cancellation, lifetime."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from typing import Any

import grpc
import pytest

from codemode_client import (
    InvocationContext,
    ProviderError,
    ToolFailed,
    ToolProvider,
    open_channel,
)
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.grpc_status import error_info
from tests.registry.conftest import Harness, echo_tool, result_text, watch_outcomes


async def test_provider_tools_execute_through_the_pipeline(harness: Harness) -> None:
    provider = ToolProvider(harness.channel, "files")
    seen: list[InvocationContext] = []

    @provider.tool(
        description="Read a file",
        input_schema={"type": "object", "properties": {"path": {"type": "string"}}},
        concurrency_safe=True,
    )
    async def read(args: Any, ctx: InvocationContext) -> Any:
        seen.append(ctx)
        return {"text": f"contents of {args['path']}"}

    @provider.tool()
    async def fail(args: Any, ctx: InvocationContext) -> Any:
        raise ToolFailed("no such file", "ENOENT")

    async with provider:
        assert await harness.visible() == ["fail", "read"]
        listed = await harness.stub.ListVisibleTools(rpb.ListVisibleToolsRequest())
        assert {t.owner for t in listed.tools} == {"files"}
        _, result = await harness.execute("read", {"path": "/a"}, call_id="m1")
        assert result.value_json == '{"text":"contents of /a"}'
        assert seen[0].call_id == "m1" and seen[0].root_call_id == "m1"
        _, failed = await harness.execute("fail")
        assert (failed.error.message, failed.error.code) == ("no such file", "ENOENT")
        _, invalid = await harness.execute("read", {"path": 3})
        assert invalid.error.code == "INVALID_ARGS"
        assert len(seen) == 1  # invalid args never reached the provider


async def test_closing_the_stream_revokes_exactly_its_tools(harness: Harness) -> None:
    echo_tool(harness.registry, "local")
    first = ToolProvider(harness.channel, "one")
    second = ToolProvider(harness.channel, "two")

    @first.tool()
    async def alpha(args: Any, ctx: Any) -> Any:
        return 1

    @second.tool()
    async def beta(args: Any, ctx: Any) -> Any:
        return 2

    await first.start()
    await second.start()
    assert await harness.visible() == ["alpha", "beta", "local"]
    await first.close()
    for _ in range(100):
        if await harness.visible() == ["beta", "local"]:
            break
        await asyncio.sleep(0.01)
    assert await harness.visible() == ["beta", "local"]
    await second.close()


async def test_disconnect_fails_in_flight_calls_cleanly(harness: Harness) -> None:
    provider = ToolProvider(harness.channel, "flaky")
    started = asyncio.Event()

    @provider.tool()
    async def slow(args: Any, ctx: Any) -> Any:
        started.set()
        await asyncio.sleep(30)

    await provider.start()
    call = asyncio.create_task(harness.execute("slow"))
    await asyncio.wait_for(started.wait(), 5)
    await provider.close()
    _, result = await asyncio.wait_for(call, 5)
    assert result.is_error
    assert result.error.code == "PROVIDER_UNAVAILABLE"
    assert result.error.message == 'tool provider "flaky" disconnected before returning a result'


async def test_client_cancellation_reaches_the_provider(harness: Harness) -> None:
    provider = ToolProvider(harness.channel, "p")
    started, cancelled = asyncio.Event(), asyncio.Event()

    @provider.tool()
    async def wait(args: Any, ctx: InvocationContext) -> Any:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            cancelled.set()

    async with provider:
        stream = harness.stub.ExecuteToolCall(
            rpb.ExecuteToolCallRequest(call_id="c", tool_name="wait")
        )
        await stream.read()  # started
        await asyncio.wait_for(started.wait(), 5)
        stream.cancel()
        await asyncio.wait_for(cancelled.wait(), 5)


async def test_deadline_is_passed_and_aborts(harness: Harness) -> None:
    provider = ToolProvider(harness.channel, "p")
    timeouts: list[float | None] = []
    cancelled = asyncio.Event()

    @provider.tool()
    async def wait(args: Any, ctx: InvocationContext) -> Any:
        timeouts.append(ctx.timeout)
        try:
            await asyncio.sleep(30)
        finally:
            cancelled.set()

    async with provider:
        stream = harness.stub.ExecuteToolCall(
            rpb.ExecuteToolCallRequest(call_id="c", tool_name="wait"), timeout=0.5
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stream:
                pass
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(cancelled.wait(), 5)
        assert timeouts[0] is not None and 0 < timeouts[0] <= 0.6


@pytest.mark.parametrize("how", ["client-cancel", "deadline"])
async def test_abandoned_call_settles_aborted_in_history_and_hooks(
    harness: Harness, how: str
) -> None:
    agent = await harness.agent("a")
    seen = watch_outcomes(harness, agent)
    provider = ToolProvider(harness.channel, "p")
    started = asyncio.Event()

    @provider.tool()
    async def wait(args: Any, ctx: InvocationContext) -> Any:
        started.set()
        await asyncio.sleep(30)

    async with provider:
        request = rpb.ExecuteToolCallRequest(agent=agent, call_id="c", tool_name="wait")
        if how == "client-cancel":
            stream = harness.stub.ExecuteToolCall(request)
            await stream.read()  # started
            await asyncio.wait_for(started.wait(), 5)
            stream.cancel()
        else:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in harness.stub.ExecuteToolCall(request, timeout=0.5):
                    pass
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert started.is_set()
        record = await harness.settled(agent, "c")
        assert (record.tool_name, record.is_error, record.error_code) == ("wait", True, "ABORTED")
        assert [b.text.text for b in record.content] == ["Error: tool call aborted"]
        assert seen == [("post", "c", "ABORTED"), ("observe", "c", "ABORTED")]


async def test_bad_registrations_are_refused_atomically(harness: Harness) -> None:
    provider = ToolProvider(harness.channel, "p")

    @provider.tool()
    async def good(args: Any, ctx: Any) -> Any:
        return 1

    @provider.tool(name="run_code")
    async def sneaky(args: Any, ctx: Any) -> Any:
        return 2

    with pytest.raises(ProviderError) as caught:
        await provider.start()
    assert caught.value.reason == "RESERVED_TOOL_NAME"
    assert await harness.visible() == []  # `good` was not registered either
    await provider.close()


@pytest.mark.parametrize(
    ("tool", "reason"),
    [
        ({"name": "t", "input_schema_json": "{not json"}, "INVALID_JSON"),
        ({"name": "t", "input_schema_json": '{"type":"object","x":NaN}'}, "INVALID_JSON"),
        ({"name": "t", "input_schema_json": '{"$ref":"#/x"}'}, "INVALID_SCHEMA"),
        ({"name": "t", "input_schema_json": '{"type":"string"}'}, "INVALID_SCHEMA"),
        ({"name": "has space"}, "INVALID_TOOL_NAME"),
        ({"name": ""}, "INVALID_TOOL_NAME"),
    ],
)
async def test_registration_errors_have_reasons(
    harness: Harness, tool: dict[str, Any], reason: str
) -> None:
    call = harness.stub.Connect()
    await call.write(rpb.ConnectRequest(open=rpb.OpenProvider(provider_name="raw")))
    assert (await call.read()).WhichOneof("message") == "opened"
    await call.write(
        rpb.ConnectRequest(
            register=rpb.RegisterTools(request_id="r1", tools=[tool_pb2.Tool(**tool)])
        )
    )
    ack = (await call.read()).registered
    assert ack.request_id == "r1" and ack.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    info = error_info(ack.status)
    assert info is not None and info.reason == reason and info.domain == "codemode.registry"
    call.cancel()
    assert await harness.visible() == []


async def test_stream_must_open_first(harness: Harness) -> None:
    call = harness.stub.Connect()
    await call.write(rpb.ConnectRequest(register=rpb.RegisterTools(request_id="r")))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_provider_in_another_process(harness: Harness) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, grpc
        from codemode_client import ToolProvider

        async def main():
            channel = grpc.aio.insecure_channel("{harness.running.address}")
            provider = ToolProvider(channel, "subprocess")

            @provider.tool(concurrency_safe=True)
            async def upper(args, ctx):
                return args["s"].upper()

            async with provider:
                print("ready", flush=True)
                await provider.closed()

        asyncio.run(main())
        """
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line.strip() == b"ready"
        _, result = await harness.execute("upper", {"s": "abc"})
        assert result.value_json == '"ABC"' and result_text(result) == "ABC"
    finally:
        proc.kill()
        await proc.wait()
    for _ in range(200):
        if await harness.visible() == []:
            break
        await asyncio.sleep(0.02)
    assert await harness.visible() == []  # the killed process's tools are gone


class RawProvider:
    """A provider speaking the Connect stream by hand, so tests control every message."""

    def __init__(self, harness: Harness) -> None:
        self.call = harness.stub.Connect()

    async def open(self, name: str = "raw") -> RawProvider:
        await self.call.write(rpb.ConnectRequest(open=rpb.OpenProvider(provider_name=name)))
        assert (await self.call.read()).WhichOneof("message") == "opened"
        return self

    async def register(self, *tools: tool_pb2.Tool, scope: str = "") -> Any:
        request = rpb.RegisterTools(request_id="r", scope=scope, tools=list(tools))
        await self.call.write(rpb.ConnectRequest(register=request))
        ack = (await self.call.read()).registered
        assert ack.request_id == "r"
        return ack

    async def answer(self, result: tool_pb2.ToolResult) -> rpb.Invocation:
        """Answers the next invocation with `result` and returns the invocation."""
        message = await asyncio.wait_for(self.call.read(), 5)
        assert message.WhichOneof("message") == "invocation"
        invocation: rpb.Invocation = message.invocation
        reply = rpb.InvocationResult(invocation_id=invocation.invocation_id, result=result)
        await self.call.write(rpb.ConnectRequest(result=reply))
        return invocation


def ack_reason(ack: Any) -> tuple[int, str]:
    info = error_info(ack.status)
    assert info is not None and info.domain == "codemode.registry"
    return ack.status.code, str(info.reason)


async def test_provider_registers_into_agent_and_preset_scopes(harness: Harness) -> None:
    preset = await harness.preset("p")
    agent = await harness.agent("a", preset=preset)
    other = await harness.agent("b")
    raw = await RawProvider(harness).open("scoped")
    assert (await raw.register(tool_pb2.Tool(name="mine"), scope=agent)).status.code == 0
    assert (await raw.register(tool_pb2.Tool(name="shared"), scope=preset)).status.code == 0
    listed = await harness.stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent))
    assert {(t.name, t.scope, t.owner) for t in listed.tools} == {
        ("mine", agent, "scoped"),
        ("shared", preset, "scoped"),
    }
    assert await harness.visible(other) == [] and await harness.visible() == []
    for name in ("mine", "shared"):
        call = asyncio.create_task(harness.execute(name, {"x": 1}, agent=agent, call_id=name))
        invocation = await raw.answer(tool_pb2.ToolResult(value_json=f'"{name} ran"'))
        assert (invocation.tool_name, invocation.agent) == (name, agent)
        assert (invocation.call_id, invocation.arguments_json) == (name, '{"x":1}')
        _, result = await call
        assert result.value_json == f'"{name} ran"'
    _, unseen = await harness.execute("mine", agent=other)
    assert unseen.error.code == "UNKNOWN_TOOL"
    raw.call.cancel()


async def test_provider_registration_conflicts_and_unknown_scopes_change_nothing(
    harness: Harness,
) -> None:
    echo_tool(harness.registry, "taken")
    raw = await RawProvider(harness).open()
    ack = await raw.register(tool_pb2.Tool(name="fresh"), tool_pb2.Tool(name="taken"))
    assert ack_reason(ack) == (grpc.StatusCode.ALREADY_EXISTS.value[0], "TOOL_ALREADY_REGISTERED")
    assert 'tool "taken" is already registered' in ack.status.message
    twice = await raw.register(tool_pb2.Tool(name="twin"), tool_pb2.Tool(name="twin"))
    assert ack_reason(twice)[1] == "TOOL_ALREADY_REGISTERED"
    unknown = [("agents/nobody", "AGENT_NOT_FOUND"), ("presets/none", "PRESET_NOT_FOUND")]
    for scope, reason in unknown:
        missing = await raw.register(tool_pb2.Tool(name="fresh"), scope=scope)
        assert ack_reason(missing) == (grpc.StatusCode.NOT_FOUND.value[0], reason)
    listed = await harness.stub.ListVisibleTools(rpb.ListVisibleToolsRequest())
    assert [(t.name, t.owner) for t in listed.tools] == [("taken", "in-process")]
    _, still = await harness.execute("taken", {"a": 1})
    assert still.value_json == '{"echo":{"a":1}}'  # the original registration still answers
    # The stream stays usable after refused registrations.
    assert (await raw.register(tool_pb2.Tool(name="fresh"))).status.code == 0
    assert await harness.visible() == ["fresh", "taken"]
    raw.call.cancel()


async def test_provider_result_fields_pass_through_unchanged(harness: Harness) -> None:
    raw = await RawProvider(harness).open()
    await raw.register(tool_pb2.Tool(name="shot"))
    sent = tool_pb2.ToolResult(
        content=[
            tool_pb2.ContentBlock(text=tool_pb2.TextContent(text="a screenshot")),
            tool_pb2.ContentBlock(
                image=tool_pb2.ImageContent(mime_type="image/png", data=b"\x89PNG\r\n\x00\xff")
            ),
            tool_pb2.ContentBlock(json=tool_pb2.JsonContent(json='{"w":640,"h":480}')),
        ],
        value_json='{"path":"/tmp/s.png"}',
        additional_contexts=[
            tool_pb2.AdditionalContext(
                content=[
                    tool_pb2.ContentBlock(text=tool_pb2.TextContent(text="look closely")),
                    tool_pb2.ContentBlock(json=tool_pb2.JsonContent(json="[1,2]")),
                ],
                source="vision-plugin",
            )
        ],
        concludes_turn=True,
    )
    call = asyncio.create_task(harness.execute("shot"))
    await raw.answer(sent)
    _, result = await call
    assert result == sent
    raw.call.cancel()


@pytest.mark.parametrize(
    ("value_json", "expected"),
    [
        ('{"n":NaN}', "NaN is not valid JSON"),
        ('{"n":1e400}', "overflows"),
        ('{"n":1,"n":2}', "duplicate object key"),
        ('{"n":"seven"}', '"n" must be a number'),
        ('{"n":1,"extra":true}', '"extra" is not a declared property'),
    ],
)
async def test_invalid_provider_output_is_a_tool_error(
    harness: Harness, value_json: str, expected: str
) -> None:
    raw = await RawProvider(harness).open()
    schema = '{"type":"object","properties":{"n":{"type":"number"}},"additionalProperties":false}'
    await raw.register(tool_pb2.Tool(name="count", output_schema_json=schema))
    call = asyncio.create_task(harness.execute("count"))
    await raw.answer(tool_pb2.ToolResult(value_json=value_json))
    _, result = await call
    assert result.is_error and result.error.code == "INVALID_TOOL_OUTPUT"
    assert expected in result.error.message
    assert not result.HasField("value_json")
    raw.call.cancel()


async def test_an_invocation_larger_than_the_provider_receives_fails_alone(
    harness: Harness,
) -> None:
    """A provider on a plain gRPC channel receives at most 4 MiB (gRPC's default). An invocation
    over that used to end its stream there, revoking its tools for every agent; now that call
    alone fails with INVOCATION_TOO_LARGE, and the stream and other agents' calls go on."""
    plain = grpc.aio.insecure_channel(harness.running.address)
    provider = ToolProvider(plain, "plain")
    caller = open_channel(harness.running.address)  # the caller's channel receives enough
    harness = Harness(harness.running, caller)

    @provider.tool(input_schema={"type": "object", "properties": {"text": {"type": "string"}}})
    async def measure(args: Any, ctx: Any) -> Any:
        return len(args["text"])

    mine, theirs = await harness.agent("mine"), await harness.agent("theirs")
    try:
        async with provider:
            opened_as = provider.provider_id
            big = "x" * (5 << 20)
            (_, refused), (_, other) = await asyncio.gather(
                harness.execute("measure", {"text": big}, agent=mine, call_id="big"),
                harness.execute("measure", {"text": "abcd"}, agent=theirs, call_id="other"),
            )
            assert refused.is_error and refused.error.code == "INVOCATION_TOO_LARGE", refused
            assert "4194304" in refused.error.message and "plain" in refused.error.message
            assert other.value_json == "4"
            _, small = await harness.execute("measure", {"text": "abc"}, agent=mine, call_id="s")
            assert small.value_json == "3", small
            _, later = await harness.execute("measure", {"text": "ab"}, agent=theirs, call_id="t")
            assert later.value_json == "2", later
            assert provider.provider_id == opened_as  # the same stream served every call
            record = await harness.settled(mine, "big")
            assert record.is_error and record.error_code == "INVOCATION_TOO_LARGE"
    finally:
        await plain.close()
        await caller.close()


async def test_a_provider_on_open_channel_receives_what_it_declares(harness: Harness) -> None:
    """`open_channel` receives 64 MiB and says so: a 5 MiB argument reaches its provider."""
    channel = open_channel(harness.running.address)
    provider = ToolProvider(channel, "roomy")

    @provider.tool(input_schema={"type": "object", "properties": {"text": {"type": "string"}}})
    async def measure(args: Any, ctx: Any) -> Any:
        return len(args["text"])

    try:
        async with provider:
            _, result = await harness.execute("measure", {"text": "x" * (5 << 20)})
            assert result.value_json == str(5 << 20), result.error.message
    finally:
        await channel.close()
