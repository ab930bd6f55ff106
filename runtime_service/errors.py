"""Domain errors of the runtime (the servicer maps them to gRPC status codes)."""

from __future__ import annotations

__all__ = ["RunRequestError", "RuntimeDisposedError", "RuntimeExhaustedError"]


class RunRequestError(ValueError):
    """The run request itself is unusable (maps to ``INVALID_ARGUMENT``)."""


class RuntimeDisposedError(RuntimeError):
    """The runtime is shutting down and accepts no more runs (maps to ``UNAVAILABLE``)."""


class RuntimeExhaustedError(RuntimeError):
    """No sandbox was free for a run or a plugin host, so nothing ran (maps to
    ``RESOURCE_EXHAUSTED`` with ``RetryInfo``: the same request may succeed after
    ``retry_delay_s``)."""

    def __init__(self, message: str, retry_delay_s: float) -> None:
        super().__init__(message)
        self.retry_delay_s = retry_delay_s
