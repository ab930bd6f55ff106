"""`codemode mcp serve --transport stdio`: the SDK's stdio transport over a bounded stdin.

The SDK reads stdin line by line with no bound, so one endless line would grow without limit.
Here a daemon thread reads lines of at most `limit` bytes (a blocked read never keeps the
process alive at exit) and an over-long message is drained, never held: it is answered with an
MCP error naming the limit (through the `codemode/refused` method this module registers) when
its id can be found at the message's start or end, and dropped with a log line otherwise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
from collections.abc import AsyncIterator
from typing import IO, TYPE_CHECKING, Any, cast

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

if TYPE_CHECKING:
    from codemode_cli.mcp_adapter import AgentServer

log = logging.getLogger("codemode.mcp")

REFUSED = "codemode/refused"
"""The method an over-long request is replaced with, so that its refusal reaches its id."""
_EDGE = 256  # bytes kept of an over-long line's start and end, to find its id
_ID = r'(-?\d{1,18}|"[^"\\]{0,100}")'
# An SDK writes `{"jsonrpc":"2.0","id":…` (Python) or `…,"id":…}` (TypeScript): an id there
# is the request's own (a nested "id" at the end would be followed by a second `}`).
_ID_AT_START = re.compile(rb'^\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*' + _ID.encode())
_ID_AT_END = re.compile(rb',\s*"id"\s*:\s*' + _ID.encode() + rb"\s*\}\s*$")


class BoundedStdin:
    """stdin's lines, each at most `limit` bytes, as the async iterator the SDK reads."""

    def __init__(self, limit: int, stream: IO[bytes] | None = None) -> None:
        self.limit = limit
        self._stream = stream if stream is not None else sys.stdin.buffer
        self._queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=4)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, args=(loop,), name="mcp-stdin", daemon=True).start()
        while (line := await self._queue.get()) is not None:
            yield line

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        def put(item: str | None) -> None:
            asyncio.run_coroutine_threadsafe(self._queue.put(item), loop).result()

        try:
            while line := self._stream.readline(self.limit + 1):
                if len(line) > self.limit and not line.endswith(b"\n"):
                    refusal = self._refusal(line)
                    if refusal is not None:
                        put(refusal)
                    continue
                put(line.decode("utf-8", errors="replace"))
            put(None)
        except RuntimeError:  # the loop closed: the process is ending
            return

    def _refusal(self, head: bytes) -> str | None:
        """Drains the rest of an over-long line; the refusal request for its id, or None."""
        size, tail = len(head), head[-_EDGE:]
        while chunk := self._stream.readline(1 << 16):
            size += len(chunk)
            tail = (tail + chunk)[-_EDGE:]
            if chunk.endswith(b"\n"):
                break
        found = _ID_AT_START.match(head[:_EDGE]) or _ID_AT_END.search(tail)
        if found is None:
            log.warning("dropped a message of %d bytes (over %d) with no id", size, self.limit)
            return None
        request_id = json.loads(found.group(1))
        params = {"bytes": size, "limit": self.limit}
        return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": REFUSED, "params": params})


class _RefusedParams(types.RequestParams):
    bytes: int
    limit: int


async def _refuse(ctx: Any, params: _RefusedParams) -> types.EmptyResult:
    raise MCPError(
        types.INVALID_REQUEST,
        f"request of {params.bytes} bytes refused: larger than --max-request-bytes "
        f"({params.limit})",
    )


async def serve_stdio(agent: AgentServer, limit: int) -> None:
    """Serves one MCP client on stdin/stdout until stdin closes."""
    agent.server.add_request_handler(REFUSED, _RefusedParams, _refuse)
    stdin = cast("anyio.AsyncFile[str]", BoundedStdin(limit))
    async with stdio_server(stdin=stdin) as (read_stream, write_stream):
        await agent.server.run(read_stream, write_stream, agent.initialization_options())
