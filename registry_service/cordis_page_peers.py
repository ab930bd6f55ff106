"""Client-half calls across registries on the Cordis peer channel (proto: cordis_peer.proto,
`PeerClientQuery`; and `PeerRenderFailure`, a page's render failure of a run another registry
holds, kept by that owner): the client a registry carries a program's client
`cordis_inspect_query` to the registry where the agent's pages are attached with
(`GrpcPagePeers`, the `page_presence.PagePeers` port, and the `client_runs.RunOwners` one), and
the servicer that answers there (`CordisPagePeerServicer`, the peer servicer of cordis_peers.py
plus these RPCs).

Authenticated like every peer RPC (the `x-codemode-peer` token). The calling registry's
pipeline admitted and authorized the call; the answering one asks only its pages of that
agent, validates their answer against the method's output schema, and never carries the query
on (a registry without a page of the agent refuses it FAILED_PRECONDITION)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from codemode_common.request_parsing import Malformed
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import cordis_peer_pb2 as pb
from codemode_wire.jsonvalue import JsonValue
from registry_service.cordis_peers import CordisPeerServicer, GrpcPeers
from registry_service.domain.cordis.page_presence import PagesLost
from registry_service.domain.cordis.placement import OwnerLost
from registry_service.domain.cordis.refusals import CordisError
from registry_service.domain.cordis.service import Cordis
from registry_service.domain.signals import AbortController

__all__ = ["CordisPagePeerServicer", "GrpcPagePeers"]

# A render failure is a quick bookkeeping step on the owner; an owner that does not answer in
# this long is treated as lost for the report (the page may report again).
_REPORT_TIMEOUT_S = 30.0
# A refusal that says the query reached no page: the pages left that registry meanwhile.
_NO_PAGES = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)


class GrpcPagePeers:
    """Other registries' pages over `CordisPeerService.PeerClientQuery`, on the channels and
    with the peer token of the registry's `GrpcPeers` (one channel per address, however that
    dials)."""

    def __init__(self, peers: GrpcPeers) -> None:
        self._peers = peers

    async def client_query(
        self,
        address: str,
        agent: str,
        provider: str,
        method: str,
        input_value: JsonValue,
        *,
        timeout_s: float | None,
    ) -> JsonValue:
        request = pb.PeerClientQueryRequest(
            agent=agent, provider=provider, method=method, input_json=jsonvalue.dumps(input_value)
        )
        call = self._peers.stub(address).PeerClientQuery(
            request, metadata=self._peers.metadata, timeout=timeout_s
        )
        try:
            response = await call
        except asyncio.CancelledError:
            call.cancel()  # the caller's cancellation withdraws the query there
            raise
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise CordisError(
                    "cordis_inspect_query was cancelled: its deadline passed", "cancelled"
                ) from None
            if exc.code() in _NO_PAGES:
                raise CordisError(
                    f"the pages of {agent} left {address} before answering", "cancelled"
                ) from None
            raise PagesLost(f"{address}: {exc.code().name}: {exc.details()}") from None
        result = response.result
        if result.WhichOneof("outcome") == "failure":
            raise CordisError(result.failure.message, result.failure.code)
        return jsonvalue.loads(result.value_json)

    async def render_failure(
        self, address: str, agent: str, plugin_id: str, run_id: str, *, message: str, stack: str
    ) -> tuple[bool, str, str]:
        request = pb.PeerRenderFailureRequest(
            agent=agent, plugin_id=plugin_id, run_id=run_id, message=message, stack=stack
        )
        try:
            response = await self._peers.stub(address).PeerRenderFailure(
                request, metadata=self._peers.metadata, timeout=_REPORT_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            raise OwnerLost(f"{address}: {exc.code().name}: {exc.details()}") from None
        return response.accepted, response.code, response.message


class CordisPagePeerServicer(CordisPeerServicer):
    """The peer servicer, answering client-half calls with this registry's pages too."""

    def __init__(self, cordis: Cordis, token: str) -> None:
        super().__init__(cordis.runner, token)
        self._cordis = cordis

    async def PeerClientQuery(
        self,
        request: pb.PeerClientQueryRequest | Malformed,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.PeerClientQueryResponse:
        await self._authenticate(context)
        if isinstance(request, Malformed):
            await self._malformed(context, request)
            raise AssertionError("abort raises")
        if not self._cordis.pages.attached(request.agent):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no page runner of {request.agent} is attached to this registry",
            )
        try:
            input_value = jsonvalue.loads(request.input_json) if request.input_json else None
        except ValueError as exc:
            return _failed(f"input_json is not JSON: {exc}", "invalid-input")
        control = AbortController()
        try:
            data = await self._cordis.inspect.query(
                "client",
                request.provider,
                request.method,
                input_value=input_value,
                owner=request.agent,
                signal=control.signal,
                here_only=True,
            )
        except CordisError as exc:
            return _failed(exc.message, exc.reason)
        except asyncio.CancelledError:
            control.abort("the caller's registry cancelled the query")
            raise
        return pb.PeerClientQueryResponse(
            result=pb.PeerCallResult(value_json=jsonvalue.dumps(data))
        )

    async def PeerRenderFailure(
        self,
        request: pb.PeerRenderFailureRequest | Malformed,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.PeerRenderFailureResponse:
        await self._authenticate(context)
        if isinstance(request, Malformed):
            await self._malformed(context, request)
            raise AssertionError("abort raises")
        answer = self._cordis.client_runs.keep_render_failure(
            request.agent, request.plugin_id, request.run_id, request.message, request.stack
        )
        return pb.PeerRenderFailureResponse(
            accepted=answer.accepted, code=answer.code, message=answer.message
        )


def _failed(message: str, code: str) -> pb.PeerClientQueryResponse:
    return pb.PeerClientQueryResponse(
        result=pb.PeerCallResult(failure=pb.PeerFailure(message=message, code=code))
    )
