"""Maps `CodemodeError` to and from gRPC rich status (`google.rpc.Status` + `ErrorInfo`, and
`RetryInfo` when the error carries a retry delay)."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from codemode_wire.errors import CodemodeError, Status
from codemode_wire.text import utf8_exceeds

# A status travels in trailers: the message twice (`grpc-message`, percent-encoded at up to 3
# bytes per byte, and base64 inside `grpc-status-details-bin`), the ErrorInfo metadata once.
# Peers refuse trailers over 8-16 KiB, and the call then fails with a bare RESOURCE_EXHAUSTED
# and no ErrorInfo; so text that echoes a huge input (a 10,000-character name) is shortened.
MAX_MESSAGE_BYTES = 1024
MAX_METADATA_VALUE_BYTES = 128

_GRPC_CODES: dict[Status, grpc.StatusCode] = {s: grpc.StatusCode[s.name] for s in Status}


def grpc_code(status: Status) -> grpc.StatusCode:
    return _GRPC_CODES[status]


def to_status_proto(error: CodemodeError, domain: str) -> status_pb2.Status:
    """The `google.rpc.Status` for an error, with one `ErrorInfo` detail (its message and
    metadata values shortened to fit in trailers), then a `RetryInfo` when it has a delay."""
    metadata = {k: _clip(v, MAX_METADATA_VALUE_BYTES) for k, v in error.metadata.items()}
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=domain, metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    details = [detail]
    if error.retry_delay is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(round(max(0.0, error.retry_delay) * 1e9))
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    code = code_pb2.Code.Value(error.status.name)
    message = _clip(error.message, MAX_MESSAGE_BYTES)
    return status_pb2.Status(code=code, message=message, details=details)


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


def ok_status_proto() -> status_pb2.Status:
    return status_pb2.Status(code=code_pb2.OK)


# gRPC's own retry policies read only this trailer, not RetryInfo: sent beside it, the delay
# the server asks for is what a client's service-config retry waits (both clients use one).
PUSHBACK = "grpc-retry-pushback-ms"


def to_rpc_status(error: CodemodeError, domain: str) -> grpc.Status:
    """A `grpc.Status` carrying the rich status in its trailing metadata (and the retry
    delay as gRPC's pushback, when it has one)."""
    status = rpc_status.to_status(to_status_proto(error, domain))
    if error.retry_delay is None:
        return status
    pushback = ((PUSHBACK, str(round(max(0.0, error.retry_delay) * 1000))),)
    return _Status(status.code, status.details, (*status.trailing_metadata, *pushback))


class _Status(grpc.Status):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Any) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


async def abort_rpc(
    context: grpc.aio.ServicerContext[Any, Any], error: CodemodeError, domain: str
) -> None:
    """End the RPC with the error's rich status (raises, as `abort` does).

    Through `abort`, not `abort_with_status`: the OpenTelemetry aio server interceptor wraps
    the context and records the status on the server span from `abort`/`set_code`, while
    grpc's `abort_with_status` calls the unwrapped context's `abort`, so every failed RPC was
    traced as OK.
    """
    status = to_rpc_status(error, domain)
    await context.abort(status.code, status.details, status.trailing_metadata)


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    """The first `ErrorInfo` detail of a rich status, if any."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


def retry_delay(status: status_pb2.Status) -> float | None:
    """Seconds from the first `RetryInfo` detail of a rich status (None: no RetryInfo)."""
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToNanoseconds()) / 1e9
    return None
