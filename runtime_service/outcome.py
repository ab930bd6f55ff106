"""Values exchanged between a run and its caller: binding calls, replies, the final result."""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class BindingResult:
    ok: bool
    value: object = None
    message: str = ""

    @classmethod
    def success(cls, value: object) -> BindingResult:
        return cls(True, value)

    @classmethod
    def failure(cls, message: str) -> BindingResult:
        return cls(False, None, message)


BindingHandler = Callable[[BindingCall], Awaitable[BindingResult]]
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

    @property
    def ok(self) -> bool:
        return self.error is None
