"""Service registration whose request parsers never raise.

grpc answers request bytes its parser rejects (truncated, a bad wire type, invalid UTF-8 in a
string) with a bare UNKNOWN and no ErrorInfo. Registered through `add_service`, such bytes reach
the servicer as a `Malformed` value instead, which it answers with `malformed_error(...)`:
INVALID_ARGUMENT, reason MALFORMED_MESSAGE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from codemode_common.peer import Guard, guarded
from codemode_wire.errors import CodemodeError, invalid_argument

__all__ = ["Malformed", "add_service", "malformed_error"]


@dataclass(frozen=True, slots=True)
class Malformed:
    """Request bytes that are not the method's message."""

    detail: str


def malformed_error(request: Malformed) -> CodemodeError:
    return invalid_argument("MALFORMED_MESSAGE", f"malformed request: {request.detail}")


def _parser(message_type: type[Message]) -> Callable[[bytes], Message | Malformed]:
    def parse(data: bytes) -> Message | Malformed:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return Malformed(str(exc))

    return parse


_HANDLERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_service(
    server: grpc.aio.Server, servicer: Any, service: ServiceDescriptor, guard: Guard | None = None
) -> None:
    """Registers every method of `service` as the generated `add_*Servicer_to_server` does
    (the servicer's method of the same name), with request parsers that never raise; with a
    `guard`, every method runs only once the guard admitted its caller (`codemode_common.peer`)."""
    handlers = {}
    for method in service.methods:
        make = _HANDLERS[(method.client_streaming, method.server_streaming)]
        behaviour = getattr(servicer, method.name)
        if guard is not None:
            behaviour = guarded(
                guard,
                method.name,
                behaviour,
                streams_in=method.client_streaming,
                streams_out=method.server_streaming,
                readable=lambda request: not isinstance(request, Malformed),
            )
        handlers[method.name] = make(
            behaviour,
            request_deserializer=_parser(GetMessageClass(method.input_type)),
            response_serializer=GetMessageClass(method.output_type).SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)
