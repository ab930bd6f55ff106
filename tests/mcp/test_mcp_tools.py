"""MCP servers as tool providers, through the registry's gRPC API: a scope attaches a real MCP
server (stdio, supervised by the registry; or streamable HTTP), its tools enter that scope's
catalog and pass the one pipeline, and their results map losslessly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_client import RegistryClient
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2, tool_pb2
from tests.mcp.conftest import (
    alive,
    attach,
    free_port,
    http_server,
    mcp_settings,
    server_status,
    tools_of,
    until,
)
from tests.mcp.mcp_test_server import PNG
from tests.registry.conftest import blocks_of


def value(result: tool_pb2.ToolResult) -> Any:
    assert not result.is_error, result.error.message
    return jsonvalue.loads(result.value_json)


async def test_tools_results_and_refusals(make_registry: Any, mark_dir: Path) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "a1", "tools")
        other = await h.agent("bystander")
        visible = await tools_of(h, agent, "add", "echo", "picture", "fail")
        # Only the attaching scope gets them; the tool the catalog cannot express is refused
        # alone, with its reason where operators look.
        assert "add" not in await h.visible(other)
        assert "unexpressible" not in visible
        status = await server_status(h, agent)
        assert status.server == "tools" and status.state == "ready"
        assert any(r.startswith("unexpressible:") and "not" in r for r in status.refused_tools)
        listed = await h.stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent))
        by_name = {t.name: t for t in listed.tools}
        assert by_name["add"].concurrency == tool_pb2.CONCURRENCY_SAFE  # readOnlyHint
        assert by_name["echo"].concurrency == tool_pb2.CONCURRENCY_EXCLUSIVE
        schema = jsonvalue.loads(by_name["add"].input_schema_json)
        assert isinstance(schema, dict) and schema["required"] == ["a", "b"]

        _, result = await h.execute("add", {"a": 2, "b": 3}, agent=agent)
        assert value(result) == {"sum": 5}
        _, result = await h.execute("echo", {"text": "hé"}, agent=agent, call_id="c2")
        assert value(result) == {"result": "hé"}
        _, result = await h.execute("picture", agent=agent, call_id="c3")
        assert blocks_of(result.content) == [("text", "a red dot"), ("image", ("image/png", PNG))]
        _, result = await h.execute("fail", {"why": "no"}, agent=agent, call_id="c4")
        assert result.is_error and result.error.code == "MCP_TOOL_ERROR"
        assert "refused: no" in result.error.message
        # The pipeline checks arguments before the server sees them.
        _, result = await h.execute("add", {"a": "x", "b": 1}, agent=agent, call_id="c5")
        assert result.is_error and result.error.code == "INVALID_ARGS"
        # The server lies about its output schema: the call fails on its own.
        _, result = await h.execute("lie", agent=agent, call_id="c6")
        assert result.is_error and result.error.code == "INVALID_TOOL_OUTPUT"
        record = await h.settled(agent, "c4")
        assert record.is_error
        # Direct calls are the scope's only: the bystander does not know the tool.
        _, result = await h.execute("add", {"a": 1, "b": 1}, agent=other, call_id="c7")
        assert result.is_error and result.error.code == "UNKNOWN_TOOL"


async def test_a_stdio_server_is_an_isolated_supervised_child(
    make_registry: Any, mark_dir: Path
) -> None:
    """Own process group, the declared args and cwd, only the environment the settings give,
    the unprivileged user when the registry is root; deleting the scope stops it and gives its
    admission slot back."""
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "iso", "tools")
        await tools_of(h, agent, "pid", "env", "cwd_args")
        assert h.registry.admission.live_mcp_servers(agent) == 1
        # The declared args and cwd (the settings say "/"), not the registry's own.
        _, result = await h.execute("cwd_args", agent=agent, call_id="c0")
        assert value(result) == {"cwd": "/", "args": ["tools"]}
        _, result = await h.execute("pid", agent=agent)
        info = value(result)
        assert info["pgid"] == info["pid"]
        if os.geteuid() == 0:
            assert info["uid"] == pwd.getpwnam("nobody").pw_uid
        else:
            assert info["uid"] == os.geteuid()
        _, result = await h.execute("env", agent=agent, call_id="c2")
        env = value(result)
        env.pop("LC_CTYPE", None)  # CPython's own locale coercion may add it
        assert env == {"PYTHONPATH": env["PYTHONPATH"], "MCP_TEST_DIR": str(mark_dir)}
        await h.stub.DeleteAgent(rpb.DeleteAgentRequest(name=agent))
        await h.registry.mcp.settled()
        assert not alive(info["pid"])
        assert h.registry.admission.live_mcp_servers(agent) == 0


async def test_stopping_the_registry_leaves_no_process(make_registry: Any, mark_dir: Path) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "stopper", "tools")
        await tools_of(h, agent, "pid")
        _, result = await h.execute("pid", agent=agent)
        pid = value(result)["pid"]
        assert alive(pid)
    assert not alive(pid)  # the registry's stop returned: the server's group is gone


async def test_a_crashed_server_fails_at_once_then_restarts(
    make_registry: Any, mark_dir: Path
) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "crashy", "tools")
        await tools_of(h, agent, "crash", "pid")
        _, result = await h.execute("pid", agent=agent)
        first = value(result)["pid"]
        (mark_dir / "hold").write_text("")  # the restarted server waits before it serves
        _, result = await h.execute("crash", agent=agent, call_id="c2")
        assert result.is_error and result.error.code == "PROVIDER_UNAVAILABLE"
        # Down: its tools are still listed and fail at once, never waiting for the restart.
        assert "pid" in await h.visible(agent)
        _, result = await h.execute("pid", agent=agent, call_id="c3")
        assert result.is_error and result.error.code == "PROVIDER_UNAVAILABLE"
        assert "exited" in result.error.message
        assert (await server_status(h, agent)).state in {"down", "connecting"}
        (mark_dir / "hold").unlink()

        async def served() -> Any:
            _, result = await h.execute("pid", agent=agent, call_id="again")
            return None if result.is_error else value(result)

        again = await until(served, "the restarted server serves")
        assert again["pid"] != first
        assert not alive(first)


async def test_tools_list_changed_updates_the_catalog(make_registry: Any, mark_dir: Path) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "grower", "tools")
        await tools_of(h, agent, "grow")
        _, result = await h.execute("grow", agent=agent)
        assert value(result) == {"result": "grown"}

        async def changed() -> bool:
            visible = await h.visible(agent)
            return "extra" in visible and "grow" not in visible

        await until(changed, "the re-listed tools")
        _, result = await h.execute("extra", agent=agent, call_id="c2")
        assert value(result) == {"result": "extra here"}


async def test_a_callers_abort_cancels_the_call_on_the_server(
    make_registry: Any, mark_dir: Path
) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "canceller", "tools")
        await tools_of(h, agent, "slow")
        request = rpb.ExecuteToolCallRequest(
            agent=agent, call_id="slow-1", tool_name="slow", arguments_json='{"marker": "m1"}'
        )
        call = h.stub.ExecuteToolCall(request)
        reading = asyncio.ensure_future(call.read())
        await until((mark_dir / "started-m1").exists, "the server runs the call")
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await reading
        await until((mark_dir / "cancelled-m1").exists, "notifications/cancelled")
        record = await h.settled(agent, "slow-1")
        assert record.is_error
        # The server goes on serving after a cancellation.
        _, result = await h.execute("echo", {"text": "still"}, agent=agent, call_id="c2")
        assert value(result) == {"result": "still"}


async def test_a_streamable_http_server(make_registry: Any, mark_dir: Path, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    async with http_server(mark_dir) as url:
        prefix = url.rsplit("/", 1)[0] + "/"
        declared = {"url": url, "bearer_token_file": str(token)}
        settings = {"mcp_servers": {"remote": declared}, "max_message_bytes": 64 * 1024}
        async with make_registry(mcp_http_allow=[prefix], **settings) as h:
            operator = await attach(h, "operators", "remote")
            await tools_of(h, operator, "whoami")
            _, result = await h.execute("whoami", agent=operator)
            assert value(result) == {"authorization": "Bearer s3cret"}
            # A response body over the registry's message limit fails that call.
            _, result = await h.execute("huge", {"size": 256 * 1024}, agent=operator, call_id="h")
            assert result.is_error and result.error.code == "PROVIDER_UNAVAILABLE"
            assert "65536 byte limit" in result.error.message
            _, result = await h.execute("whoami", agent=operator, call_id="after")
            assert value(result) == {"authorization": "Bearer s3cret"}
            server = scope_pb2.McpServer(url=url, headers={"X-Tenant": "secret-value"})
            agent = await attach(h, "remote", server)
            await tools_of(h, agent, "add", "picture")
            _, result = await h.execute("add", {"a": 40, "b": 2}, agent=agent)
            assert value(result) == {"sum": 42}
            _, result = await h.execute("picture", agent=agent, call_id="c2")
            assert blocks_of(result.content)[1] == ("image", ("image/png", PNG))
            _, result = await h.execute("fail", {"why": "http"}, agent=agent, call_id="c3")
            assert result.is_error and result.error.code == "MCP_TOOL_ERROR"
            _, result = await h.execute("whoami", agent=agent, call_id="c4")
            assert value(result) == {"x-tenant": "secret-value"}
            status = await server_status(h, agent)
            assert status.url == url and dict(status.headers) == {"X-Tenant": ""}


async def test_attachments_are_stored_with_the_scope(
    make_registry: Any, mark_dir: Path, database: dict[str, Any]
) -> None:
    """A registry restarted on the same store connects the stored attachments again."""
    settings = {**mcp_settings(mark_dir, "tools"), **database}
    async with make_registry(**settings) as h:
        agent = await attach(h, "durable", "tools")
        await tools_of(h, agent, "echo")
    async with make_registry(**settings) as h:
        assert (await server_status(h, agent)).server == "tools"
        await tools_of(h, agent, "echo")
        _, result = await h.execute("echo", {"text": "back"}, agent=agent)
        assert value(result) == {"result": "back"}


async def test_a_settings_declared_agent_attaches_by_name(
    make_registry: Any, mark_dir: Path
) -> None:
    settings = mcp_settings(mark_dir, "tools", agents=[{"id": "ops", "mcp_servers": ["tools"]}])
    async with make_registry(**settings) as h:
        await tools_of(h, "agents/ops", "add")
        _, result = await h.execute("add", {"a": 1, "b": 1}, agent="agents/ops")
        assert value(result) == {"sum": 2}


async def test_a_presets_server_serves_its_agents(make_registry: Any, mark_dir: Path) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        response = await h.stub.CreatePreset(
            rpb.CreatePresetRequest(
                preset_id="team",
                preset=scope_pb2.Preset(mcp_servers=[scope_pb2.McpServer(server="tools")]),
            )
        )
        preset = response.preset.name
        member = await h.agent("member", preset=preset)
        outsider = await h.agent("outsider")
        await tools_of(h, member, "echo")
        assert "echo" not in await h.visible(outsider)
        assert h.registry.admission.live_mcp_servers(preset) == 1  # one process, the preset's
        _, result = await h.execute("echo", {"text": "inherited"}, agent=member)
        assert value(result) == {"result": "inherited"}
        listed = await h.stub.ListPresets(rpb.ListPresetsRequest())
        assert [s.server for s in listed.presets[0].mcp_servers] == ["tools"]
        assert listed.presets[0].mcp_servers[0].state == "ready"


async def test_a_servers_stderr_is_logged_line_by_line_cut(
    make_registry: Any, mark_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="registry_service.mcp.stdio_transport")
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "loud", "tools")
        await tools_of(h, agent, "shout")
        _, result = await h.execute("shout", {"text": "hello on stderr"}, agent=agent)
        assert value(result) == {"result": "shouted"}

        def logged() -> list[str]:
            return [r.getMessage() for r in caplog.records if "stderr" in r.getMessage()]

        await until(lambda: len(logged()) >= 2, "the stderr lines logged")
        hello, long = logged()[-2:]
        assert hello.endswith("hello on stderr")
        assert long.endswith("y" * 100) and len(long) < 1024 + 100


async def test_the_python_client_attaches_by_name(make_registry: Any, mark_dir: Path) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        async with RegistryClient(h.running.address) as client:
            agent = await client.create_agent("via-client", mcp_servers=["tools"])
            assert [s.server for s in agent.mcp_servers] == ["tools"]
        await tools_of(h, agent.name, "echo")


async def test_a_restarted_http_server_is_reconnected(make_registry: Any, mark_dir: Path) -> None:
    """The server going away fails calls PROVIDER_UNAVAILABLE; once it is back (a new process,
    its sessions gone), the registry connects again and its tools serve."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    async with make_registry(mcp_http_allow=[f"http://127.0.0.1:{port}/"]) as h:
        async with http_server(mark_dir, port) as first:
            agent = await attach(h, "remote", scope_pb2.McpServer(url=first))
            await tools_of(h, agent, "echo")
            _, result = await h.execute("echo", {"text": "1"}, agent=agent)
            assert value(result) == {"result": "1"}
        _, result = await h.execute("echo", {"text": "2"}, agent=agent, call_id="c2")
        assert result.is_error and result.error.code == "PROVIDER_UNAVAILABLE"
        async with http_server(mark_dir, port) as second:
            assert second == url

            async def served() -> bool:
                _, result = await h.execute("echo", {"text": "3"}, agent=agent, call_id="c3")
                return not result.is_error

            await until(served, "the restarted HTTP server serves")
