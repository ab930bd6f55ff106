"""`codemode mcp serve` over stdio as a process: it ends cleanly when stdin closes or on
SIGTERM, refuses an over-long message without holding it (and goes on serving), and announces
a change of the agent's tools as `notifications/tools/list_changed`."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

from tests.codemode.conftest import Stack
from tests.mcp_serve.conftest import INITIALIZE, register_tools, serve_process, stdio_server
from tests.registry.conftest import NATIVE, echo_tool


class Raw:
    """`mcp serve` over stdio, spoken to line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, stack: Stack, agent: str, *extra: str) -> Raw:
        raw = cls(await serve_process(stack.running.address, agent, *extra))
        await raw.send(INITIALIZE)
        assert (await raw.read())["id"] == 1
        await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return raw

    async def send(self, message: Any) -> None:
        await self.send_bytes(json.dumps(message).encode() + b"\n")

    async def send_bytes(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def read(self) -> Any:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        assert line, "the server closed stdout"
        return json.loads(line)

    async def wait(self) -> int:
        code = await asyncio.wait_for(self.proc.wait(), 30)
        assert self.proc.stderr is not None
        err = (await self.proc.stderr.read()).decode()
        assert "Traceback" not in err, err
        return code


@pytest.fixture
async def agent(stack: Stack) -> str:
    register_tools(stack)
    return await stack.code_agent()


async def test_closing_stdin_ends_the_server_cleanly(stack: Stack, agent: str) -> None:
    raw = await Raw.start(stack, agent)
    await raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert [t["name"] for t in (await raw.read())["result"]["tools"]] == ["run_code"]
    assert raw.proc.stdin is not None
    raw.proc.stdin.close()
    assert await raw.wait() == 0


async def test_sigterm_ends_the_server_cleanly(stack: Stack, agent: str) -> None:
    raw = await Raw.start(stack, agent)
    raw.proc.send_signal(signal.SIGTERM)
    assert await raw.wait() == 0


@pytest.mark.parametrize("where", ["id first", "id last"])
async def test_an_over_long_message_is_refused_and_the_server_goes_on(
    stack: Stack, agent: str, where: str
) -> None:
    raw = await Raw.start(stack, agent, "--max-request-bytes", "4096")
    pad = "x" * 100_000
    if where == "id first":  # how the Python SDK writes a request
        text = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_code",'
        text += f'"arguments":{{"code":"{pad}","description":"big"}}}}}}'
    else:  # how the TypeScript SDK does
        text = '{"method":"tools/call","params":{"name":"run_code","arguments":'
        text += f'{{"code":"{pad}","description":"big"}}}},"jsonrpc":"2.0","id":7}}'
    assert json.loads(text)["id"] == 7
    await raw.send_bytes(text.encode() + b"\n")
    refused = await raw.read()
    assert refused["id"] == 7
    assert "larger than --max-request-bytes (4096)" in refused["error"]["message"]
    await raw.send({"jsonrpc": "2.0", "id": 8, "method": "ping"})
    assert (await raw.read()) == {"jsonrpc": "2.0", "id": 8, "result": {}}
    assert raw.proc.stdin is not None
    raw.proc.stdin.close()
    assert await raw.wait() == 0


async def test_a_change_of_the_agents_tools_is_announced(stack: Stack) -> None:
    register_tools(stack)
    agent = await stack.agent("changing", mode=NATIVE)
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    server = stdio_server(stack.running.address, agent, "--watch-interval", "0.2")
    async with Client(server, mode="legacy", message_handler=on_message) as client:
        assert "added" not in {t.name for t in (await client.list_tools()).tools}
        echo_tool(stack.registry, "added", scope=agent)
        await asyncio.wait_for(changed.wait(), 30)
        assert "added" in {t.name for t in (await client.list_tools()).tools}
