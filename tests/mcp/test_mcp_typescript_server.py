"""An MCP server written with the official TypeScript SDK (tests/mcp_serve/node/tool_server.mjs,
its `McpServer` and zod schemas) as a scope's tool provider, over stdio as the registry's
supervised child and over streamable HTTP: its tools enter the catalog with the schemas that SDK
writes (draft-07 `$schema`, integer bounds), and its results map as the Python SDK's do."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import tool_pb2
from tests.mcp.conftest import attach, free_port, server_status, tools_of, until
from tests.mcp.mcp_test_server import PNG
from tests.registry.conftest import blocks_of

NODE_DIR = Path(__file__).resolve().parents[1] / "mcp_serve" / "node"
SERVER = NODE_DIR / "tool_server.mjs"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE is None or not (NODE_DIR / "node_modules").is_dir(),
    reason="needs node and scripts/bootstrap's npm install in tests/mcp_serve/node",
)


def stdio_settings() -> dict[str, Any]:
    assert NODE is not None
    # Its whole environment is empty: node needs nothing of the registry's.
    return {"command": NODE, "args": [str(SERVER), "stdio"], "env": {}, "cwd": "/"}


@contextlib.asynccontextmanager
async def http_ts_server() -> AsyncIterator[str]:
    assert NODE is not None
    port = free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 - it returns at once
        [NODE, str(SERVER), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        await until(listening, "the TypeScript HTTP MCP server listens")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        await asyncio.to_thread(process.wait)


async def _check_tools(h: Any, agent: str) -> None:
    await tools_of(h, agent, "add", "picture", "quote", "fail")
    status = await server_status(h, agent)
    assert status.state == "ready" and not status.refused_tools
    listed = await h.stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent))
    by_name = {t.name: t for t in listed.tools}
    assert by_name["add"].concurrency == tool_pb2.CONCURRENCY_SAFE  # readOnlyHint
    assert by_name["quote"].concurrency == tool_pb2.CONCURRENCY_EXCLUSIVE
    schema = jsonvalue.loads(by_name["add"].input_schema_json)
    assert isinstance(schema, dict) and schema["required"] == ["a", "b"]
    output = jsonvalue.loads(by_name["add"].output_schema_json)
    assert isinstance(output, dict) and output["required"] == ["sum"]

    _, result = await h.execute("add", {"a": 2, "b": 3}, agent=agent, call_id="t1")
    assert not result.is_error and jsonvalue.loads(result.value_json) == {"sum": 5}
    # The pipeline checks arguments against the zod-written schema before the server sees them.
    _, result = await h.execute("add", {"a": 1.5, "b": 1}, agent=agent, call_id="t2")
    assert result.is_error and result.error.code == "INVALID_ARGS"
    _, result = await h.execute("picture", agent=agent, call_id="t3")
    assert blocks_of(result.content) == [("text", "a red dot"), ("image", ("image/png", PNG))]
    # Blocks the pipeline has no kind of its own for: JSON blocks holding the MCP block as sent.
    _, result = await h.execute("quote", agent=agent, call_id="t4")
    assert not result.is_error
    blocks = [(kind, jsonvalue.loads(text)) for kind, text in blocks_of(result.content)]
    assert blocks == [
        (
            "json",
            {
                "type": "resource",
                "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain", "text": "hello"},
            },
        ),
        ("json", {"type": "resource_link", "uri": "file:///notes.txt", "name": "notes"}),
    ]
    _, result = await h.execute("fail", {"why": "ts"}, agent=agent, call_id="t5")
    assert result.is_error and result.error.code == "MCP_TOOL_ERROR"
    assert "refused: ts" in result.error.message
    record = await h.settled(agent, "t5")
    assert record.is_error and record.error_code == "MCP_TOOL_ERROR"


async def test_a_typescript_sdk_server_over_stdio(make_registry: Any) -> None:
    async with make_registry(mcp_servers={"ts": stdio_settings()}) as h:
        agent = await attach(h, "ts-stdio", "ts")
        await _check_tools(h, agent)


async def test_a_typescript_sdk_server_over_streamable_http(
    make_registry: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with http_ts_server() as url, make_registry(mcp_servers={"ts": {"url": url}}) as h:
        agent = await attach(h, "ts-http", "ts")
        await _check_tools(h, agent)
    # The HTTP client's own per-request line is not in the registry's log at INFO.
    assert not [r for r in caplog.records if r.name.startswith("httpx2")]
