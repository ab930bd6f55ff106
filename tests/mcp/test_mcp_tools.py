"""MCP servers as tool providers, through the registry's gRPC API: a scope attaches a real MCP
server (stdio, supervised by the registry; or streamable HTTP), its tools enter that scope's
catalog and pass the one pipeline, and their results map losslessly."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2, tool_pb2
from tests.mcp.conftest import (
    alive,
    attach,
    http_server,
    mcp_settings,
    server_status,
    tools_of,
    until,
)
from tests.mcp.mcp_test_server import PNG
from tests.registry.conftest import blocks_of, error_info_of



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
        assert jsonvalue.loads(by_name["add"].input_schema_json)["required"] == ["a", "b"]

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
