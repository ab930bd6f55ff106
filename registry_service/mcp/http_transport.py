"""A streamable-HTTP MCP server: the SDK's transport over an HTTP client the registry bounds.

The attachment's headers and the bearer token (read from its file at every connect) go with
every request. A JSON response body, or one SSE event, is at most `max_message_bytes`: the SDK
bounds SSE events itself (`max_sse_event_size`; an event stream as a whole may last, as the
notification stream does); `_BoundedTransport` bounds every other body, so a server answering
with an endless body fails that request instead of filling the registry's memory.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client

from registry_service.domain.mcp_servers import HttpServer

_CONNECT_TIMEOUT_S = 10.0
# httpx2 logs every request at INFO: one line per tool call of every HTTP MCP server in the
# registry's log (and its URL, query included). The registry's MCP HTTP clients are its only
# httpx2 clients; their failures reach the log as the connection's reasons (connector.py).
logging.getLogger("httpx2").setLevel(logging.WARNING)
_READ_TIMEOUT_S = 300.0


class ResponseTooLarge(httpx2.TransportError):
    pass


class _BoundedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._inner:
            total += len(chunk)
            if total > self._limit:
                raise ResponseTooLarge(f"the server's response is larger than {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, limit: int) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response  # bounded per event by the SDK; a notification stream may last
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        response.stream = _BoundedStream(stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _headers(spec: HttpServer) -> dict[str, str]:
    headers = dict(spec.headers)
    if spec.bearer_token_file:
        token = Path(spec.bearer_token_file).read_text().strip()
        headers["Authorization"] = f"Bearer {token}"
    return headers


@contextlib.asynccontextmanager
async def connected(spec: HttpServer, max_message_bytes: int) -> AsyncIterator[TransportStreams]:
    client = httpx2.AsyncClient(
        headers=_headers(spec),
        timeout=httpx2.Timeout(_CONNECT_TIMEOUT_S, read=_READ_TIMEOUT_S),
        transport=_BoundedTransport(max_message_bytes),
    )
    async with (
        client,
        streamable_http_client(
            spec.url, http_client=client, max_sse_event_size=max_message_bytes
        ) as streams,
    ):
        yield streams
