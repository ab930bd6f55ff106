"""The registry-to-registry channel of Cordis (proto: cordis_peer.proto): the client other
registries reach a plugin's owner with (`GrpcPeers`, the `placement.Peers` port) and the
servicer the owner answers with (`CordisPeerServicer`, over `CordisRunner`'s owner side).

Both ends are authenticated by one token derived from the shared peer secret
(`RegistrySettings.cordis_peer_token`), sent as `x-codemode-peer` metadata and compared in
constant time; a call without it, or with another, is refused UNAUTHENTICATED before anything
runs. A registry serving TLS dials the others over TLS only (`cordis_peer_tls_*`: the CA their
certificates chain to, a client certificate where they require one), so the token is never
sent in clear; the owner answers on its one gRPC server, TLS or not as it serves. The owner
adds nothing to a forwarded call's rights: the caller's pipeline authorized it, and the owner
runs it on the plugin's run as that run's host may."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from codemode_common.principals import Principal
from codemode_common.request_parsing import Malformed
from codemode_common.tls import ClientTls
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import cordis_peer_pb2 as pb
from codemode_wire.api.registry.v1 import cordis_peer_pb2_grpc as pb_grpc
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.cordis.placement import (
    OwnerLost,
    RemoteRun,
    RunAt,
    registrations_from_json,
    registrations_to_json,
)
from registry_service.domain.cordis.runner import PLUGIN_NOT_RUNNING, CordisRunner
from registry_service.domain.plugin_hosts import HandlerFailed
from registry_service.domain.results import ToolResult
from registry_service.domain.signals import AbortController, AbortSignal

__all__ = ["PEER_METADATA", "CordisPeerServicer", "GrpcPeers"]

log = logging.getLogger(__name__)
PEER_METADATA = "x-codemode-peer"
T = TypeVar("T")
# A run the caller named is not (or no longer) the owner's: the plugin moved on meanwhile.
_NOT_HERE = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
# An owner that vanished without closing its streams is noticed by its lease expiring (the
# survivor then forgets its runs, failing their calls in flight), not by pings: a server
# takes a client's pings on an idle connection at most every 5 minutes
# (codemode_common/grpc_server.py). A stop waits this long at most for an owner to answer.
_STOP_TIMEOUT_S = 60.0


class GrpcPeers:
    """Other registries' plugin runs over `CordisPeerService` (one channel per address)."""

    def __init__(self, token: str, max_message_bytes: int, *, tls: ClientTls | None = None) -> None:
        """`tls`: dial over TLS (mutual when it holds a client certificate); None: plaintext,
        only for registries that serve plaintext."""
        self._metadata = ((PEER_METADATA, token),)
        options: list[tuple[str, str | int]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        self._credentials: grpc.ChannelCredentials | None = None
        if tls is not None:
            self._credentials = grpc.ssl_channel_credentials(
                tls.root_ca, tls.private_key, tls.certificate_chain
            )
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
        self._options = tuple(options)
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The peer token, as every peer call sends it."""
        return self._metadata

    def stub(self, address: str) -> pb_grpc.CordisPeerServiceStub:
        """The peer service at `address` (cordis_page_peers.py calls it too)."""
        return self._stub(address)

    def _stub(self, address: str) -> pb_grpc.CordisPeerServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=self._options)
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, options=self._options)
            self._channels[address] = channel
        return pb_grpc.CordisPeerServiceStub(channel)

    async def follow(self, address: str, plugin_id: str) -> AsyncIterator[RemoteRun]:
        call = self._stub(address).PeerFollowHost(
            pb.PeerFollowHostRequest(plugin_id=plugin_id), metadata=self._metadata
        )
        try:
            async for state in call:
                try:
                    registrations = registrations_from_json(
                        jsonvalue.loads(state.registrations_json)
                    )
                except (ValueError, TypeError, KeyError) as exc:
                    raise OwnerLost(f"{address} sent unreadable registrations: {exc}") from None
                yield RemoteRun(
                    state.run_id,
                    state.package_id,
                    state.epoch,
                    registrations,
                    Principal(state.principal_kind or "anonymous", state.principal_name),
                )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _NOT_HERE:
                return
            raise OwnerLost(f"{address}: {exc.code().name}: {exc.details()}") from None
        finally:
            call.cancel()

    async def _unary(self, address: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _NOT_HERE:
                raise ToolCallFailure(str(exc.details()), PLUGIN_NOT_RUNNING) from None
            raise OwnerLost(f"{address}: {exc.code().name}: {exc.details()}") from None

    async def call_tool(
        self, run: RunAt, name: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue | ToolResult:
        request = pb.PeerCallToolRequest(
            plugin_id=run.plugin_id,
            run_id=run.run_id,
            tool=name,
            arguments_json=jsonvalue.dumps(arguments),
        )
        stub = self._stub(run.address)
        response = await self._unary(
            run.address, lambda: stub.PeerCallTool(request, metadata=self._metadata)
        )
        value = _outcome(response.result)
        if response.result.presentation_meta_json:
            meta = jsonvalue.loads(response.result.presentation_meta_json)
            return ToolResult((), value=value, has_value=True, presentation_meta=meta)
        return value

    async def call_service(
        self, run: RunAt, service: str, method: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue:
        request = pb.PeerCallServiceRequest(
            plugin_id=run.plugin_id,
            run_id=run.run_id,
            service=service,
            method=method,
            arguments_json=jsonvalue.dumps(arguments),
        )
        stub = self._stub(run.address)
        response = await self._unary(
            run.address, lambda: stub.PeerCallService(request, metadata=self._metadata)
        )
        return _outcome(response.result)

    async def call_handler(self, run: RunAt, method: str, arguments: JsonValue) -> JsonValue:
        request = pb.PeerCallHandlerRequest(
            plugin_id=run.plugin_id,
            run_id=run.run_id,
            method=method,
            arguments_json=jsonvalue.dumps(arguments),
        )
        stub = self._stub(run.address)
        try:
            response = await self._unary(
                run.address, lambda: stub.PeerCallHandler(request, metadata=self._metadata)
            )
        except ToolCallFailure as exc:
            raise HandlerFailed(str(exc)) from None
        result = response.result
        if result.WhichOneof("outcome") == "failure":
            failure = result.failure
            raise HandlerFailed(failure.message, failure.stack, not_found=failure.not_found)
        return jsonvalue.loads(result.value_json)

    async def stop(self, run: RunAt) -> bool:
        request = pb.PeerStopHostRequest(plugin_id=run.plugin_id, run_id=run.run_id)
        stub = self._stub(run.address)
        try:
            response = await self._unary(
                run.address,
                lambda: stub.PeerStopHost(
                    request, metadata=self._metadata, timeout=_STOP_TIMEOUT_S
                ),
            )
        except ToolCallFailure:
            return False
        return bool(response.stopped)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


def _outcome(result: pb.PeerCallResult) -> JsonValue:
    if result.WhichOneof("outcome") == "failure":
        raise ToolCallFailure(result.failure.message, result.failure.code)
    return jsonvalue.loads(result.value_json)


def _value(value: JsonValue | ToolResult) -> pb.PeerCallResult:
    if isinstance(value, ToolResult):
        meta = value.presentation_meta
        return pb.PeerCallResult(
            value_json=jsonvalue.dumps(value.value),
            presentation_meta_json="" if meta is None else jsonvalue.dumps(meta),
        )
    return pb.PeerCallResult(value_json=jsonvalue.dumps(value))


def _failure(
    message: str, code: str = "", stack: str = "", *, not_found: bool = False
) -> pb.PeerCallResult:
    return pb.PeerCallResult(
        failure=pb.PeerFailure(message=message, code=code, stack=stack, not_found=not_found)
    )


async def _forwarded(
    context: grpc.aio.ServicerContext[Any, Any],
    call: Callable[[AbortSignal], Awaitable[JsonValue | ToolResult]],
) -> pb.PeerCallResult:
    """A forwarded tool or service call's result: its value or its failure; a run that is not
    running here any more ends the RPC FAILED_PRECONDITION, and the caller registry's cancel
    aborts the call."""
    control = AbortController()
    try:
        value = await call(control.signal)
    except ToolCallFailure as exc:
        if exc.code == PLUGIN_NOT_RUNNING:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return _failure(str(exc), exc.code)
    except asyncio.CancelledError:
        control.abort("the caller's registry cancelled the call")
        raise
    return _value(value)


class CordisPeerServicer(pb_grpc.CordisPeerServiceServicer):
    """The owner's side: thin over `CordisRunner` (follow_run, call_run_*, stop_run)."""

    def __init__(self, runner: CordisRunner, token: str) -> None:
        self._runner = runner
        self._token = token.encode()

    async def _authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        sent = b""
        for key, value in context.invocation_metadata() or ():
            if key == PEER_METADATA:
                sent = value.encode() if isinstance(value, str) else bytes(value)
        if not hmac.compare_digest(sent, self._token):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "CordisPeerService answers only registries holding the shared peer secret",
            )

    @staticmethod
    async def _malformed(
        context: grpc.aio.ServicerContext[Any, Any], request: Malformed
    ) -> NoReturn:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.detail}"
        )
        raise AssertionError("abort raises")  # for the type checker: it never returns

    @staticmethod
    def _arguments(text: str) -> JsonValue:
        try:
            return jsonvalue.loads(text)
        except ValueError as exc:
            raise ToolCallFailure(f"arguments are not JSON: {exc}", "INVALID_ARGUMENT") from None

    async def PeerFollowHost(
        self,
        request: pb.PeerFollowHostRequest | Malformed,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.PeerFollowHostResponse]:
        await self._authenticate(context)
        if isinstance(request, Malformed):
            await self._malformed(context, request)
        try:
            async for run in self._runner.follow_run(request.plugin_id):
                yield pb.PeerFollowHostResponse(
                    run_id=run.run_id,
                    package_id=run.package_id,
                    epoch=run.epoch,
                    registrations_json=jsonvalue.dumps(registrations_to_json(run.registrations)),
                    principal_kind=run.principal.kind,
                    principal_name=run.principal.name,
                )
        except ToolCallFailure as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))

    async def PeerCallTool(
        self,
        request: pb.PeerCallToolRequest | Malformed,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.PeerCallToolResponse:
        await self._authenticate(context)
        if isinstance(request, Malformed):
            await self._malformed(context, request)
        result = await _forwarded(
            context,
            lambda signal: self._runner.call_run_tool(
                request.plugin_id,
                request.run_id,
                request.tool,
                self._arguments(request.arguments_json),
                signal,
            ),
        )
        return pb.PeerCallToolResponse(result=result)

    async def PeerCallService(
        self,
        request: pb.PeerCallServiceRequest | Malformed,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.PeerCallServiceResponse:
        await self._authenticate(context)
        if isinstance(request, Malformed):
            await self._malformed(context, request)
        at = RunAt("", request.plugin_id, request.run_id)
        result = await _forwarded(
            context,
            lambda signal: self._runner.call_run_service(
                at, request.service, request.method, self._arguments(request.arguments_json), signal
            ),
        )
        return pb.PeerCallServiceResponse(result=result)

    async def PeerCallHandler(
        self,
        request: pb.PeerCallHandlerRequest | Malformed,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.PeerCallHandlerResponse:
        await self._authenticate(context)
        if isinstance(request, Malformed):
            await self._malformed(context, request)
        try:
            value = await self._runner.call_run_handler(
                request.plugin_id,
                request.run_id,
                request.method,
                self._arguments(request.arguments_json),
            )
        except HandlerFailed as exc:
            return pb.PeerCallHandlerResponse(
                result=_failure(exc.message, stack=exc.stack, not_found=exc.not_found)
            )
        except ToolCallFailure as exc:
            return pb.PeerCallHandlerResponse(result=_failure(str(exc), exc.code))
        return pb.PeerCallHandlerResponse(result=_value(value))

    async def PeerStopHost(
        self,
        request: pb.PeerStopHostRequest | Malformed,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.PeerStopHostResponse:
        await self._authenticate(context)
        if isinstance(request, Malformed):
            await self._malformed(context, request)
        stopped = await self._runner.stop_run(request.plugin_id, request.run_id)
        return pb.PeerStopHostResponse(stopped=stopped)
