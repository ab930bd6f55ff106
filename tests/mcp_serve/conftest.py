"""`codemode mcp serve` as a real child process against a real registry and runtime.

The registry and runtime run in the test process (`tests/codemode/conftest.py`'s stack, real
gRPC on loopback, real workers) with in-process tools, so a test sees every invocation; the
MCP server is the `codemode` command, started by the MCP client SDK (stdio) or by the test
(HTTP, which prints its URL and secret).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters

from codemode_wire.jsonvalue import JsonValue
from tests.cli._processes import spawn
from tests.codemode.conftest import Stack, make_stack

__all__ = ["make_stack"]  # re-exported fixture

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "codemode_cli"]
DOUBLE_SCHEMA: JsonValue = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"},
    },
}
"""A handshake-era `initialize` request, for tests that speak MCP by hand."""


async def serve_process(registry: str, agent: str, *extra: str) -> asyncio.subprocess.Process:
    """`mcp serve` as a child with all three standard streams piped."""
    return await asyncio.create_subprocess_exec(
        *serve_argv(registry, agent, *extra),
        env=child_env(),
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def serve_argv(registry: str, agent: str, *extra: str) -> list[str]:
    return [*CLI, "mcp", "serve", "--registry", registry, "--agent", agent, *extra]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}


def stdio_server(registry: str, agent: str, *extra: str) -> StdioServerParameters:
    argv = serve_argv(registry, agent, *extra)
    return StdioServerParameters(command=argv[0], args=argv[1:], env=child_env(), cwd=REPO)


@dataclass
class Tools:
    """What the in-process tools saw."""

    doubled: list[int] = field(default_factory=list)
    hang_started: asyncio.Event = field(default_factory=asyncio.Event)
    hang_aborted: asyncio.Event = field(default_factory=asyncio.Event)
    workers: list[int] = field(default_factory=list)


def register_tools(stack: Stack, scope: str = "") -> Tools:
    seen = Tools()

    async def double(inv: Any) -> Any:
        seen.doubled.append(inv.arguments["n"])
        return {"doubled": inv.arguments["n"] * 2}

    async def hang(inv: Any) -> Any:
        seen.workers.append(inv.arguments.get("uid", -1))
        seen.hang_started.set()
        await inv.signal.wait()
        seen.hang_aborted.set()
        return "finished anyway"

    async def broken(inv: Any) -> Any:
        raise RuntimeError("the disk is on fire")

    stack.registry.register_tool(
        "double",
        double,
        description="Double an integer.",
        input_schema=DOUBLE_SCHEMA,
        concurrency_safe=True,
        scope=scope,
    )
    stack.registry.register_tool("hang", hang, description="Wait until aborted.", scope=scope)
    stack.registry.register_tool("broken", broken, description="Always fails.", scope=scope)
    return seen


@pytest.fixture
async def stack(make_stack: Any) -> AsyncIterator[Stack]:
    async with make_stack() as s:
        yield s


@dataclass
class HttpServer:
    proc: subprocess.Popen[str]
    url: str
    secret: str


async def start_http(registry: str, agent: str, *extra: str, log: Path) -> HttpServer:
    """`mcp serve --transport http` on a free loopback port; its URL and secret from stdout
    (read on a thread: the registry it asks first runs on this event loop)."""
    proc, lines = spawn(
        serve_argv(registry, agent, "--transport", "http", *extra), child_env(), REPO, log
    )
    url_line = await asyncio.to_thread(lines.expect, lambda line: " on http://" in line, 60)
    secret_line = await asyncio.to_thread(lines.expect, lambda line: "Bearer " in line, 10)
    return HttpServer(proc, url_line.rsplit(" ", 1)[1], secret_line.rsplit(" ", 1)[1])


def stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise


@pytest.fixture
def http_servers() -> Iterator[list[HttpServer]]:
    started: list[HttpServer] = []
    yield started
    for server in started:
        stop(server.proc)
