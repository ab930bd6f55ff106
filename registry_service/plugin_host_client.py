"""`PluginHosts` over the runtime's `Host` stream: one stream per activation.

The registry side of a plugin host (docs/cordis.md): `activate` opens the stream, sends the
package's host half and waits for `started` or `failed`; while the activation lives, a reader
task resolves invocation results and passes registration changes, logs and the host's loss to
the activation's `HostEvents`; `retract` asks for the retract and returns once the runtime has
answered `retracted` (the host's processes are gone) or the stream has ended.

Service calls go both ways on the same stream: the plugin's calls of an injected service
(`service_call`) are answered from `HostEvents.on_service_call` (which routes them to the
provider's stream), and `call_service` is a provider's side of such a call (an invocation
naming the service). Events are invocations naming the event; their results are not awaited.
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
    RESOURCE_EXHAUSTED,
    ActivationFailed,
    ActivationSpec,
    DynamicToolSpec,
    HandlerFailed,
    HostEvents,
    HostRegistrations,
    ServiceSpec,
)
from registry_service.domain.results import ABORTED, ToolResult
from registry_service.domain.signals import AbortSignal
from registry_service.runtime_client import GrpcRuntime, runtime_exhausted

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
            services=_services(spec.services),
        )
        start.start_timeout.CopyFrom(_duration(spec.start_timeout_s))
        try:
            call = await self._runtime.open_host(start)
        except RuntimeUnavailable as exc:
            raise ActivationFailed("host-load", f"no plugin host could be started: {exc}") from exc
        try:
            first = await _read(call)
            kind = first.WhichOneof("kind") if first is not None else None
            while kind == "log":
                assert first is not None
                events.on_log("log", first.log.text)
                first = await _read(call)
                kind = first.WhichOneof("kind") if first is not None else None
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            if exhausted := runtime_exhausted(exc):  # no sandbox was free: nothing started
                raise ActivationFailed(
                    "host-load",
                    f"no plugin host was started: {exhausted}",
                    code=RESOURCE_EXHAUSTED,
                    retry_delay_s=exhausted.retry_delay_s,
                ) from exc
            # The runtime went away (killed, restarted, unreachable) with the start in flight:
            # its plugin host went with it; the attempt fails like any other start.
            raise ActivationFailed(
                "host-apply",
                f"the runtime was lost while the Host half was starting: {exc.details()}",
            ) from exc
        except BaseException:
            call.cancel()
            raise
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
        self._writes = asyncio.Lock()  # one write at a time on the stream, in call order
        # The plugin's service calls being answered, by call id (unique on the stream).
        self._serving: dict[int, asyncio.Task[None]] = {}
        self._reader = asyncio.ensure_future(self._read_all())

    @property
    def registrations(self) -> HostRegistrations:
        return self._registrations

    async def call_tool(
        self, name: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue | ToolResult:
        return await self._invoke(name, arguments, signal)

    async def call_service(
        self, service: str, method: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue:
        value = await self._invoke(method, arguments, signal, service=service)
        return value.value if isinstance(value, ToolResult) else value

    def update_services(self, services: tuple[ServiceSpec, ...]) -> None:
        if not self._ended and not self._retracting:
            message = pb.HostRequest(services=pb.HostServices(services=_services(services)))
            self._background_write(message)

    def deliver_event(self, event: str, payload: JsonValue) -> None:
        if self._ended or self._retracting:
            return
        invocation = self._next_id
        self._next_id += 1
        request = pb.HostInvoke(
            invocation_id=invocation, event=event, arguments_json=jsonvalue.dumps(payload)
        )
        self._background_write(pb.HostRequest(invoke=request))  # its result is not awaited

    async def _write(self, message: pb.HostRequest) -> None:
        async with self._writes:
            await self._call.write(message)

    def _background_write(self, message: pb.HostRequest) -> None:
        task = asyncio.ensure_future(self._write(message))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _invoke(
        self, name: str, arguments: JsonValue, signal: AbortSignal, *, service: str = ""
    ) -> JsonValue | ToolResult:
        if self._ended or self._retracting:
            raise ToolCallFailure(_HOST_GONE, HOST_GONE)
        request = pb.HostInvoke(
            tool_name=name, arguments_json=jsonvalue.dumps(arguments), service=service
        )
        try:
            result = await self._send_invoke(request, signal)
        except grpc.aio.AioRpcError as exc:
            raise ToolCallFailure(f"{_HOST_GONE}: {exc.details()}", HOST_GONE) from exc
        if result.WhichOneof("outcome") == "value_json":
            value = jsonvalue.loads(result.value_json)
            if result.presentation_meta_json:
                meta = jsonvalue.loads(result.presentation_meta_json)
                return ToolResult((), value=value, has_value=True, presentation_meta=meta)
            return value
        if result is _GONE:  # the stream ended with the call in flight
            raise ToolCallFailure(_HOST_GONE, HOST_GONE)
        if result.cancelled:  # as every cancelled call: the caller's abort, or the plugin's stop
            why = "the plugin was stopped" if self._retracting else "the call was cancelled"
            raise ToolCallFailure(f"tool call aborted: {why}", ABORTED, "AbortError")
        raise ToolCallFailure(result.error_message or "the plugin's tool failed")

    async def call_handler(self, method: str, args: JsonValue) -> JsonValue:
        if self._ended or self._retracting:
            raise HandlerFailed(_HOST_GONE)
        request = pb.HostInvoke(handler_method=method, arguments_json=jsonvalue.dumps(args))
        try:
            result = await self._send_invoke(request, None)
        except grpc.aio.AioRpcError as exc:
            raise HandlerFailed(f"{_HOST_GONE}: {exc.details()}") from exc
        if result.WhichOneof("outcome") == "value_json":
            return jsonvalue.loads(result.value_json)
        if result is _GONE:  # the stream ended with the call in flight
            raise HandlerFailed(_HOST_GONE)
        raise HandlerFailed(
            result.error_message or "the handler failed",
            result.error_stack,
            not_found=result.method_not_found,
        )

    async def _send_invoke(
        self, request: pb.HostInvoke, signal: AbortSignal | None
    ) -> pb.HostInvokeResult:
        """Sends one invocation (a tool, a service method, a handler) and awaits its result;
        a fired `signal` cancels it in the host."""
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
            await self._write(pb.HostRequest(invoke=request))
            return await future
        except asyncio.CancelledError:
            # Whoever awaited it went away (e.g. a consumer plugin's cancelled call of this
            # plugin's service): the invocation is cancelled in the host, never left running.
            self._cancel(invocation)
            raise
        finally:
            if remove is not None:
                remove()
            self._pending.pop(invocation, None)

    def _cancel(self, invocation: int) -> None:
        if not self._ended and invocation in self._pending:
            self._background_write(pb.HostRequest(cancel=pb.HostCancel(invocation_id=invocation)))

    async def retract(self) -> None:
        if not self._ended and not self._retracting:
            self._retracting = True
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await self._write(pb.HostRequest(retract=pb.HostRetract()))
        await asyncio.shield(self._reader)
        for task in list(self._serving.values()):
            task.cancel()
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
                elif kind == "service_call":
                    self._serve(message.service_call)
                elif kind == "service_call_cancel":
                    serving = self._serving.pop(message.service_call_cancel.call_id, None)
                    if serving is not None:
                        serving.cancel()  # its provider's invocation is cancelled with it
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

    def _serve(self, call: pb.HostServiceCall) -> None:
        """Answers one of the plugin's calls of an injected service (routed by Cordis)."""

        async def answer() -> None:
            result = pb.HostInvokeResult(invocation_id=call.call_id)
            try:
                arguments = jsonvalue.loads(call.arguments_json or "[]")
                value = await self._events.on_service_call(call.service, call.method, arguments)
                result.value_json = jsonvalue.dumps(value)
            except ToolCallFailure as exc:
                result.error_message = str(exc)
            except ValueError:
                result.error_message = "service arguments must be lossless JSON"
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                if not self._ended:
                    await self._write(pb.HostRequest(service_result=result))

        task = asyncio.ensure_future(answer())
        self._serving[call.call_id] = task

        def done(task: asyncio.Task[None]) -> None:
            if self._serving.get(call.call_id) is task:
                del self._serving[call.call_id]

        task.add_done_callback(done)


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
        services=tuple(
            ServiceSpec(service.name, tuple(service.methods), service.data_json)
            for service in message.services
        ),
        events=tuple(message.events),
    )


def _services(services: tuple[ServiceSpec, ...]) -> list[pb.HostService]:
    return [pb.HostService(name=s.name, methods=s.methods, data_json=s.data_json) for s in services]


def _duration(seconds: float) -> Duration:
    duration = Duration()
    duration.FromMilliseconds(max(1, round(seconds * 1000)))
    return duration
