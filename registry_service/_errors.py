"""Turns domain errors into rich gRPC statuses at the servicer boundary."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from codemode_common.errors import CodemodeError
from codemode_common.grpc_status import to_rpc_status
from codemode_common.text import utf8_exceeds

DOMAIN = "codemode.registry"
Req = TypeVar("Req")
Resp = TypeVar("Resp")

# A status travels in trailers: the message twice (`grpc-message`, percent-encoded at up to 3
# bytes per byte, and base64 inside `grpc-status-details-bin`), the ErrorInfo metadata once.
# Peers refuse trailers over 8-16 KiB, and the call then fails with a bare RESOURCE_EXHAUSTED
# and no ErrorInfo; so text that echoes a huge input (a 10,000-character name) is shortened.
MAX_MESSAGE_BYTES = 1024
MAX_METADATA_VALUE_BYTES = 128


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: CodemodeError) -> None:
    await context.abort_with_status(to_rpc_status(_bounded(error), DOMAIN))


def _bounded(error: CodemodeError) -> CodemodeError:
    message = _clip(error.message, MAX_MESSAGE_BYTES)
    metadata = {k: _clip(v, MAX_METADATA_VALUE_BYTES) for k, v in error.metadata.items()}
    if message is error.message and metadata == error.metadata:
        return error
    return CodemodeError(error.status, error.reason, message, metadata)


def _clip(text: str, limit: int) -> str:
    """`text` within `limit` bytes of UTF-8, keeping its start and its end (the message's
    "what" and "why" around an echoed input)."""
    if not utf8_exceeds(text, limit):
        return text
    data = text.encode("utf-8", "surrogatepass")
    keep = limit - 40  # room for the marker
    head, tail = data[: keep * 2 // 3], data[len(data) - keep // 3 :]
    elided = len(data) - len(head) - len(tail)
    # A cut through a character (or a lone surrogate) loses those bytes, nothing else.
    start, end = head.decode("utf-8", "ignore"), tail.decode("utf-8", "ignore")
    return f"{start}…[{elided} bytes elided]…{end}"


def unary(
    handler: Callable[[Any, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]],
) -> Callable[[Any, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]]:
    @functools.wraps(handler)
    async def wrapper(
        self: Any, request: Req, context: grpc.aio.ServicerContext[Req, Resp]
    ) -> Resp:
        try:
            return await handler(self, request, context)
        except CodemodeError as error:
            await abort(context, error)
            raise AssertionError("unreachable") from error

    return wrapper


def streaming(
    handler: Callable[[Any, Any, grpc.aio.ServicerContext[Any, Resp]], AsyncIterator[Resp]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext[Any, Resp]], AsyncIterator[Resp]]:
    @functools.wraps(handler)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Resp]
    ) -> AsyncIterator[Resp]:
        try:
            async for response in handler(self, request, context):
                yield response
        except CodemodeError as error:
            await abort(context, error)

    return wrapper
