"""Values exchanged between a run and its caller: binding calls, replies, the final result."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "FAILURE_KINDS",
    "BindingCall",
    "BindingHandler",
    "BindingResult",
    "FailureKind",
    "LogListener",
    "PendingCall",
    "RunFailure",
    "RunResult",
]

FailureKind = Literal[
    "exception", "timeout", "abort", "worker-exit", "invalid-output", "output-limit"
]
FAILURE_KINDS: tuple[FailureKind, ...] = (
    "exception",
    "timeout",
    "abort",
    "worker-exit",
    "invalid-output",
    "output-limit",
)


@dataclass(frozen=True, slots=True)
class BindingCall:
    """A binding call the program made, numbered 1, 2, ... in arrival order within the run."""

    seq: int
    name: str
    arguments: object
    """A lossless JSON value, freshly decoded: the handler owns it."""
    arguments_json: str | None = None
    """Its JSON text (``jsonvalue.dumps``), when the run made it already (large arguments are
    spelled off the event loop)."""


@dataclass(frozen=True, slots=True)
class BindingResult:
    ok: bool
    value: object = None
    message: str = ""
    value_json: str | None = None
    """A success's value as the caller's JSON text, not yet read (``success_json``): the run
    reads it only where the worker's own reading could differ (``flatwire.json_token``)."""

    @classmethod
    def success(cls, value: object) -> BindingResult:
        return cls(True, value)

    @classmethod
    def success_json(cls, text: str) -> BindingResult:
        """A success whose value is the JSON text ``text``, refused when the run reads it
        ("binding resolution must be lossless JSON") if it is not lossless JSON."""
        return cls(True, value_json=text)

    @classmethod
    def failure(cls, message: str) -> BindingResult:
        return cls(False, None, message)


class PendingCall:
    """A binding call answered by callback instead of an awaitable.

    A handler may return one of these: the run registers its answer callback, and the
    handler's ``resolve`` runs it synchronously -- the worker gets its reply in the same
    event-loop step as the result arrives, with no future callback hop in between. The first
    ``resolve`` counts; ``cancel`` (the run ended) drops the callback.
    """

    __slots__ = ("_callback", "_result")

    def __init__(self) -> None:
        self._callback: Callable[[BindingResult], None] | None = None
        self._result: BindingResult | None = None

    def on_result(self, callback: Callable[[BindingResult], None]) -> None:
        if self._result is not None:
            callback(self._result)
        else:
            self._callback = callback

    def resolve(self, result: BindingResult) -> bool:
        """Deliver the result; False if it was already resolved or cancelled."""
        if self._result is not None:
            return False
        self._result = result
        callback, self._callback = self._callback, None
        if callback is not None:
            try:
                callback(result)
            except Exception as exc:  # reported like a failing future callback, not raised
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "binding call answer failed", "exception": exc}
                )
        return True

    def cancel(self) -> None:
        self._callback = None
        if self._result is None:
            self._result = BindingResult.failure("cancelled")

    @property
    def done(self) -> bool:
        return self._result is not None


BindingHandler = Callable[[BindingCall], Awaitable[BindingResult] | PendingCall]
LogListener = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RunFailure:
    kind: FailureKind
    message: str


@dataclass(frozen=True, slots=True)
class RunResult:
    """Exactly one terminal outcome: success (with or without a value) or one failure."""

    logs: list[str] = field(default_factory=list)
    has_value: bool = False
    value: object = None
    error: RunFailure | None = None
    value_json: str | None = None
    """The value's JSON text (``jsonvalue.dumps``), when the run made it already (large
    values are spelled off the event loop)."""

    @property
    def ok(self) -> bool:
        return self.error is None
