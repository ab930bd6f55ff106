"""gRPC transport spans from opentelemetry-instrumentation-grpc (grpc.aio interceptors).

The health service is filtered out (probes would otherwise fill traces). Only set-up code
imports this module; with tracing off no interceptor is installed at all.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.instrumentation.grpc import (
    aio_client_interceptors,
    aio_server_interceptor,
    filters,
)
from opentelemetry.trace import TracerProvider

__all__ = ["client_interceptors", "server_interceptors"]


def _not_health() -> Any:
    return filters.negate(filters.health_check())


def server_interceptors(tracer_provider: TracerProvider | None) -> list[Any]:
    """Interceptors for `grpc.aio.server(interceptors=...)`; [] when tracing is off."""
    if tracer_provider is None:
        return []
    interceptor = aio_server_interceptor(  # type: ignore[no-untyped-call]
        tracer_provider=tracer_provider, filter_=_not_health()
    )
    return [interceptor]


def client_interceptors(tracer_provider: TracerProvider | None) -> list[Any]:
    """Interceptors for `grpc.aio.insecure_channel(interceptors=...)`; [] when tracing is off."""
    if tracer_provider is None:
        return []
    interceptors = aio_client_interceptors(  # type: ignore[no-untyped-call]
        tracer_provider=tracer_provider, filter_=_not_health()
    )
    return list(interceptors)
