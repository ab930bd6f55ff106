"""Serve tools from plain async Python functions over the registry's `Connect` stream.

    provider = ToolProvider(channel, "files")

    @provider.tool(description="Read a file", concurrency_safe=True)
    async def read(args, ctx):
        return {"text": open(args["path"]).read()}

    async with provider:          # opens the stream and registers every declared tool
        await provider.closed()   # serve until the registry or the caller ends it

    await provider.serve()        # or: serve until close(), reconnecting whenever the stream
                                  # is lost (a registry restart or shutdown)

Handlers may be `async def` or plain functions (run in the provider's own threads, at most
`max_threads` at once: a sync handler cannot be interrupted, so a cancelled one keeps its
thread until it returns), and take `(args, ctx)`, `(args)` or `()`; a signature that cannot be
called so is refused at `@provider.tool` with a TypeError naming the tool. Arguments hinted with
a pydantic model, a dataclass or a TypedDict arrive parsed into it (pydantic `TypeAdapter`;
arguments it refuses fail the call with `INVALID_ARGS` naming each field's path), and the hint
is the input schema unless one is given.

A handler returns a JSON value, a pydantic model or dataclass (serialized with pydantic, through
the return hint when there is one), or a `ToolOutput` for content blocks (text, images, JSON),
additional contexts or concluding the model's turn (see `codemode_client.results`); it raises
`ToolError` (alias `ToolFailed`) to fail the call with its own message and code. Any other
exception reaches the model only as "tool 'x' failed unexpectedly (error id …)": its text may
hold anything (a password, a path), so the provider logs it with its traceback under that id
(logger `codemode_client.provider`). An output that cannot be sent fails the call with
`INVALID_TOOL_OUTPUT`, as the registry fails an in-process tool's.

`start()` with no registry at the channel's address raises `Unavailable` naming the address;
`serve()` waits for one instead.

The stream's lifetime owns the tools: closing it revokes them in the registry.

Tracing: every invocation runs inside a `serve_tool {name}` span (kind SERVER) continuing the
W3C context the registry put in the invocation (the registry's `execute_tool` span), so the
provider's work joins the caller's trace. The span comes from `tracer_provider`, else the
global provider; with neither set up nothing is traced.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from codemode_client._handlers import PreparedHandler, prepare
from codemode_client._reconnect import serve_until_closed
from codemode_client.channel import channel_target, receive_limit
from codemode_client.errors import CodemodeError, ToolError, from_rpc_error
from codemode_client.invocation import InvocationContext
from codemode_client.results import (
    contexts_to_proto,
    output_to_proto,
)
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.grpc_status import error_info
from codemode_wire.jsonvalue import JsonValue
from codemode_wire.telemetry import context_from, resolve_tracer_provider
from codemode_wire.text import without_lone_surrogates

__all__ = [
    "DEFAULT_MAX_THREADS",
    "STREAM_ENDED",
    "InvocationContext",
    "ProviderError",
    "ToolFailed",
    "ToolProvider",
]

STREAM_ENDED = "STREAM_ENDED"  # ProviderError.reason when the stream ended under a request
DEFAULT_MAX_THREADS = 8
_log = logging.getLogger(__name__)


class _StreamLost(Exception):
    """The stream ended while `start()` waited for an acknowledgement: worth another try."""


class ProviderError(Exception):
    """The registry refused something the provider asked for."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


ToolFailed = ToolError  # the earlier name of the same class


# Handlers return any JSON-shaped value (a TypedDict, say), a model or a `ToolOutput`; each is
# checked when serialized. Their signatures are checked by `codemode_client._handlers`.
Handler = TypeVar("Handler", bound=Callable[..., Any])


@dataclass
class _Tool:
    message: tool_pb2.Tool
    handler: PreparedHandler
    scope: str


@dataclass
class ToolProvider:
    channel: grpc.aio.Channel | None
    """None: the provider only declares tools, served per registry replica through
    `on_channel` (see `codemode_client.replicas.ReplicaSet`)."""
    name: str
    _tools: list[_Tool] = field(default_factory=list)
    _handlers: dict[str, PreparedHandler] = field(default_factory=dict)
    _call: Any = None
    _acks: dict[str, asyncio.Future[rpb.RegistrationAck]] = field(default_factory=dict)
    _running: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = field(default_factory=dict)
    _reader: asyncio.Task[None] | None = None
    _write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _closing: bool = False
    provider_id: str = ""
    tracer_provider: trace.TracerProvider | None = None
    """Where `serve_tool` spans go (None: the global provider; nothing if none is set up)."""
    _tracer: trace.Tracer | None = None
    max_threads: int = DEFAULT_MAX_THREADS
    """How many sync handlers (and large arguments' parsing) run at once; more wait."""
    _executor: ThreadPoolExecutor | None = None
    _end_reason: str = ""

    def tool(
        self,
        name: str | None = None,
        *,
        description: str = "",
        input_schema: JsonValue = None,
        output_schema: JsonValue = None,
        concurrency_safe: bool = False,
        guidance: str = "",
        scope: str = "",
    ) -> Callable[[Handler], Handler]:
        """Declares a tool; it is registered when the provider starts. Raises TypeError when
        the handler cannot be called as a tool (see the module docstring).

        Schemas not given are derived from the handler's type hints (first parameter, return
        type) with pydantic; the description defaults to the handler's docstring.
        """

        def decorate(handler: Handler) -> Handler:
            tool_name = name or getattr(handler, "__name__", "")
            if not tool_name:
                raise TypeError(f"the handler {handler!r} has no __name__: name the tool")
            prepared = prepare(tool_name, handler, input_schema, output_schema)
            inputs, outputs = prepared.input_schema, prepared.output_schema
            message = tool_pb2.Tool(
                name=tool_name,
                description=description or inspect.getdoc(handler) or "",
                input_schema_json="" if inputs is None else jsonvalue.dumps(inputs),
                output_schema_json="" if outputs is None else jsonvalue.dumps(outputs),
                concurrency=tool_pb2.CONCURRENCY_SAFE
                if concurrency_safe
                else tool_pb2.CONCURRENCY_EXCLUSIVE,
                guidance=guidance,
            )
            self._tools.append(_Tool(message, prepared, scope))
            return handler

        return decorate

    def on_channel(self, channel: grpc.aio.Channel) -> ToolProvider:
        """A provider with this one's name and declared tools on `channel`: one per registry
        replica (`ReplicaSet(target, provider.on_channel)`)."""
        return ToolProvider(
            channel,
            self.name,
            _tools=list(self._tools),
            tracer_provider=self.tracer_provider,
            max_threads=self.max_threads,
        )

    async def __aenter__(self) -> ToolProvider:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, *, wait_for_ready: bool = False) -> None:
        """Opens the stream and registers every declared tool. `wait_for_ready` waits for the
        registry to be reachable instead of failing at once with `Unavailable` (naming the
        address; any other refusal of the stream is the `CodemodeError` of its status)."""
        if self.channel is None:
            raise ProviderError(
                "this provider has no channel: serve it per replica with on_channel(channel)"
            )
        self._closing = False
        provider = resolve_tracer_provider(self.tracer_provider)
        self._tracer = None if provider is None else provider.get_tracer("codemode.client")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.max_threads, f"tool-provider-{self.name}")
        stub = rpb_grpc.RegistryServiceStub(self.channel)
        self._call = stub.Connect(wait_for_ready=wait_for_ready)
        opening = rpb.OpenProvider(
            provider_name=self.name, max_receive_message_bytes=receive_limit(self.channel)
        )
        try:
            await self._write(rpb.ConnectRequest(open=opening))
            first = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise self._unreachable(exc) from None
        if first is grpc.aio.EOF or first.WhichOneof("message") != "opened":
            raise ProviderError("the registry did not open the provider stream")
        self.provider_id = first.opened.provider_id
        self._reader = asyncio.create_task(self._read_loop())
        by_scope: dict[str, list[_Tool]] = {}
        for declared in self._tools:
            by_scope.setdefault(declared.scope, []).append(declared)
        for scope, tools in by_scope.items():
            await self.register(scope, tools)

    def _unreachable(self, exc: grpc.aio.AioRpcError) -> CodemodeError:
        """The stream's failure as our exception, naming the provider and the address."""
        error = from_rpc_error(exc)
        where = channel_target(self.channel) if self.channel is not None else ""
        at = f" at {where}" if where else ""
        if error.code == grpc.StatusCode.UNAVAILABLE:
            text = f"no registry reachable{at} ({error.message}); serve() waits for one"
        else:
            text = f"the registry{at} refused the provider stream: {error.message}"
        return type(error)(
            f"tool provider {self.name!r}: {text}",
            reason=error.reason,
            domain=error.domain,
            metadata=error.metadata,
            code=error.code,
            retry_delay=error.retry_delay,
        )

    async def register(self, scope: str, tools: list[_Tool]) -> None:
        request_id = f"reg-{next(self._ids)}"
        future: asyncio.Future[rpb.RegistrationAck] = asyncio.get_running_loop().create_future()
        self._acks[request_id] = future
        await self._write(
            rpb.ConnectRequest(
                register=rpb.RegisterTools(
                    request_id=request_id, scope=scope, tools=[t.message for t in tools]
                )
            )
        )
        ack = await future
        if ack.status.code != 0:
            info = error_info(ack.status)
            raise ProviderError(ack.status.message, info.reason if info else "")
        for declared in tools:
            self._handlers[declared.message.name] = declared.handler

    async def closed(self) -> None:
        """Waits until the stream ends (however it ends, `close()` included)."""
        if self._reader is not None:
            await asyncio.wait({self._reader})  # unlike awaiting it: raises nothing of its own

    async def serve(
        self, *, max_delay: float = 10.0, on_serving: Callable[[], object] | None = None
    ) -> None:
        """Serves the tools until `close()`, across registry restarts and shutdowns: whenever
        the stream is lost (UNAVAILABLE when a registry shuts down, a broken connection) it is
        opened again as soon as a registry is reachable, and the tools are registered again.
        A registry that refuses the tools (`ProviderError`) ends it. `on_serving` is called
        each time the tools are registered. Each loss and each return is logged (logger
        `codemode_client.provider`, WARNING)."""
        served = False

        async def open_serving() -> None:
            nonlocal served
            await self._open_serving()
            if served:
                _log.warning("tool provider %r: reconnected, tools registered again", self.name)
            served = True
            if on_serving is not None:
                on_serving()

        async def stream_ended() -> None:
            await self.closed()
            if not self._closing:
                _log.warning(
                    "tool provider %r: the stream to the registry ended (%s); reconnecting",
                    self.name,
                    self._end_reason or "closed by the registry",
                )

        await serve_until_closed(
            open_stream=open_serving,
            stream_ended=stream_ended,
            drop_stream=self._drop_call,
            closing=lambda: self._closing,
            transient=(grpc.aio.AioRpcError, CodemodeError, _StreamLost),
            max_delay=max_delay,
        )

    async def _open_serving(self) -> None:
        try:
            await self.start(wait_for_ready=True)
        except ProviderError as exc:
            if exc.reason == STREAM_ENDED:
                raise _StreamLost from exc
            raise  # the registry refused the tools: retrying changes nothing

    def _drop_call(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def close(self) -> None:
        self._closing = True
        if self._call is not None:
            with contextlib.suppress(Exception):
                await self._call.done_writing()
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        for task, _ in list(self._running.values()):
            task.cancel()
        if self._executor is not None:
            # A sync handler still running cannot be stopped: its thread ends when it returns.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def _write(self, message: rpb.ConnectRequest) -> None:
        async with self._write_lock:
            await self._call.write(message)

    async def _read_loop(self) -> None:
        self._end_reason = ""
        try:
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    return
                kind = message.WhichOneof("message")
                if kind == "registered":
                    future = self._acks.pop(message.registered.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(message.registered)
                elif kind == "invocation":
                    self._start(message.invocation)
                elif kind == "cancelled":
                    running = self._running.get(message.cancelled.invocation_id)
                    if running is not None:
                        running[1].set()
                        running[0].cancel()
        except grpc.aio.AioRpcError as exc:
            self._end_reason = f"{exc.code().name}: {exc.details()}"
            return
        finally:
            for future in self._acks.values():
                if not future.done():
                    future.set_exception(ProviderError("the provider stream ended", STREAM_ENDED))
            # The registry has failed these invocations already: their results have nowhere
            # to go, so their handlers are cancelled.
            for task, cancelled in list(self._running.values()):
                cancelled.set()
                task.cancel()

    def _start(self, invocation: rpb.Invocation) -> None:
        cancelled = asyncio.Event()
        ctx = InvocationContext(
            call_id=invocation.call_id,
            root_call_id=invocation.root_call_id,
            agent=invocation.agent,
            tool_name=invocation.tool_name,
            timeout=invocation.timeout.ToNanoseconds() / 1e9
            if invocation.HasField("timeout")
            else None,
            traceparent=invocation.trace_context.traceparent,
            tracestate=invocation.trace_context.tracestate,
            cancelled=cancelled,
        )
        task = asyncio.create_task(self._serve(invocation, ctx))
        self._running[invocation.invocation_id] = (task, cancelled)
        task.add_done_callback(lambda _t: self._running.pop(invocation.invocation_id, None))

    async def _serve(self, invocation: rpb.Invocation, ctx: InvocationContext) -> None:
        if self._tracer is None:
            result = await self._run(invocation, ctx)
        else:
            with self._tracer.start_as_current_span(
                f"serve_tool {invocation.tool_name}",
                context=context_from(ctx.traceparent, ctx.tracestate),
                kind=SpanKind.SERVER,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.call.id": invocation.call_id,
                    "gen_ai.tool.name": invocation.tool_name,
                    "codemode.root_call_id": invocation.root_call_id,
                    "codemode.agent": invocation.agent,
                    "codemode.provider": self.name,
                    "codemode.invocation_id": invocation.invocation_id,
                },
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                result = await self._run(invocation, ctx)
                if result is None:
                    span.set_attribute("codemode.outcome", "cancelled")
                elif result.is_error:
                    span.set_attribute("codemode.outcome", result.error.code or "error")
                    span.set_status(Status(StatusCode.ERROR, result.error.message[:512]))
                else:
                    span.set_attribute("codemode.outcome", "ok")
        if result is None:
            return  # cancelled: the registry already settled the call
        with contextlib.suppress(Exception):
            await self._write(
                rpb.ConnectRequest(
                    result=rpb.InvocationResult(
                        invocation_id=invocation.invocation_id, result=result
                    )
                )
            )

    async def _run(
        self, invocation: rpb.Invocation, ctx: InvocationContext
    ) -> tool_pb2.ToolResult | None:
        """The handler's result as a message; None when the call was cancelled."""
        handler = self._handlers.get(invocation.tool_name)
        try:
            if handler is None:
                raise ToolError(f'provider "{self.name}" has no tool "{invocation.tool_name}"')
            if self._executor is None:
                raise ToolError(f'provider "{self.name}" is closed')
            returned = await handler.call(invocation.arguments_json, ctx, self._executor)
        except asyncio.CancelledError:
            return None
        except ToolError as exc:
            try:
                contexts = contexts_to_proto(exc.additional_contexts)
            except Exception as bad:
                return _invalid_output(invocation.tool_name, bad)
            return _error(str(exc), exc.code, contexts=contexts)
        except Exception as exc:
            return _unexpected(invocation, exc)
        return _output(invocation.tool_name, handler, returned)


def _output(tool: str, handler: PreparedHandler, returned: Any) -> tool_pb2.ToolResult:
    """The result of a return: plain JSON goes as it is; else its models are serialized."""
    try:
        return output_to_proto(returned)
    except Exception as exc:
        first = exc
    try:
        serialized = handler.serialized(returned)
        if serialized is None:
            return _invalid_output(tool, first)
        return output_to_proto(serialized)
    except Exception as exc:
        return _invalid_output(tool, exc)


def _unexpected(invocation: rpb.Invocation, exc: Exception) -> tool_pb2.ToolResult:
    # Exception text may hold anything (a password in a connection string, a path): it stays
    # in the provider's log, and the model and history get only an id to find it by.
    error_id = secrets.token_hex(6)
    _log.error(
        "tool %r failed unexpectedly (error id %s, call %s)",
        invocation.tool_name,
        error_id,
        invocation.call_id,
        exc_info=exc,
    )
    return _error(
        f"tool {invocation.tool_name!r} failed unexpectedly (error id {error_id}); "
        "the provider logged the details",
        "",
    )


def _invalid_output(tool: str, exc: Exception) -> tool_pb2.ToolResult:
    # The registry's code, name and wording for an in-process tool's bad output: the caller sees
    # the same failure wherever the tool lives. It cannot be left to the registry: what fails
    # here (NaN, bytes, a lone surrogate in text) cannot even be put on the wire.
    return _error(
        f'tool "{tool}" returned invalid output: {exc}', "INVALID_TOOL_OUTPUT", "ToolOutputError"
    )


def _error(
    message: str,
    code: str,
    name: str = "",
    *,
    contexts: Sequence[tool_pb2.AdditionalContext] = (),
) -> tool_pb2.ToolResult:
    # A lone surrogate (from an exception's text, say) cannot be encoded: unsent, the call hangs.
    message = without_lone_surrogates(message)
    return tool_pb2.ToolResult(
        is_error=True,
        error=tool_pb2.ToolError(message=message, code=code, name=name),
        content=[tool_pb2.ContentBlock(text=tool_pb2.TextContent(text=f"Error: {message}"))],
        additional_contexts=contexts,
    )
