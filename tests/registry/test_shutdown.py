"""Graceful shutdown through gRPC: calls in flight finish within the grace period, the
long-lived streams (providers, approvers, history watches) end with UNAVAILABLE instead of
holding the server to its grace period, and nothing new is admitted meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_status import rpc_status

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2, tool_pb2
from codemode_wire.grpc_status import error_info
from registry_service.config import RegistrySettings
from registry_service.server import RunningRegistry, start


@pytest.fixture
async def running() -> AsyncIterator[RunningRegistry]:
    server = await start(RegistrySettings(listen="127.0.0.1:0", history_path=":memory:"))
    try:
        yield server
    finally:
        await server.server.stop(0)


def _reason(error: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(error)
    info = None if status is None else error_info(status)
    return "" if info is None else str(info.reason)


class RawProvider:
    """A provider on a raw Connect stream that answers invocations only when told to."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = rpb_grpc.RegistryServiceStub(channel).Connect()
        self.invocations: asyncio.Queue[rpb.Invocation] = asyncio.Queue()
        self.ended: asyncio.Future[grpc.aio.AioRpcError | None] = (
            asyncio.get_running_loop().create_future()
        )

    async def open(self, tool: str) -> None:
        await self.call.write(rpb.ConnectRequest(open=rpb.OpenProvider(provider_name="slow")))
        assert (await self.call.read()).HasField("opened")
        register = rpb.RegisterTools(request_id="r1", tools=[tool_pb2.Tool(name=tool)])
        await self.call.write(rpb.ConnectRequest(register=register))
        assert (await self.call.read()).registered.status.code == 0
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while (message := await self.call.read()) is not grpc.aio.EOF:
                if message.HasField("invocation"):
                    self.invocations.put_nowait(message.invocation)
            self.ended.set_result(None)
        except grpc.aio.AioRpcError as error:
            self.ended.set_result(error)

    async def answer(self, invocation: rpb.Invocation, value: str) -> None:
        result = rpb.InvocationResult(
            invocation_id=invocation.invocation_id, result=tool_pb2.ToolResult(value_json=value)
        )
        await self.call.write(rpb.ConnectRequest(result=result))


def _ended_unavailable(error: grpc.aio.AioRpcError | None) -> None:
    assert error is not None, "the stream ended without a status"
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert _reason(error) == "REGISTRY_SHUTTING_DOWN"


async def test_idle_streams_end_at_once_with_unavailable(running: RunningRegistry) -> None:
    async with grpc.aio.insecure_channel(running.address) as channel:
        stub = rpb_grpc.RegistryServiceStub(channel)
        await stub.CreateAgent(rpb.CreateAgentRequest(agent_id="a", agent=scope_pb2.Agent()))
        provider = RawProvider(channel)
        await provider.open("slow_tool")
        approver = stub.Approve()
        await approver.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="ops")))
        assert (await approver.read()).HasField("opened")
        watch = stub.WatchHistory(rpb.WatchHistoryRequest(agent="agents/a"))

        async def drain_watch() -> grpc.aio.AioRpcError | None:
            try:
                async for _ in watch:
                    pass
            except grpc.aio.AioRpcError as error:
                return error
            return None

        watching = asyncio.ensure_future(drain_watch())
        await asyncio.sleep(0.1)  # the watch is live (past its empty backlog)

        # A grace far longer than any loaded machine's stop: taking it would be the bug.
        began = time.monotonic()
        await running.stop(grace=120)
        assert time.monotonic() - began < 60, "idle streams held the server to its grace period"

        _ended_unavailable(await asyncio.wait_for(provider.ended, 5))
        _ended_unavailable(await asyncio.wait_for(watching, 5))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await approver.read()
        _ended_unavailable(caught.value)


async def test_a_call_in_flight_finishes_before_its_provider_is_let_go(
    running: RunningRegistry,
) -> None:
    async with grpc.aio.insecure_channel(running.address) as channel:
        stub = rpb_grpc.RegistryServiceStub(channel)
        provider, responses, invocation = await _call_in_flight(channel)

        stopping = asyncio.ensure_future(running.stop(grace=10))
        await asyncio.sleep(0.2)
        assert not stopping.done(), "stop did not wait for the call in flight"
        # The server refuses new RPCs (grpc sends GOAWAY), so even a health check cannot reach it.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _collect(
                stub.ExecuteToolCall(rpb.ExecuteToolCallRequest(call_id="c2", tool_name="x"))
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not provider.ended.done(), "the provider was let go while its call was running"

        await provider.answer(invocation, '{"done":true}')
        result = (await asyncio.wait_for(responses, 5))[-1].result
        assert not result.is_error and result.value_json == '{"done":true}'
        await asyncio.wait_for(stopping, 3)
        _ended_unavailable(await asyncio.wait_for(provider.ended, 5))


async def test_a_call_still_running_after_the_grace_period_is_cancelled(
    running: RunningRegistry,
) -> None:
    async with grpc.aio.insecure_channel(running.address) as channel:
        _, responses, _ = await _call_in_flight(channel)  # never answered

        stopped = asyncio.ensure_future(running.stop(grace=0.3))
        # Ended at the grace, not left to its own (never-coming) answer. Two things happen at
        # the grace and either may come first: the server cancels the RPC, or the provider's
        # stream ends (UNAVAILABLE) and the call fails as a tool whose provider went away.
        await asyncio.wait_for(stopped, 60)
        (ended,) = await asyncio.wait_for(asyncio.gather(responses, return_exceptions=True), 5)
        if isinstance(ended, BaseException):
            assert isinstance(ended, grpc.aio.AioRpcError), ended
            assert ended.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        else:
            result = ended[-1].result
            assert result.is_error, result


async def _call_in_flight(
    channel: grpc.aio.Channel,
) -> tuple[RawProvider, asyncio.Future[list[rpb.ExecuteToolCallResponse]], rpb.Invocation]:
    """A provider, and a call of its tool that it has received and not answered yet."""
    provider = RawProvider(channel)
    await provider.open("slow_tool")
    call = rpb_grpc.RegistryServiceStub(channel).ExecuteToolCall(
        rpb.ExecuteToolCallRequest(call_id="c1", tool_name="slow_tool", arguments_json="{}")
    )
    responses = asyncio.ensure_future(_collect(call))
    return provider, responses, await asyncio.wait_for(provider.invocations.get(), 5)


async def _collect(call: Any) -> list[rpb.ExecuteToolCallResponse]:
    return [response async for response in call]
