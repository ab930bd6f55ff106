"""Starts the runtime's gRPC server: the service, health checking, reflection, shutdown.

Workers are spawned from this process's default asyncio loop (never uvloop): uvloop forks
without exec'ing at once, and grpc's fork handlers then run in the child. Fork support in grpc
is disabled before grpc is imported, for the same reason.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from dataclasses import dataclass

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2_grpc
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from codemode_common.grpc_server import (
    base_options,
    grpc_ms,
    open_server,
    serve_until_signalled,
    warn_if_descriptors_short,
    warn_if_exposed,
)
from codemode_common.request_parsing import add_service
from codemode_common.telemetry.interceptors import server_interceptors
from codemode_wire.api.runtime.v1 import runtime_pb2
from runtime_service.capabilities import probe_capabilities
from runtime_service.config import RuntimeSettings
from runtime_service.registry_only import RegistryOnly
from runtime_service.runtime import Runtime
from runtime_service.servicer import RuntimeServicer
from runtime_service.source_check import SourceChecker
from runtime_service.telemetry import RuntimeTelemetry

__all__ = ["MIN_PING_INTERVAL_MS", "RunningRuntime", "serve", "server_options", "start"]

_TERMINAL_FLUSH_S = 1.0  # lets "runtime disposed" terminal messages reach their callers
# Closest spacing of client pings accepted on a connection with no data flowing (the
# registry's keepalive may not be shorter: its config enforces the same floor).
MIN_PING_INTERVAL_MS = 20_000
SERVICE_NAME = runtime_pb2.DESCRIPTOR.services_by_name["RuntimeService"].full_name


@dataclass
class RunningRuntime:
    server: grpc.aio.Server
    runtime: Runtime
    port: int
    health: health_aio.HealthServicer
    grace_s: float
    health_server: grpc.aio.Server | None = None
    """The plaintext health-only server (`health_listen`), if any."""
    health_port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: refuse new runs, give live runs ``grace`` seconds, then abort the
        rest with "runtime disposed" (their callers still get that terminal message), wait
        until every worker has exited, and stop the server."""
        grace = self.grace_s if grace is None else grace
        await self.health.enter_graceful_shutdown()
        self.runtime.refuse_new_runs()
        await self.runtime.wait_idle(grace)
        await self.runtime.dispose()
        await self.server.stop(_TERMINAL_FLUSH_S)
        if self.health_server is not None:
            await self.health_server.stop(0)


def server_options(settings: RuntimeSettings) -> list[tuple[str, int]]:
    """The gRPC server's channel arguments for these settings."""
    options = [
        # The registry pings idle connections (its runtime_keepalive_s, at least this far
        # apart) to notice a vanished runtime; accept those pings instead of answering them
        # with GOAWAY "too_many_pings", which would also end the runs on that connection.
        *base_options(
            settings.max_message_bytes,
            settings.connection_limits(),
            min_ping_interval_ms=MIN_PING_INTERVAL_MS,
        ),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    if settings.max_connection_age_s is not None:
        options.append(("grpc.max_connection_age_ms", grpc_ms(settings.max_connection_age_s)))
    if settings.max_connection_age_grace_s is not None:
        options.append(
            ("grpc.max_connection_age_grace_ms", grpc_ms(settings.max_connection_age_grace_s))
        )
    return options


async def start(
    settings: RuntimeSettings,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> RunningRuntime:
    """Starts the server. Telemetry uses the given providers, else the global ones; gRPC
    server spans are added only when tracing is on."""
    telemetry = RuntimeTelemetry(tracer_provider, meter_provider)
    runtime = Runtime(settings.runtime_options())
    await runtime.start()
    checker = SourceChecker(runtime)
    capabilities = await probe_capabilities(runtime, checker)
    telemetry.instrument_pool(runtime.pool)  # after the probe: only runs' hand-offs count
    telemetry.observe_pool(runtime.pool)
    server = grpc.aio.server(
        options=server_options(settings),
        interceptors=server_interceptors(telemetry.tracer_provider) or None,
    )
    guard = RegistryOnly(settings.registry_identities)
    add_service(
        server,
        RuntimeServicer(
            runtime,
            capabilities,
            telemetry,
            max_message_bytes=settings.max_message_bytes,
            checker=checker,
        ),
        runtime_pb2.DESCRIPTOR.services_by_name["RuntimeService"],
        guard if guard.enforced else None,  # open: no wrapper on the runs' hot path
    )
    tls = settings.server_tls()
    warn_if_exposed("runtime", settings.listen, authenticated=guard.enforced, tls=tls is not None)
    warn_if_descriptors_short("runtime", settings.max_connections)
    try:
        port, health_servicer = await open_server(
            server,
            service_name=SERVICE_NAME,
            listen=settings.listen,
            what="runtime",
            tls=tls,
        )
    except OSError:
        await runtime.dispose()
        raise
    try:
        health_server, health_port = await _health_only(settings, health_servicer)
    except OSError:
        await server.stop(0)
        await runtime.dispose()
        raise
    return RunningRuntime(
        server,
        runtime,
        port,
        health_servicer,
        settings.shutdown_grace_s,
        health_server,
        health_port,
    )


async def _health_only(
    settings: RuntimeSettings, health: health_aio.HealthServicer
) -> tuple[grpc.aio.Server | None, int]:
    """A plaintext server with only grpc.health on `health_listen` (none when empty): the
    kubelet's gRPC probes speak no TLS, and the RuntimeService port may require mutual TLS. It
    reports the same statuses (one servicer), and reveals nothing else. Its connections are
    bounded like the main port's."""
    listen = settings.health_listen
    if not listen:
        return None, 0
    server = grpc.aio.server(
        options=base_options(64 * 1024, settings.connection_limits()),
    )
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot bind the runtime's health port to {listen}")
    await server.start()
    return server, port


async def serve(settings: RuntimeSettings) -> bool:
    """Serves until SIGINT/SIGTERM; True when SIGINT stopped it."""

    async def start_with(
        settings: RuntimeSettings,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
    ) -> RunningRuntime:
        return await start(settings, tracer_provider=tracer_provider, meter_provider=meter_provider)

    return await serve_until_signalled("runtime", settings, start_with)
