"""The error model shared by both services and the Python client.

Domain code raises `CodemodeError` with a canonical status (`Status`, mirroring gRPC's codes
without importing grpc) and a stable machine-readable `reason`. The transport layer turns it
into a `google.rpc.Status` with an `ErrorInfo` detail, and a `RetryInfo` detail when the error
says the request may be repeated (see `codemode_wire.grpc_status`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Status(enum.Enum):
    """Canonical status codes used by the domain (a subset of gRPC's, same names)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    UNAVAILABLE = "UNAVAILABLE"
    ABORTED = "ABORTED"
    CANCELLED = "CANCELLED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"
    DATA_LOSS = "DATA_LOSS"


class CodemodeError(Exception):
    """An error that crosses a service boundary as a status with `ErrorInfo`."""

    def __init__(
        self,
        status: Status,
        reason: str,
        message: str,
        metadata: Mapping[str, str] | None = None,
        *,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})
        # Seconds after which the same request may succeed (sent as `google.rpc.RetryInfo`);
        # None: the caller must not retry blindly.
        self.retry_delay = retry_delay

    def __repr__(self) -> str:
        return f"CodemodeError({self.status.name}, {self.reason!r}, {self.message!r})"


def invalid_argument(reason: str, message: str, **metadata: str) -> CodemodeError:
    return CodemodeError(Status.INVALID_ARGUMENT, reason, message, metadata)


def not_found(reason: str, message: str, **metadata: str) -> CodemodeError:
    return CodemodeError(Status.NOT_FOUND, reason, message, metadata)


def already_exists(reason: str, message: str, **metadata: str) -> CodemodeError:
    return CodemodeError(Status.ALREADY_EXISTS, reason, message, metadata)


def failed_precondition(reason: str, message: str, **metadata: str) -> CodemodeError:
    return CodemodeError(Status.FAILED_PRECONDITION, reason, message, metadata)


def unavailable(
    reason: str, message: str, *, retry_delay: float | None = None, **metadata: str
) -> CodemodeError:
    """`retry_delay`: the request is safe to repeat after that many seconds (RetryInfo)."""
    return CodemodeError(Status.UNAVAILABLE, reason, message, metadata, retry_delay=retry_delay)


def unauthenticated(reason: str, message: str, **metadata: str) -> CodemodeError:
    """No credentials, or credentials that do not verify: the caller is nobody we know."""
    return CodemodeError(Status.UNAUTHENTICATED, reason, message, metadata)


def permission_denied(reason: str, message: str, **metadata: str) -> CodemodeError:
    """A known caller asked for something no grant of its allows."""
    return CodemodeError(Status.PERMISSION_DENIED, reason, message, metadata)


def resource_exhausted(
    reason: str, message: str, *, retry_delay: float, **metadata: str
) -> CodemodeError:
    """Over an admission limit: nothing was started, and the same request may succeed after
    `retry_delay` seconds (RetryInfo)."""
    return CodemodeError(
        Status.RESOURCE_EXHAUSTED, reason, message, metadata, retry_delay=retry_delay
    )


def internal(reason: str, message: str, **metadata: str) -> CodemodeError:
    return CodemodeError(Status.INTERNAL, reason, message, metadata)
