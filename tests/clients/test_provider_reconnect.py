"""`ToolProvider.serve()` keeps a provider's tools registered across registry restarts: the
stream lost on a shutdown (UNAVAILABLE) or before any registry exists is opened again on the
same address and the tools are registered again; a refused registration ends it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from codemode_client import Approver, ProviderError, ToolProvider
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from registry_service.config import RegistrySettings
from registry_service.server import RunningRegistry, start


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _registry(port: int) -> RunningRegistry:
    return await start(RegistrySettings(listen=f"127.0.0.1:{port}", history_path=":memory:"))


async def _visible(address: str, within: float = 20, tool: str = "echo") -> list[str]:
    """The registry's visible tools once the provider's `tool` has appeared in them."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rpb_grpc.RegistryServiceStub(channel)
        deadline = asyncio.get_running_loop().time() + within
        while True:
            listed = await stub.ListVisibleTools(rpb.ListVisibleToolsRequest())
            names = [tool.name for tool in listed.tools]
            if tool in names or asyncio.get_running_loop().time() > deadline:
                return names
            await asyncio.sleep(0.05)


async def _echo(address: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rpb_grpc.RegistryServiceStub(channel)
        request = rpb.ExecuteToolCallRequest(
            call_id="c1", tool_name="echo", arguments_json='{"n":1}'
        )
        [*_, last] = [response async for response in stub.ExecuteToolCall(request)]
        assert not last.result.is_error, last.result.error.message
        return str(last.result.value_json)


@contextlib.asynccontextmanager
async def _serving(address: str) -> AsyncIterator[tuple[ToolProvider, asyncio.Task[None]]]:
    # Reconnecting quickly is the channel's business; the test shortens its backoff.
    options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 200)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        provider = ToolProvider(channel, "echoes")

        @provider.tool(description="Echo")
        async def echo(args: Any, ctx: Any) -> Any:
            return args

        task = asyncio.ensure_future(provider.serve())
        try:
            yield provider, task
        finally:
            await provider.close()
            await asyncio.wait_for(task, 10)


async def test_tools_come_back_after_a_registry_restart() -> None:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    first = await _registry(port)
    async with _serving(address) as (provider, task):
        assert "echo" in await _visible(address)
        await first.stop(grace=1)  # ends the provider stream with UNAVAILABLE
        second = await _registry(port)
        try:
            assert "echo" in await _visible(address), "the provider did not come back"
            assert await _echo(address) == '{"n":1}'
            assert not task.done()
        finally:
            await provider.close()
            await asyncio.wait_for(task, 10)
            await second.stop(0)
    assert task.done() and task.exception() is None


async def test_serve_waits_for_a_registry_that_is_not_up_yet() -> None:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    async with _serving(address) as (_, task):
        await asyncio.sleep(0.3)
        assert not task.done()  # still waiting, not failed
        late = await _registry(port)
        try:
            assert "echo" in await _visible(address)
        finally:
            await late.stop(0)


async def test_a_refused_registration_ends_serve() -> None:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    running = await _registry(port)

    async def local(invocation: Any) -> Any:
        return 1

    running.registry.register_tool("echo", local)  # the provider's name is taken
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            provider = ToolProvider(channel, "echoes")

            @provider.tool(description="Echo")
            async def echo(args: Any, ctx: Any) -> Any:
                return args

            with pytest.raises(ProviderError) as caught:
                await asyncio.wait_for(provider.serve(), 10)
            assert caught.value.reason == "TOOL_ALREADY_REGISTERED"
            await provider.close()
    finally:
        await running.stop(0)


async def test_an_approver_keeps_answering_across_a_registry_restart(tmp_path: Any) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - tool: deploy\n    action: ask\n")
    port = _free_port()
    address = f"127.0.0.1:{port}"

    async def registry() -> RunningRegistry:
        settings = RegistrySettings(listen=address, history_path=":memory:", policy_rules=rules)
        running = await start(settings)

        async def deploy(invocation: Any) -> Any:
            return "deployed"

        running.registry.register_tool("deploy", deploy)
        return running

    async def deploy_as_agent() -> Any:
        """The first approved result within 10 s (the approver may still be reconnecting)."""
        async with grpc.aio.insecure_channel(address) as channel:
            stub = rpb_grpc.RegistryServiceStub(channel)
            await stub.CreateAgent(rpb.CreateAgentRequest(agent_id="ops"))
            deadline = asyncio.get_running_loop().time() + 10
            for attempt in itertools.count():
                request = rpb.ExecuteToolCallRequest(
                    agent="agents/ops",
                    call_id=f"d{attempt}",
                    tool_name="deploy",
                    arguments_json="{}",
                )
                [*_, last] = [r async for r in stub.ExecuteToolCall(request, timeout=20)]
                if not last.result.is_error or asyncio.get_running_loop().time() > deadline:
                    return last.result
                await asyncio.sleep(0.05)  # no approver connected yet: DENIED, try again
        raise AssertionError("unreachable")

    first = await registry()
    options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 200)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        approver = Approver(channel, "oncall", lambda request: True)
        serving = asyncio.ensure_future(approver.serve())
        try:
            assert (await deploy_as_agent()).value_json == '"deployed"'
            await first.stop(grace=1)  # ends the approver's stream with UNAVAILABLE
            second = await registry()
            try:
                # The approver is back: the call is approved, not left without one.
                result = await deploy_as_agent()
                assert not result.is_error, result.error.message
                assert not serving.done()
            finally:
                await second.stop(0)
        finally:
            await approver.close()
            await asyncio.wait_for(serving, 10)
