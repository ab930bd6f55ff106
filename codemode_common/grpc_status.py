"""Maps `CodemodeError` to and from gRPC rich status (`google.rpc.Status` + `ErrorInfo`)."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from codemode_common.errors import CodemodeError, Status

_GRPC_CODES: dict[Status, grpc.StatusCode] = {s: grpc.StatusCode[s.name] for s in Status}


def grpc_code(status: Status) -> grpc.StatusCode:
    return _GRPC_CODES[status]


def to_status_proto(error: CodemodeError, domain: str) -> status_pb2.Status:
    """The `google.rpc.Status` for an error, with one `ErrorInfo` detail."""
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=domain, metadata=error.metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    code = code_pb2.Code.Value(error.status.name)
    return status_pb2.Status(code=code, message=error.message, details=[detail])


def ok_status_proto() -> status_pb2.Status:
    return status_pb2.Status(code=code_pb2.OK)


def to_rpc_status(error: CodemodeError, domain: str) -> grpc.Status:
    """A `grpc.Status` carrying the rich status in its trailing metadata."""
    return rpc_status.to_status(to_status_proto(error, domain))


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    """The first `ErrorInfo` detail of a rich status, if any."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None
