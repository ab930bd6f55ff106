"""Starts the runtime's gRPC server: the service, health checking, reflection, shutdown.

Workers are spawned from this process's default asyncio loop (never uvloop): uvloop forks
without exec'ing at once, and grpc's fork handlers then run in the child. Fork support in grpc
is disabled before grpc is imported, for the same reason.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from codemode_common.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from codemode_common.telemetry import logs
from codemode_common.telemetry.interceptors import server_interceptors
from codemode_common.telemetry.setup import TelemetryConfigError, configure
from runtime_service.capabilities import probe_capabilities
from runtime_service.config import RuntimeSettings
from runtime_service.runtime import Runtime
from runtime_service.servicer import RuntimeServicer
from runtime_service.telemetry import RuntimeTelemetry

__all__ = ["RunningRuntime", "serve", "start"]

log = logging.getLogger(__name__)
_TERMINAL_FLUSH_S = 1.0  # lets "runtime disposed" terminal messages reach their callers
SERVICE_NAME = runtime_pb2.DESCRIPTOR.services_by_name["RuntimeService"].full_name


@dataclass
class RunningRuntime:
    server: grpc.aio.Server
    runtime: Runtime
    port: int
    health: health_aio.HealthServicer
    grace_s: float

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
    capabilities = await probe_capabilities(runtime)
    telemetry.instrument_pool(runtime.pool)  # after the probe: only runs' hand-offs count
    telemetry.observe_pool(runtime.pool)
    limit = settings.max_message_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ],
        interceptors=server_interceptors(telemetry.tracer_provider) or None,
    )
    runtime_pb2_grpc.add_RuntimeServiceServicer_to_server(
        RuntimeServicer(runtime, capabilities, telemetry), server
    )
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        await runtime.dispose()
        raise OSError(f"cannot bind runtime to {settings.listen}")
    await server.start()
    await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return RunningRuntime(server, runtime, port, health_servicer, settings.shutdown_grace_s)


async def serve(settings: RuntimeSettings) -> None:
    try:
        telemetry = configure(settings.telemetry_config())
    except TelemetryConfigError as exc:
        print(f"runtime: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    telemetry.install_global()
    logs.install(settings.log_format)
    log.info("runtime traces: %s", telemetry.destination)
    try:
        running = await start(
            settings,
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
        )
        log.info("runtime listening on port %d", running.port)
        print(f"runtime listening on port {running.port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await running.stop()
    finally:
        telemetry.shutdown()
