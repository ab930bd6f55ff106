"""The shape of the read and write streams an MCP SDK session is given (anyio's memory-stream
interface), for the project's own streams that hand messages straight between a pipe and the
session with no task or memory stream in between: `codemode mcp serve`'s stdio wire and the
registry's stdio MCP servers and throttle. A subclass says only how one message is read or
written; the iteration and context-manager protocol the SDK also uses live here once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

import anyio

if TYPE_CHECKING:
    from mcp.shared.message import SessionMessage


class MessageReader:
    """A read stream: `receive` returns the next message (or the exception a line raised, as the
    SDK's own transports pass it on) and raises `anyio.EndOfStream` at the end."""

    async def receive(self) -> SessionMessage | Exception:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class MessageWriter:
    """A write stream: `send` writes one message with `write`; once closed it refuses as anyio's
    streams do (`ClosedResourceError`)."""

    def __init__(self) -> None:
        self._closed = False

    async def write(self, item: SessionMessage) -> None:
        raise NotImplementedError

    async def send(self, item: SessionMessage, /) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        await self.write(item)

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
