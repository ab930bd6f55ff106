"""The caller's credentials as the transport sees them, and the one place a service checks
them: `add_service(..., guard=...)` runs the guard before every method of the service.

The guard authenticates (`codemode_common.principals`) and authorizes; the principal it
returns is kept for the RPC in a context variable (`current_principal`), so that the servicer
hands it to domain calls explicitly and the domain never sees grpc.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc

from codemode_common.principals import ANONYMOUS, Principal
from codemode_wire.errors import CodemodeError
from codemode_wire.grpc_status import abort_rpc

__all__ = ["Guard", "bearer_token", "certificate_names", "current_principal", "guarded"]

_PRINCIPAL: contextvars.ContextVar[Principal] = contextvars.ContextVar(
    "codemode_principal", default=ANONYMOUS
)
_BEARER = "bearer "
# How long a refused stream waits for the client's first message before the refusal is sent
# anyway (see `_first_message_sent`): a client writes its opening message as soon as the call
# starts, so this only delays a client that sends nothing (and holds nothing longer).
REFUSAL_READ_S = 2.0


def current_principal() -> Principal:
    """The principal of the RPC being served (set by the guard before the method ran)."""
    return _PRINCIPAL.get()


def certificate_names(context: grpc.aio.ServicerContext[Any, Any]) -> list[str]:
    """The verified client certificate's URI SANs, then its DNS SANs (none without mutual
    TLS: grpc reports a peer certificate only when it requested and checked one)."""
    auth = context.auth_context()
    names = [*auth.get("peer_uri", ()), *auth.get("peer_dns", ())]
    return [n.decode("utf-8", "replace") for n in names]


def bearer_token(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The token of an `authorization: Bearer …` header; an empty one counts as given (and
    then fails to verify), so that a broken client is told rather than treated as nobody."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            if value[: len(_BEARER)].lower() == _BEARER:
                return value[len(_BEARER) :].strip()
            return ""
    return None


class Guard(Protocol):
    domain: str
    """ErrorInfo domain of the guard's refusals."""

    async def __call__(
        self, context: grpc.aio.ServicerContext[Any, Any], method: str, request: Any | None
    ) -> Principal:
        """The caller's principal if it may call `method` with `request` (None: a stream's
        requests, checked per message by the servicer); else raises CodemodeError."""
        ...


Behaviour = Callable[..., Any]


def guarded(
    guard: Guard,
    method: str,
    behaviour: Behaviour,
    *,
    streams_in: bool,
    streams_out: bool,
    readable: Callable[[Any], bool],
) -> Behaviour:
    """`behaviour` run only once `guard` admitted the call; a refusal ends the RPC with the
    guard's rich status and the method never runs (so nothing changes). The wrapper is of the
    same kind as `behaviour` (coroutine or async generator function): grpc serves each kind
    differently."""

    async def admitted(context: grpc.aio.ServicerContext[Any, Any], request: Any) -> bool:
        # A stream's requests (checked per message by the servicer), or a request the parser
        # could not read (the method's to refuse, MALFORMED_MESSAGE, once authenticated),
        # reach the guard as None: the rules cannot read their fields.
        shown = None if streams_in or not readable(request) else request
        try:
            _PRINCIPAL.set(await guard(context, method, shown))
        except CodemodeError as error:
            if streams_in:
                await _first_message_sent(request)
            await abort_rpc(context, error, guard.domain)
            return False
        return True

    if streams_out:

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if await admitted(context, request):
                async for item in behaviour(request, context):
                    yield item

        return stream

    async def unary(request: Any, context: Any) -> Any:
        if await admitted(context, request):
            return await behaviour(request, context)
        return None

    return unary


async def _first_message_sent(requests: AsyncIterator[Any]) -> None:
    """Waits (at most REFUSAL_READ_S) until the client's first message of a stream, or its end,
    has arrived, and discards it.

    A status sent while the client's first write is still in flight fails that write, and
    grpc.aio's client then reports `INTERNAL "Internal error from Core"` in place of the
    status the server sent (grpcio's `_StreamRequestMixin._write` overwrites it). Every stream
    of these services opens with a message its client writes at once, so once it has arrived
    the client has no write in flight and reads the refusal as sent.
    """
    with contextlib.suppress(Exception):
        await asyncio.wait_for(anext(requests), REFUSAL_READ_S)
