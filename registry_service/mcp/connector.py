"""The `McpConnector` port over the official MCP Python SDK's `ClientSession`.

A session's task group must be entered and left by one task, so each connection runs in a task
of its own (`_Connection._main`) that holds the transport and the session until the connection
is closed or ends; calls are made from the callers' tasks. Cancelling a call's task makes the
SDK send `notifications/cancelled` for it. A call given a `progress` sends a progress token
(the SDK's `progress_callback`), and each `notifications/progress` for it goes to `progress`
(`Invocation.progress`, which bounds what reaches the caller: registry_service/domain/events.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from typing import Any

import mcp_types
from mcp.client._transport import ReadStream, TransportStreams, WriteStream
from mcp.client.session import ClientSession
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import TypeAdapter, ValidationError

from codemode_common.mcp_streams import MessageReader
from registry_service.domain.json_admission import JsonLimits
from registry_service.domain.mcp_servers import (
    ConnectionEvents,
    HttpServer,
    McpCallFailed,
    McpConnectionLost,
    Progress,
    ServerSpec,
    StdioServer,
)
from registry_service.domain.providers import ToolSpec
from registry_service.domain.results import INVALID_TOOL_OUTPUT, ToolResult
from registry_service.mcp import http_transport, stdio_transport
from registry_service.mcp.mapping import tool_result, tool_spec

try:  # present with the model SDKs' clients; without it anyio asks asyncio itself, cheaply
    import sniffio

    _LIBRARY: ContextVar[str | None] | None = sniffio.current_async_library_cvar
except ImportError:  # pragma: no cover - the dev environment has it
    _LIBRARY = None

log = logging.getLogger(__name__)

__all__ = ["MCP_SERVER_ERROR", "SdkConnector"]

MCP_SERVER_ERROR = "MCP_SERVER_ERROR"
"""The code of a call the server answered with a JSON-RPC error (not a tool result)."""
_MAX_LIST_PAGES = 16
_MAX_TOOLS = 512
_CLIENT = mcp_types.Implementation(name="codemode-registry", version="1")
_WIRE: TypeAdapter[Any] = TypeAdapter(Any)
"""A result type that returns the session's already-checked wire result unchanged."""


@contextlib.contextmanager
def _asyncio_declared() -> Iterator[None]:
    """Tells sniffio, for the current task, that asyncio runs it, as `anyio.run` does for its
    own loop: the registry's loop comes from `asyncio.run`, so every anyio primitive the SDK's
    session uses per message (streams, cancel scopes, `fail_after`) would otherwise sniff for
    the running library each time."""
    if _LIBRARY is None:
        yield
        return
    token = _LIBRARY.set("asyncio")
    try:
        yield
    finally:
        _LIBRARY.reset(token)


class _Throttled(MessageReader):
    """`source`'s messages at most `rate` a second (a token bucket of one second's worth), taken
    as the session asks for the next one: past the rate that read waits, and so does the
    transport behind it (a stdio server on its own pipe), so a flooding server costs the event
    loop a bounded rate. A read stream itself: no task or stream hop of its own."""

    def __init__(self, source: ReadStream[SessionMessage | Exception], rate: float) -> None:
        self._source, self._rate = source, rate
        self._tokens, self._at = rate, time.monotonic()

    async def receive(self) -> SessionMessage | Exception:
        now = time.monotonic()
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            await asyncio.sleep((1 - self._tokens) / self._rate)
            self._tokens = 1
        self._tokens -= 1
        return await self._source.receive()

    async def aclose(self) -> None:
        await self._source.aclose()


class _Connection:
    def __init__(
        self, label: str, events: ConnectionEvents, max_depth: int, messages_per_second: float
    ) -> None:
        self._rate = messages_per_second
        self._label = label
        self._events = events
        self._max_depth = max_depth
        self._session: ClientSession | None = None
        self._ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _end(self, why: str) -> None:
        if not self._ended.done():
            self._ended.set_result(why)

    async def open(
        self, transport: Callable[[], AbstractAsyncContextManager[TransportStreams]]
    ) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._main(transport, ready), name=f"mcp {self._label}")
        try:
            await ready
        except BaseException:
            await self.close()
            raise

    async def _main(
        self,
        transport: Callable[[], AbstractAsyncContextManager[TransportStreams]],
        ready: asyncio.Future[None],
    ) -> None:
        try:
            # The session's own tasks (its receive loop) inherit the declaration.
            with _asyncio_declared():
                async with transport() as (source, write):
                    await self._session_over(_Throttled(source, self._rate), write, ready)
        except BaseException as exc:
            if isinstance(exc, Exception) and not self._ended.done():
                # A transport that knows why it ended (a stdio child's exit, a malformed
                # line) says so a moment before the session sees its streams close.
                await asyncio.wait({asyncio.shield(self._ended)}, timeout=0.5)
            why = self._ended.result() if self._ended.done() else _describe(exc)
            if not ready.done():
                ready.set_exception(McpConnectionLost(why))
            self._end(why)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._session = None
            self._end("the connection was closed")

    async def _session_over(
        self,
        read: ReadStream[SessionMessage | Exception],
        write: WriteStream[SessionMessage],
        ready: asyncio.Future[None],
    ) -> None:
        async with ClientSession(
            read,
            write,
            message_handler=self._on_message,
            logging_callback=self._on_log,
            client_info=_CLIENT,
        ) as session:
            await session.initialize()
            self._session = session
            ready.set_result(None)
            stop: asyncio.Future[object] = asyncio.ensure_future(self._stop.wait())
            ended: asyncio.Future[object] = asyncio.ensure_future(asyncio.shield(self._ended))
            try:
                await asyncio.wait({stop, ended}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                ended.cancel()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._events.tools_changed()
        elif isinstance(message, Exception):
            log.debug("MCP server %s: transport error: %s", self._label, message)

    async def _on_log(self, params: mcp_types.LoggingMessageNotificationParams) -> None:
        log.debug("MCP server %s log (%s): %.200s", self._label, params.level, params.data)

    def ended_with(self, future: asyncio.Future[str]) -> None:
        """A transport that knows when it ended (a stdio child) ends the connection too."""
        future.add_done_callback(lambda f: self._end(f.result()))

    def _live(self) -> ClientSession:
        if self._ended.done():
            raise McpConnectionLost(self._ended.result())
        if self._session is None:
            raise McpConnectionLost("not connected")
        return self._session

    async def list_tools(self) -> tuple[list[ToolSpec], list[str]]:
        session = self._live()
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            params = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
            page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None or len(tools) >= _MAX_TOOLS:
                break
        specs: list[ToolSpec] = []
        refused: list[str] = [f"{t.name}: over {_MAX_TOOLS} tools" for t in tools[_MAX_TOOLS:]]
        for tool in tools[:_MAX_TOOLS]:
            try:
                specs.append(tool_spec(tool, self._max_depth))
            except McpCallFailed as exc:
                refused.append(f"{tool.name}: {exc.message}")
        return specs, refused

    async def call(
        self,
        name: str,
        arguments_json: str,
        deadline_s: float | None,
        progress: Progress | None = None,
    ) -> ToolResult:
        session = self._live()
        on_progress = None if progress is None else _progress_callback(progress)
        arguments = json.loads(arguments_json)
        try:
            # `send_request`, not `call_tool`: the pipeline validates the value against the
            # tool's output schema itself (one check, one error code), so the SDK's second
            # jsonschema pass over every result is not paid. The session checks the result
            # against the negotiated version's MCP schema before it returns it; `_WIRE` takes
            # it as it is (no second parse into the SDK's models) and `tool_result` maps that.
            request = mcp_types.CallToolRequest(
                params=mcp_types.CallToolRequestParams(name=name, arguments=arguments)
            )
            with _asyncio_declared():
                result = await session.send_request(
                    request,
                    _WIRE,
                    request_read_timeout_seconds=deadline_s,
                    progress_callback=on_progress,
                )
        except MCPError as exc:
            if self._ended.done() or exc.code == mcp_types.CONNECTION_CLOSED:
                await asyncio.wait({self._ended}, timeout=1.0)
                why = self._ended.result() if self._ended.done() else exc.message
                raise McpConnectionLost(why) from None
            raise McpCallFailed(
                f'MCP server "{self._label}" answered {name} with error {exc.code}: {exc.message}',
                MCP_SERVER_ERROR,
            ) from None
        except ValidationError as exc:
            raise McpCallFailed(
                f"the server's result does not conform to MCP: {exc.errors()[0]['msg']}",
                INVALID_TOOL_OUTPUT,
            ) from None
        return tool_result(result, self._max_depth)

    async def closed(self) -> str:
        return await asyncio.shield(self._ended)

    async def close(self) -> None:
        self._stop.set()
        task = self._task
        if task is not None and self._session is None:  # still initializing: give up now
            task.cancel()
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            except asyncio.CancelledError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                raise


def _progress_callback(report: Progress) -> ProgressFnT:
    """The SDK's async progress callback over the pipeline's synchronous one (which never
    blocks: it coalesces instead)."""

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        report(progress, total, message)

    return on_progress


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return _describe(inner)
    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}: {exc.message}"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class SdkConnector:
    """Connects with the SDK (implements `McpConnector`)."""

    def __init__(
        self,
        max_message_bytes: int,
        max_json_depth: int,
        user: str = "nobody",
        messages_per_second: float = 2000.0,
        json_limits: JsonLimits | None = None,
    ) -> None:
        self._stdio = stdio_transport.StdioLimits(
            max_message_bytes, user, json_limits or JsonLimits()
        )
        self._rate = messages_per_second
        self._max_bytes = max_message_bytes
        self._max_depth = max_json_depth

    async def connect(self, spec: ServerSpec, label: str, events: ConnectionEvents) -> _Connection:
        connection = _Connection(label, events, self._max_depth, self._rate)
        if isinstance(spec, StdioServer):
            stdio = self._stdio

            @contextlib.asynccontextmanager
            async def streams() -> AsyncIterator[TransportStreams]:
                async with stdio_transport.running(spec, label, stdio) as process:
                    pair = await process.start()
                    connection.ended_with(process.ended)
                    yield pair

            await connection.open(streams)
        else:
            assert isinstance(spec, HttpServer)
            await connection.open(lambda: http_transport.connected(spec, self._max_bytes))
        return connection
