"""`codemode mcp serve --transport stdio`: the SDK's stdio transport over a bounded stdin.

The SDK reads stdin line by line with no bound, so one endless line would grow without limit.
Here a daemon thread reads lines of at most `limit` bytes (a blocked read never keeps the
process alive at exit) and an over-long message is drained, never held: it is answered with an
MCP error naming the limit (through the `codemode/refused` method this module registers) when
its id can be found at the message's start or end, and dropped with a log line otherwise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, cast

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

    def __init__(self, limit: int, fd: int = 0) -> None:
        self.limit = limit
        self._fd = fd
        self._queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=4)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, args=(loop,), name="mcp-stdin", daemon=True).start()
        while (line := await self._queue.get()) is not None:
            yield line

    def _pump(self, loop: asyncio.AbstractEventLoop) -> None:
        def put(item: str | None) -> None:
            asyncio.run_coroutine_threadsafe(self._queue.put(item), loop).result()

        try:
            for line in self._read():
                put(line)
            put(None)
        except (RuntimeError, concurrent.futures.CancelledError):
            return  # the loop closed or stopped waiting: the process is ending

    def _read(self) -> Iterator[str]:
        """Lines (with refusals in place of over-long ones) until EOF. Raw `os.read` on the
        descriptor: a buffered reader's lock, held by this thread while it waits, would abort
        the interpreter at exit."""
        pending = bytearray()
        over: _OverLong | None = None
        while True:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except OSError as exc:  # stdin broke: the session ends as at EOF
                log.warning("cannot read stdin: %s", exc)
                return
            if not chunk:
                return
            while chunk:
                cut = chunk.find(b"\n")
                piece, chunk = (chunk, b"") if cut < 0 else (chunk[: cut + 1], chunk[cut + 1 :])
                if over is None and len(pending) + len(piece) > self.limit:
                    over = _OverLong(bytes((pending + piece)[:_EDGE]), bytes(pending))
                    pending.clear()
                if over is not None:
                    over.add(piece)
                    if cut >= 0:
                        refusal = over.refusal(self.limit)
                        over = None
                        if refusal is not None:
                            yield refusal
                    continue
                pending += piece
                if cut >= 0:
                    yield pending.decode("utf-8", errors="replace")
                    pending.clear()


class _OverLong:
    """An over-long line being drained: its size, start and end (to find its id)."""

    def __init__(self, head: bytes, before: bytes) -> None:
        """`head`: the line's first bytes; `before`: what was read of it before this piece."""
        self.head, self.tail, self.size = head, before[-_EDGE:], len(before)

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        self.tail = (self.tail + piece)[-_EDGE:]

    def refusal(self, limit: int) -> str | None:
        """The refusal request for the line's id, or None (no id found: dropped)."""
        found = _ID_AT_START.match(self.head) or _ID_AT_END.search(self.tail)
        if found is None:
            log.warning("dropped a message of %d bytes (over %d) with no id", self.size, limit)
            return None
        request_id = json.loads(found.group(1))
        params = {"bytes": self.size, "limit": limit}
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
