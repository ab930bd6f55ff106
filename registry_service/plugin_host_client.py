"""`PluginHosts` over the runtime's `Host` stream: one stream per activation.

The registry side of a plugin host (design/cordis.md): `activate` opens the stream, sends the
package's host half and waits for `started` or `failed`; while the activation lives, a reader
task resolves invocation results and passes registration changes, logs and the host's loss to
the activation's `HostEvents`; `retract` asks for the retract and returns once the runtime has
answered `retracted` (the host's processes are gone) or the stream has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from codemode_wire import jsonvalue
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.jsonvalue import JsonValue
from registry_service.codemode.runtime_port import RuntimeUnavailable
from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.plugin_hosts import (
    HOST_GONE,
    ActivationFailed,
    ActivationSpec,
    DynamicToolSpec,
    HandlerFailed,
    HostEvents,
    HostRegistrations,
)
from registry_service.domain.signals import AbortSignal
from registry_service.runtime_client import GrpcRuntime

__all__ = ["GrpcPluginHosts"]

_log = logging.getLogger(__name__)
_HOST_GONE = "the plugin host is not running"
_GONE = pb.HostInvokeResult(error_message=_HOST_GONE)  # settles calls the stream left pending


class GrpcPluginHosts:
    """Activations on the runtimes of one `GrpcRuntime` channel."""

    def __init__(self, runtime: GrpcRuntime) -> None:
        self._runtime = runtime

    async def activate(self, spec: ActivationSpec, events: HostEvents) -> GrpcActiveHost:
        start = pb.HostStart(
            source=spec.source,
            language=spec.language,
            plugin_id=spec.plugin_id,
            package_id=spec.package_id,
            run_id=spec.run_id,
            budgets=pb.RunBudgets(
                memory_bytes=spec.memory_bytes or 0,
                compute_ms=spec.compute_ms_per_call or 0,
                max_output_bytes=spec.max_output_bytes or 0,
            ),
            visible_tools_json=jsonvalue.dumps(
                [{"name": name, "inputSchema": schema} for name, schema in spec.visible_tools]
            ),
        )
        start.start_timeout.CopyFrom(_duration(spec.start_timeout_s))
        try:
            call = await self._runtime.open_host(start)
        except RuntimeUnavailable as exc:
            raise ActivationFailed("host-load", f"no plugin host could be started: {exc}") from exc
        try:
            first = await _read(call)
        except BaseException:
            call.cancel()
            raise
        kind = first.WhichOneof("kind") if first is not None else None
        while kind == "log":
            assert first is not None
            events.on_log("log", first.log.text)
            first = await _read(call)
            kind = first.WhichOneof("kind") if first is not None else None
        if first is None or kind != "started":
            call.cancel()
            if first is not None and kind in ("failed", "lost"):
                failure = first.failed if kind == "failed" else first.lost
                if failure.phase == "host-load":
                    raise ActivationFailed("host-load", failure.message, failure.stack)
                raise ActivationFailed("host-apply", failure.message, failure.stack)
            raise ActivationFailed("host-apply", "the plugin host ended before it started")
        return GrpcActiveHost(call, _registrations(first.started), events)


class GrpcActiveHost:
    """One running activation (implements `ActiveHost`)."""

    def __init__(self, call: Any, registrations: HostRegistrations, events: HostEvents) -> None:
        self._call = call
        self._registrations = registrations
        self._events = events
        self._pending: dict[int, asyncio.Future[pb.HostInvokeResult]] = {}
        self._next_id = 1
        self._ended = False
        self._retracting = False
        self._reader = asyncio.ensure_future(self._read_all())

    @property
    def registrations(self) -> HostRegistrations:
        return self._registrations

    async def call_tool(self, name: str, arguments: JsonValue, signal: AbortSignal) -> JsonValue:
        if self._ended or self._retracting:
            raise ToolCallFailure(_HOST_GONE, HOST_GONE)
        request = pb.HostInvoke(tool_name=name, arguments_json=jsonvalue.dumps(arguments))
        try:
            result = await self._invoke(request, signal)
        except grpc.aio.AioRpcError as exc:
            raise ToolCallFailure(f"{_HOST_GONE}: {exc.details()}", HOST_GONE) from exc
        if result.WhichOneof("outcome") == "value_json":
            return jsonvalue.loads(result.value_json)
        if result is _GONE:  # the stream ended with the call in flight
            raise ToolCallFailure(_HOST_GONE, HOST_GONE)
        raise ToolCallFailure(result.error_message or "the plugin's tool failed")

    async def call_handler(self, method: str, args: JsonValue) -> JsonValue:
        if self._ended or self._retracting:
            raise HandlerFailed(_HOST_GONE)
        request = pb.HostInvoke(handler_method=method, arguments_json=jsonvalue.dumps(args))
        try:
            result = await self._invoke(request, None)
        except grpc.aio.AioRpcError as exc:
            raise HandlerFailed(f"{_HOST_GONE}: {exc.details()}") from exc
        if result.WhichOneof("outcome") == "value_json":
            return jsonvalue.loads(result.value_json)
        raise HandlerFailed(
            result.error_message or "the handler failed",
            result.error_stack,
            not_found=result.method_not_found,
        )

    async def _invoke(
        self, request: pb.HostInvoke, signal: AbortSignal | None
    ) -> pb.HostInvokeResult:
        invocation = self._next_id
        self._next_id += 1
        request.invocation_id = invocation
        future: asyncio.Future[pb.HostInvokeResult] = asyncio.get_running_loop().create_future()
        self._pending[invocation] = future
        remove = (
            signal.add_listener(lambda _reason: self._cancel(invocation))
            if signal is not None
            else None
        )
        try:
            await self._call.write(pb.HostRequest(invoke=request))
            return await future
        finally:
            if remove is not None:
                remove()
            self._pending.pop(invocation, None)

    def _cancel(self, invocation: int) -> None:
        if not self._ended and invocation in self._pending:
            cancel = pb.HostRequest(cancel=pb.HostCancel(invocation_id=invocation))
            task = asyncio.ensure_future(self._call.write(cancel))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def retract(self) -> None:
        if not self._ended and not self._retracting:
            self._retracting = True
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await self._call.write(pb.HostRequest(retract=pb.HostRetract()))
        await asyncio.shield(self._reader)
        self._call.cancel()

    async def _read_all(self) -> None:
        lost = ""
        try:
            while (message := await _read(self._call)) is not None:
                kind = message.WhichOneof("kind")
                if kind == "result":
                    future = self._pending.get(message.result.invocation_id)
                    if future is not None and not future.done():
                        future.set_result(message.result)
                elif kind == "changed":
                    self._registrations = _registrations(message.changed)
                    self._events.on_change(self._registrations)
                elif kind == "log":
                    self._events.on_log("log", message.log.text)
                elif kind == "retracted":
                    break
                elif kind in ("lost", "failed"):
                    failure = message.lost if kind == "lost" else message.failed
                    lost = failure.message
                    break
            else:
                lost = "" if self._retracting else "the plugin host's stream ended"
        except grpc.aio.AioRpcError as exc:
            lost = "" if self._retracting else f"the plugin host was lost: {exc.details()}"
        finally:
            self._ended = True
            for future in self._pending.values():
                if not future.done():
                    future.set_result(_GONE)
        if lost and not self._retracting:
            self._events.on_lost(lost)


async def _read(call: Any) -> pb.HostResponse | None:
    message = await call.read()
    return None if message is grpc.aio.EOF else message


def _registrations(message: pb.HostRegistrations) -> HostRegistrations:
    return HostRegistrations(
        tools=tuple(
            DynamicToolSpec(
                name=tool.name,
                description=tool.description,
                input_schema=jsonvalue.loads(tool.input_schema_json or "{}"),
                output_schema=(
                    jsonvalue.loads(tool.output_schema_json) if tool.output_schema_json else None
                ),
            )
            for tool in message.tools
        ),
        handlers=tuple(message.handlers),
        provides=tuple(message.provides),
        waiting_for=tuple(message.waiting_for),
    )


def _duration(seconds: float) -> Duration:
    duration = Duration()
    duration.FromMilliseconds(max(1, round(seconds * 1000)))
    return duration
