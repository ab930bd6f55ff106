"""Turns domain errors into rich gRPC statuses at the servicer boundary."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from codemode_common.request_parsing import Malformed, malformed_error
from codemode_wire.errors import CodemodeError
from codemode_wire.grpc_status import abort_rpc

DOMAIN = "codemode.registry"
Req = TypeVar("Req")
Resp = TypeVar("Resp")


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: CodemodeError) -> None:
    await abort_rpc(context, error, DOMAIN)


def unary(
    handler: Callable[[Any, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]],
) -> Callable[[Any, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]]:
    @functools.wraps(handler)
    async def wrapper(
        self: Any, request: Req, context: grpc.aio.ServicerContext[Req, Resp]
    ) -> Resp:
        try:
            if isinstance(request, Malformed):
                raise malformed_error(request)
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
            if isinstance(request, Malformed):
                raise malformed_error(request)
            async for response in handler(self, request, context):
                yield response
        except CodemodeError as error:
            await abort(context, error)

    return wrapper
