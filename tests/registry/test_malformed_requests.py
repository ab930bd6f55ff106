"""Request bytes that are not the method's message: INVALID_ARGUMENT `MALFORMED_MESSAGE` with
ErrorInfo on every kind of RPC (grpc alone answers a bare UNKNOWN), and nothing changes."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.registry.conftest import Harness, error_info_of

SERVICE = "/codemode.registry.v1.RegistryService/"
# Field 1, length-delimited: invalid UTF-8 where a string is declared, then a cut-off field.
BAD_UTF8 = b"\x0a\x02\xff\xfe"
TRUNCATED = b"\x0a\x05ab"


def assert_malformed(error: grpc.aio.AioRpcError) -> None:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    info = error_info_of(error)
    assert info is not None and info.domain == "codemode.registry"
    assert info.reason == "MALFORMED_MESSAGE"
    assert "malformed request" in (error.details() or "")


@pytest.mark.parametrize("data", [BAD_UTF8, TRUNCATED], ids=["bad-utf8", "truncated"])
async def test_unary_and_server_streaming_rpcs(harness: Harness, data: bytes) -> None:
    for method in ("CreateAgent", "CreatePreset", "GetSdk", "ListHistory"):
        call = harness.channel.unary_unary(SERVICE + method)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(call(data), 5)
        assert_malformed(caught.value)
    for method in ("ExecuteToolCall", "WatchHistory"):
        stream = harness.channel.unary_stream(SERVICE + method)(data)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(stream.read(), 5)
        assert_malformed(caught.value)
    agents = await harness.stub.ListAgents(rpb.ListAgentsRequest())
    presets = await harness.stub.ListPresets(rpb.ListPresetsRequest())
    assert not agents.agents and not presets.presets


@pytest.mark.parametrize("method", ["Connect", "Approve"])
async def test_bidi_streams_first_and_later_messages(harness: Harness, method: str) -> None:
    first = harness.channel.stream_stream(SERVICE + method)()
    await first.write(BAD_UTF8)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(first.read(), 5)
    assert_malformed(caught.value)

    later = harness.channel.stream_stream(SERVICE + method)()
    opened = (
        rpb.ConnectRequest(open=rpb.OpenProvider(provider_name="p"))
        if method == "Connect"
        else rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="a"))
    )
    await later.write(opened.SerializeToString())
    assert await asyncio.wait_for(later.read(), 5)  # opened
    await later.write(TRUNCATED)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(later.read(), 5)
    assert_malformed(caught.value)
