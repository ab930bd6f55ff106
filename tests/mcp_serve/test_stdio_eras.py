"""`mcp serve`'s stdio wire chooses the protocol era itself (codemode_cli/mcp_stdio.py, `_serve`)
instead of `Server.run`, which relays every message through a task and a memory stream: the
same choice as the SDK's (the client's first request decides, once; what came before it is
replayed), each era's loop reading the wire's own stream, and no relay task while it serves.

Driven over real pipes in this process, against the SDK's lowlevel `Server` (the choice does not
depend on what the server serves)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import pytest
from mcp.server.lowlevel import NotificationOptions, Server

from codemode_cli.mcp_stdio import _serve, wire_streams

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
ENVELOPE = {
    types.PROTOCOL_VERSION_META_KEY: "2026-07-28",
    types.CLIENT_INFO_META_KEY: {"name": "probe", "version": "0"},
    types.CLIENT_CAPABILITIES_META_KEY: {},
}
TOOL = types.Tool(name="echo", input_schema={"type": "object"})


class Client:
    """The client's ends of the two pipes, and the serving task."""

    def __init__(self, write_fd: int, reader: asyncio.StreamReader, task: asyncio.Task[None]):
        self._write_fd, self._reader, self.task = write_fd, reader, task

    def send(self, *messages: Any) -> None:
        for message in messages:
            data = message if isinstance(message, bytes) else json.dumps(message).encode()
            os.write(self._write_fd, data + b"\n")

    async def read(self) -> Any:
        line = await asyncio.wait_for(self._reader.readline(), 30)
        assert line, "the server closed its stdout"
        return json.loads(line)

    def close_input(self) -> None:
        os.close(self._write_fd)


async def _list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[TOOL])


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    server: Server[Any] = Server("eras", on_list_tools=_list_tools)
    options = server.create_initialization_options(NotificationOptions())
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()

    async def serve() -> None:
        async with wire_streams(in_read, out_write, 1 << 20) as (incoming, outgoing):
            await _serve(server, incoming, outgoing, options)

    task = asyncio.create_task(serve())
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(out_read, "rb", buffering=0)
    )
    wire = Client(in_write, reader, task)
    try:
        yield wire
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        transport.close()
        for fd in (in_write, in_read, out_write):
            with contextlib.suppress(OSError):  # already closed by the test
                os.close(fd)


def _awaiting(task: asyncio.Task[Any]) -> list[str]:
    """What `task` is suspended in, outermost first (the chain of coroutines it awaits)."""
    names: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        names.append(getattr(awaited, "__qualname__", type(awaited).__name__))
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return names


def _reads_the_wire_itself(serving: asyncio.Task[None]) -> bool:
    """No task runs the SDK's era relay (`Server.run`'s `replay_then_relay`, which would hold
    the wire's `_Incoming.receive`), and the serving loop waits in `_Incoming.receive` itself."""
    relays = [
        t for t in asyncio.all_tasks() if any("replay_then_relay" in name for name in _awaiting(t))
    ]
    return not relays and "_Incoming.receive" in _awaiting(serving)


async def test_the_handshake_opens_the_legacy_era_after_what_came_before_it(
    client: Client,
) -> None:
    # A line before the first request is replayed to the chosen loop, which skips it as the
    # SDK does; the handshake then opens the legacy era.
    client.send(b"not JSON", INITIALIZE, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    opened = await client.read()
    assert opened["id"] == 1 and opened["result"]["protocolVersion"] == "2025-11-25"
    client.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    listed = await client.read()
    assert [t["name"] for t in listed["result"]["tools"]] == ["echo"]
    assert _reads_the_wire_itself(client.task)
    # The era is chosen once: an enveloped request is refused on a legacy connection.
    client.send({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": ENVELOPE}})
    refused = await client.read()
    assert refused["id"] == 3 and refused["error"]["code"] == types.INVALID_REQUEST
    client.close_input()
    await asyncio.wait_for(client.task, 30)  # the end of stdin ends the session


async def test_an_enveloped_first_request_opens_the_modern_era(client: Client) -> None:
    client.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": ENVELOPE}})
    listed = await client.read()
    assert listed["id"] == 7 and [t["name"] for t in listed["result"]["tools"]] == ["echo"]
    assert _reads_the_wire_itself(client.task)
    # The handshake is refused on a modern connection, naming the era it serves.
    client.send(INITIALIZE)
    refused = await client.read()
    assert refused["id"] == 1
    assert refused["error"]["code"] == types.UNSUPPORTED_PROTOCOL_VERSION
    assert "2026-07-28" in refused["error"]["message"]
    client.close_input()
    await asyncio.wait_for(client.task, 30)


async def test_stdin_ending_before_any_request_ends_the_session(client: Client) -> None:
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    client.close_input()
    await asyncio.wait_for(client.task, 30)
    assert client.task.exception() is None
