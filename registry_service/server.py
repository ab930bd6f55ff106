"""Starts the registry's gRPC server: the service, health checking, reflection, shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from codemode_common.api.registry.v1 import registry_service_pb2, registry_service_pb2_grpc
from codemode_common.telemetry import logs
from codemode_common.telemetry.interceptors import server_interceptors
from codemode_common.telemetry.setup import TelemetryConfigError, configure
from registry_service.config import RegistrySettings
from registry_service.registry import Registry, build_registry
from registry_service.servicer import RegistryServicer

log = logging.getLogger(__name__)
SERVICE_NAME = registry_service_pb2.DESCRIPTOR.services_by_name["RegistryService"].full_name


@dataclass
class RunningRegistry:
    server: grpc.aio.Server
    registry: Registry
    port: int
    health: health.aio.HealthServicer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.registry.settings.shutdown_grace_s if grace is None else grace)
        await self.registry.close()


async def start(
    settings: RegistrySettings,
    registry: Registry | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> RunningRegistry:
    """Starts the server. Telemetry: the registry's own providers (given here, else the global
    ones); gRPC server spans are added only when tracing is on."""
    registry = registry or build_registry(
        settings, tracer_provider=tracer_provider, meter_provider=meter_provider
    )
    limit = settings.max_message_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # A port another process already listens on is an error, not a shared port.
            ("grpc.so_reuseport", 0),
        ],
        interceptors=server_interceptors(registry.telemetry.tracer_provider) or None,
    )
    registry_service_pb2_grpc.add_RegistryServiceServicer_to_server(
        RegistryServicer(registry), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    try:
        port = server.add_insecure_port(settings.listen)  # grpc raises RuntimeError or returns 0
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot bind registry to {settings.listen}")
    await server.start()
    await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return RunningRegistry(server, registry, port, health_servicer)


async def serve(settings: RegistrySettings) -> None:
    try:
        telemetry = configure(settings.telemetry_config())
    except TelemetryConfigError as exc:
        print(f"registry: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    telemetry.install_global()
    logs.install(settings.log_format)
    log.info("registry traces: %s", telemetry.destination)
    try:
        running = await start(
            settings,
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
        )
        log.info("registry listening on %s", settings.listen.rsplit(":", 1)[0] + f":{running.port}")
        print(f"registry listening on port {running.port}", flush=True)
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
