"""Domain errors of the runtime (the servicer maps them to gRPC status codes)."""

from __future__ import annotations

__all__ = ["RunRequestError", "RuntimeDisposedError"]


class RunRequestError(ValueError):
    """The run request itself is unusable (maps to ``INVALID_ARGUMENT``)."""


class RuntimeDisposedError(RuntimeError):
    """The runtime is shutting down and accepts no more runs (maps to ``UNAVAILABLE``)."""
