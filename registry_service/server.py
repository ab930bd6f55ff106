"""Starts the registry's gRPC server: the service, health checking, reflection, shutdown."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from codemode_common.grpc_server import (
    base_options,
    open_server,
    serve_until_signalled,
    warn_if_descriptors_short,
    warn_if_exposed,
)
from codemode_common.request_parsing import add_service
from codemode_common.telemetry.interceptors import server_interceptors
from codemode_wire.api.registry.v1 import cordis_peer_pb2, page_runner_pb2, registry_service_pb2
from registry_service.config import RegistrySettings
from registry_service.cordis_page_peers import CordisPagePeerServicer
from registry_service.page_runner_servicer import PageRunnerServicer
from registry_service.registry import Registry, build_registry
from registry_service.rpc_access import RegistryGuard
from registry_service.servicer import RegistryServicer

SERVICE_NAME = registry_service_pb2.DESCRIPTOR.services_by_name["RegistryService"].full_name
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class RunningRegistry:
    server: grpc.aio.Server
    registry: Registry
    port: int
    health: health.aio.HealthServicer
    servicer: RegistryServicer
    pages: PageRunnerServicer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: health NOT_SERVING and new RPCs refused at once; tool calls in
        flight get `grace` seconds; then the long-lived streams end (UNAVAILABLE) and whatever
        is left is cancelled."""
        grace = self.registry.settings.shutdown_grace_s if grace is None else grace
        await self.health.enter_graceful_shutdown()
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await self.servicer.drain(grace)
        self.pages.drain()
        await stopping
        await self.registry.close()


async def peer_address(settings: RegistrySettings, port: int) -> str:
    """Where the other registries reach this one's peer channel (`cordis_peer_address`): else
    the `listen` host, or for a wildcard this machine's address (what its host name resolves
    to: a pod's or a container's own IP)."""
    if settings.cordis_peer_address:
        return settings.cordis_peer_address
    host = settings.listen.rsplit(":", 1)[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        name = socket.gethostname()
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                name, port, type=socket.SOCK_STREAM
            )
            host = str(found[0][4][0]) if found else name
        except OSError:
            host = name
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
    server = grpc.aio.server(
        options=base_options(settings.max_message_bytes, settings.connection_limits()),
        interceptors=server_interceptors(registry.telemetry.tracer_provider) or None,
    )
    policy = registry.authority.policy
    guard = RegistryGuard(settings.authenticator(), registry.authority)
    servicer = RegistryServicer(registry, policy)
    await registry.restore_catalog()  # before the first call can start
    await registry.close_interrupted()
    add_service(
        server,
        servicer,
        registry_service_pb2.DESCRIPTOR.services_by_name["RegistryService"],
        # Open (no authentication configured): every caller is `anonymous`, the default of
        # `current_principal`, and the calls' path stays as it was.
        guard if policy.enforced else None,
    )
    pages = PageRunnerServicer(registry, policy)
    add_service(
        server,
        pages,
        page_runner_pb2.DESCRIPTOR.services_by_name["PageRunnerService"],
        guard if policy.enforced else None,
    )
    placement = registry.cordis.runner.placement
    token = settings.cordis_peer_token()
    if placement is not None and token is not None:
        # Its own check (the peer token), whatever the callers' authentication is.
        add_service(
            server,
            # The peer RPCs of cordis_peers.py, and client-half calls to this registry's pages.
            CordisPagePeerServicer(registry.cordis, token),
            cordis_peer_pb2.DESCRIPTOR.services_by_name["CordisPeerService"],
            None,
        )
    tls = settings.server_tls()
    warn_if_exposed("registry", settings.listen, authenticated=policy.enforced, tls=tls is not None)
    warn_if_descriptors_short("registry", settings.max_connections)
    port, health_servicer = await open_server(
        server,
        service_name=SERVICE_NAME,
        listen=settings.listen,
        what="registry",
        tls=tls,
        also_reflected=(
            page_runner_pb2.DESCRIPTOR.services_by_name["PageRunnerService"].full_name,
        ),
    )

    if placement is not None:
        placement.address = await peer_address(settings, port)

    async def report_health(serving: bool) -> None:
        # Calls with an agent fail while the history store does: not serving, for both names.
        status = health_pb2.HealthCheckResponse.SERVING if serving else _NOT_SERVING
        await health_servicer.set(SERVICE_NAME, status)
        await health_servicer.set("", status)

    await registry.start_background(report_health)
    return RunningRegistry(server, registry, port, health_servicer, servicer, pages)


async def serve(settings: RegistrySettings) -> bool:
    """Serves until SIGINT/SIGTERM; True when SIGINT stopped it."""

    async def start_with(
        settings: RegistrySettings,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
    ) -> RunningRegistry:
        return await start(settings, tracer_provider=tracer_provider, meter_provider=meter_provider)

    return await serve_until_signalled("registry", settings, start_with)
