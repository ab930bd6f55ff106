"""gRPC errors as Python exceptions carrying the `ErrorInfo` the services attach.

try:
    await client.get_agent("agents/nope")
except NotFound as exc:
    exc.reason    # "AGENT_NOT_FOUND"
    exc.domain    # "codemode.registry"
    exc.metadata  # {"agent": "agents/nope"}

`retry_delay` is the delay (seconds) of the status's `google.rpc.RetryInfo`, set when the
service says the same request may succeed after it (a `run_code` that no code runtime took:
`Unavailable`, reason `CODE_RUNTIME_UNAVAILABLE`, metadata `phase: connect`); None otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from grpc_status import rpc_status

from codemode_client.results import AdditionalContext
from codemode_wire.grpc_status import error_info
from codemode_wire.grpc_status import retry_delay as retry_delay_of


class CodemodeError(Exception):
    """Base class: `code` is the gRPC status code; reason/domain/metadata come from ErrorInfo."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: dict[str, str] | None = None,
        code: grpc.StatusCode | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata = metadata or {}
        self.retry_delay = retry_delay
        if code is not None:
            self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, reason={self.reason!r})"


class InvalidArgument(CodemodeError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CodemodeError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(CodemodeError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(CodemodeError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(CodemodeError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(CodemodeError):
    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(CodemodeError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(CodemodeError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(CodemodeError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(CodemodeError):
    code = grpc.StatusCode.CANCELLED


class Internal(CodemodeError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[CodemodeError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        PermissionDenied,
        Unauthenticated,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Cancelled,
        Internal,
    )
}


def from_rpc_error(error: Any) -> CodemodeError:
    """Converts a `grpc.aio.AioRpcError` (or `grpc.RpcError`) into the matching exception."""
    code = error.code()
    status = rpc_status.from_call(error)
    info = error_info(status) if status is not None else None
    cls = _BY_CODE.get(code, CodemodeError)
    return cls(
        error.details() or code.name,
        reason=info.reason if info else "",
        domain=info.domain if info else "",
        metadata=dict(info.metadata) if info else {},
        code=code,
        retry_delay=retry_delay_of(status) if status is not None else None,
    )


class ToolError(Exception):
    """Raise from a tool handler to fail the call with this message and a stable code: the
    model sees exactly this text (any other exception reaches it only as a generic message
    with an error id; see `codemode_client.provider`). `ToolFailed` is the same class.

    `additional_contexts` still reach the conversation: a failure may explain itself too."""

    def __init__(
        self,
        message: str,
        code: str = "",
        *,
        additional_contexts: Sequence[AdditionalContext] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.additional_contexts = tuple(additional_contexts)
