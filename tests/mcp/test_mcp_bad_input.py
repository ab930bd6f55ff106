"""Bad input around MCP servers: what the API may attach (never a command; URLs only within the
operator's allow-list), and servers that misbehave (malformed JSON-RPC, a silent initialize, a
huge result, a flood of notifications). Each gets a clear error and bounded resources, nothing
is stored, and other tenants are unaffected."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from tests.mcp.conftest import (
    attach,
    mcp_settings,
    server_status,
    servers_of,
    tools_of,
    until,
)
from tests.registry.conftest import error_info_of

ALLOWED = "http://127.0.0.1:1/allowed/"

ATTACHMENTS = [
    pytest.param(
        scope_pb2.McpServer(server="nope"), "INVALID_ARGUMENT", "UNKNOWN_MCP_SERVER", id="unknown"
    ),
    pytest.param(scope_pb2.McpServer(), "INVALID_ARGUMENT", "INVALID_MCP_SERVER", id="empty"),
    pytest.param(
        scope_pb2.McpServer(server="tools", headers={"A": "b"}),
        "INVALID_ARGUMENT",
        "INVALID_MCP_SERVER",
        id="headers-on-a-settings-server",
    ),
    pytest.param(
        scope_pb2.McpServer(url="http://127.0.0.1:1/elsewhere/mcp"),
        "PERMISSION_DENIED",
        "MCP_URL_NOT_ALLOWED",
        id="url-outside-the-allow-list",
    ),
    pytest.param(
        scope_pb2.McpServer(url="http://127.0.0.1:1/allowed"),  # the prefix, less its slash
        "PERMISSION_DENIED",
        "MCP_URL_NOT_ALLOWED",
        id="url-shorter-than-the-prefix",
    ),
    pytest.param(
        scope_pb2.McpServer(url="file:///etc/passwd"),
        "INVALID_ARGUMENT",
        "INVALID_MCP_URL",
        id="not-http",
    ),
    pytest.param(
        scope_pb2.McpServer(url=ALLOWED + "mcp", headers={"X-A": "b\r\nHost: evil"}),
        "INVALID_ARGUMENT",
        "INVALID_MCP_HEADERS",
        id="header-injection",
    ),
    pytest.param(
        scope_pb2.McpServer(url=ALLOWED + "../elsewhere/mcp"),
        "INVALID_ARGUMENT",
        "INVALID_MCP_URL",
        id="dot-segments-out-of-the-prefix",
    ),
    pytest.param(
        scope_pb2.McpServer(url=ALLOWED + "%2e%2e/elsewhere/mcp"),
        "INVALID_ARGUMENT",
        "INVALID_MCP_URL",
        id="encoded-dot-segments",
    ),
    pytest.param(
        scope_pb2.McpServer(url=ALLOWED + "mcp", headers={"Host": "internal"}),
        "INVALID_ARGUMENT",
        "INVALID_MCP_HEADERS",
        id="host-header",
    ),
    pytest.param(
        scope_pb2.McpServer(url=ALLOWED + "mcp", headers={"bad name": "x"}),
        "INVALID_ARGUMENT",
        "INVALID_MCP_HEADERS",
        id="header-name",
    ),
]


@pytest.mark.parametrize(("server", "code", "reason"), ATTACHMENTS)
async def test_what_the_api_may_not_attach(
    make_registry: Any, mark_dir: Path, server: scope_pb2.McpServer, code: str, reason: str
) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools"), mcp_http_allow=[ALLOWED]) as h:
        preset = rpb.CreatePresetRequest(
            preset_id="bad", preset=scope_pb2.Preset(mcp_servers=[server])
        )
        for create in (attach(h, "bad", server), h.stub.CreatePreset(preset)):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await create
            assert caught.value.code().name == code
            info = error_info_of(caught.value)
            assert info is not None and info.reason == reason
        # Nothing stored, nothing started.
        assert not (await h.stub.ListAgents(rpb.ListAgentsRequest())).agents
        assert not (await h.stub.ListPresets(rpb.ListPresetsRequest())).presets
        assert h.registry.admission.live_mcp_servers() == 0


async def test_a_duplicate_attachment_is_refused(make_registry: Any, mark_dir: Path) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await attach(h, "twice", "tools", "tools")
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        info = error_info_of(caught.value)
        assert info is not None and info.reason == "DUPLICATE_MCP_SERVER"


async def test_over_the_scopes_mcp_server_budget(make_registry: Any, mark_dir: Path) -> None:
    settings = mcp_settings(mark_dir, "tools", "silent", agent_limits={"max_mcp_servers": 1})
    async with make_registry(**settings) as h:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await attach(h, "greedy", "tools", "silent")
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info_of(caught.value)
        assert info is not None and info.reason == "ADMISSION_LIMIT"
        assert info.metadata["limit"] == "max_mcp_servers"
        assert not (await h.stub.ListAgents(rpb.ListAgentsRequest())).agents
        assert h.registry.admission.live_mcp_servers() == 0
        # Within its budget the same agent is created and its server runs.
        agent = await attach(h, "greedy", "tools")
        await tools_of(h, agent, "echo")
        assert h.registry.admission.live_mcp_servers(agent) == 1


@pytest.mark.parametrize(
    ("mode", "why"),
    [("malformed", "malformed JSON-RPC"), ("silent", "did not answer initialize")],
)
async def test_a_broken_server_is_down_with_a_reason_and_others_serve(
    make_registry: Any, mark_dir: Path, mode: str, why: str
) -> None:
    # A short bound on initialize for the silent server; long enough for a Python server to
    # start on a loaded machine (a healthy one that misses it is retried after the backoff).
    settings = mcp_settings(mark_dir, "tools", mode, mcp_initialize_timeout_s=4.0)
    async with make_registry(**settings) as h:
        broken = await attach(h, "broken", mode)
        healthy = await attach(h, "healthy", "tools")
        await tools_of(h, healthy, "echo")

        async def reported() -> scope_pb2.McpServer | None:
            status = await server_status(h, broken)
            return status if why in status.last_error else None

        status = await until(reported, f"{mode} reported")
        assert status.state in {"down", "connecting"}
        assert await h.visible(broken) == []
        _, result = await h.execute("echo", {"text": "fine"}, agent=healthy)
        assert jsonvalue.loads(result.value_json) == {"result": "fine"}
        # Each failed attempt's process is gone: the healthy server and at most the broken
        # one's current attempt are alive.
        assert len(servers_of(mark_dir)) <= 2
    assert servers_of(mark_dir) == []


async def test_a_result_over_the_message_limit_fails_that_call(
    make_registry: Any, mark_dir: Path
) -> None:
    limit = 64 * 1024
    async with make_registry(**mcp_settings(mark_dir, "tools"), max_message_bytes=limit) as h:
        agent = await attach(h, "big", "tools")
        await tools_of(h, agent, "huge")
        _, result = await h.execute("huge", {"size": 1000}, agent=agent)
        assert not result.is_error
        _, result = await h.execute("huge", {"size": 4 * limit}, agent=agent, call_id="c2")
        assert result.is_error and result.error.code == "PROVIDER_UNAVAILABLE"
        assert f"more than {limit} bytes" in result.error.message

        async def served() -> bool:
            _, result = await h.execute("echo", {"text": "x"}, agent=agent, call_id="again")
            return not result.is_error

        await until(served, "the server restarted after the oversized message")


async def test_a_flooding_server_does_not_stall_other_tenants(
    make_registry: Any, mark_dir: Path
) -> None:
    settings = mcp_settings(mark_dir, "tools", mcp_messages_per_second=200)
    async with make_registry(**settings) as h:
        flooder = await attach(h, "flooder", "tools")
        bystander = await attach(h, "bystander", "tools")
        await tools_of(h, flooder, "flood")
        await tools_of(h, bystander, "echo")
        request = rpb.ExecuteToolCallRequest(
            agent=flooder, call_id="flood-1", tool_name="flood", arguments_json="{}"
        )
        call = h.stub.ExecuteToolCall(request)

        async def to_the_end() -> list[Any]:
            return [event async for event in call]

        reading = asyncio.ensure_future(to_the_end())
        await until((mark_dir / "flooding").exists, "the flood started")
        for n in range(5):
            _, result = await h.execute("echo", {"text": f"{n}"}, agent=bystander, call_id=f"b{n}")
            assert jsonvalue.loads(result.value_json) == {"result": f"{n}"}
        assert not reading.done()  # the flood goes on, read at its bounded rate
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await reading
        record = await h.settled(flooder, "flood-1")
        assert record.is_error
    assert servers_of(mark_dir) == []
