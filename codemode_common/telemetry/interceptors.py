"""gRPC transport spans from opentelemetry-instrumentation-grpc (grpc.aio interceptors).

Filtered out: the health service (probes would otherwise fill traces), and the runtime's
`Multiplex` stream, which carries the frames of every run for a minute: its span would be in
no run's trace (each run's `run_program` span is a child of its `run_code` call), and its
interceptor would sit in the path of every frame, both ways, on both sides. Only set-up code
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


_MULTIPLEX = "/codemode.runtime.v1.RuntimeService/Multiplex"


def _traced() -> Any:
    return filters.negate(
        filters.any_of(filters.health_check(), filters.full_method_name(_MULTIPLEX))
    )


def server_interceptors(tracer_provider: TracerProvider | None) -> list[Any]:
    """Interceptors for `grpc.aio.server(interceptors=...)`; [] when tracing is off."""
    if tracer_provider is None:
        return []
    interceptor = aio_server_interceptor(  # type: ignore[no-untyped-call]
        tracer_provider=tracer_provider, filter_=_traced()
    )
    return [interceptor]


def client_interceptors(tracer_provider: TracerProvider | None) -> list[Any]:
    """Interceptors for `grpc.aio.insecure_channel(interceptors=...)`; [] when tracing is off."""
    if tracer_provider is None:
        return []
    interceptors = aio_client_interceptors(  # type: ignore[no-untyped-call]
        tracer_provider=tracer_provider, filter_=_traced()
    )
    return list(interceptors)
