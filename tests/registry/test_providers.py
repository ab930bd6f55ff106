"""Provider streams: registration over Connect, invocations, cancellation, lifetime."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from typing import Any

import grpc
import pytest

from codemode_client import InvocationContext, ProviderError, ToolFailed, ToolProvider
from codemode_common.api.registry.v1 import registry_service_pb2 as rpb
from codemode_common.grpc_status import error_info
from tests.registry.conftest import Harness, echo_tool, result_text


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
    from codemode_common.api.registry.v1 import tool_pb2

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
