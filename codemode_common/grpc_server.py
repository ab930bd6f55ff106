"""What both services' gRPC servers share: base options, health and reflection, binding, and
running until SIGINT/SIGTERM with telemetry set up around it.

Import it only where grpc may be imported (the runtime sets its fork settings first).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import resource
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from codemode_common.principals import is_loopback
from codemode_common.settings import ConnectionLimits
from codemode_common.telemetry import logs
from codemode_common.telemetry.setup import TelemetryConfig, TelemetryConfigError, configure
from codemode_common.tls import ServerTls

__all__ = [
    "DESCRIPTOR_RESERVE",
    "base_options",
    "grpc_ms",
    "open_server",
    "serve_until_signalled",
    "warn_if_descriptors_short",
    "warn_if_exposed",
]

log = logging.getLogger(__name__)
_HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


# Pings a client may send on a connection without data, at most this often (gRPC's own
# default); closer ones are strikes, and past MAX_PING_STRIKES the connection gets GOAWAY
# "too_many_pings" and is closed. A service that expects closer pings passes its own floor.
MIN_PING_INTERVAL_MS = 300_000
MAX_PING_STRIKES = 2
# Descriptors a service needs beside its clients' connections: its stores, logs, channels to
# other services, worker pipes. `max_connections` above the descriptor limit less this could
# not keep the process from running out (warned at start).
DESCRIPTOR_RESERVE = 256


def base_options(
    max_message_bytes: int,
    limits: ConnectionLimits,
    *,
    min_ping_interval_ms: int = MIN_PING_INTERVAL_MS,
) -> list[tuple[str, int]]:
    """The channel arguments every server of both services starts with.

    Each bound is grpc core's own, checked against grpcio 1.85 with raw sockets: a connection
    past `grpc.max_allowed_incoming_connections` (counted per listening port) is closed at
    accept without a log line; `grpc.server_handshake_timeout_ms` closes a plaintext
    connection that sent no HTTP/2 settings, and a TLS one that did not finish its handshake;
    an unanswered keepalive ping ends the connection after `grpc.http2.ping_timeout_ms`
    (`grpc.keepalive_timeout_ms` alone did not), so both are set.
    """
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A port another process already listens on is an error, not a shared port.
        ("grpc.so_reuseport", 0),
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        ("grpc.server_handshake_timeout_ms", grpc_ms(limits.handshake_timeout_s)),
        ("grpc.keepalive_time_ms", grpc_ms(limits.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", grpc_ms(limits.keepalive_timeout_s)),
        ("grpc.http2.ping_timeout_ms", grpc_ms(limits.keepalive_timeout_s)),
        ("grpc.http2.min_ping_interval_without_data_ms", min_ping_interval_ms),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
    ]
    if limits.max_connection_idle_s is not None:
        options.append(("grpc.max_connection_idle_ms", grpc_ms(limits.max_connection_idle_s)))
    return options


def grpc_ms(seconds: float) -> int:
    """`seconds` as the whole milliseconds gRPC takes, rounded up and never 0 (0 would mean
    "at once" or "off" to some arguments)."""
    return max(1, math.ceil(seconds * 1000))


def warn_if_descriptors_short(what: str, max_connections: int) -> bool:
    """Logs a warning when `max_connections` cannot keep the process within its descriptor
    limit (RLIMIT_NOFILE, less DESCRIPTOR_RESERVE): a flood would then exhaust descriptors
    before the bound refuses it. True when it warned."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or max_connections + DESCRIPTOR_RESERVE <= soft:
        return False
    log.warning(
        "%s: max_connections (%d) plus %d descriptors of its own exceeds the descriptor "
        "limit (%d): lower max_connections or raise the limit (ulimit -n)",
        what,
        max_connections,
        DESCRIPTOR_RESERVE,
        soft,
    )
    return True


async def open_server(
    server: grpc.aio.Server,
    *,
    service_name: str,
    listen: str,
    what: str,
    tls: ServerTls | None = None,
    also_reflected: tuple[str, ...] = (),
) -> tuple[int, HealthServicer]:
    """Adds health checking and reflection (of `service_name` and `also_reflected`), binds
    `listen` (TLS only when `tls` is given; OSError when it cannot bind), starts the server and
    reports it SERVING. Returns the bound port and the health servicer."""
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflected = [service_name, *also_reflected, _HEALTH, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(reflected, server)
    try:  # grpc raises RuntimeError or returns 0
        if tls is None:
            port = server.add_insecure_port(listen)
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.private_key, tls.certificate_chain)],
                root_certificates=tls.client_ca,
                require_client_auth=tls.client_ca is not None,
            )
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot bind {what} to {listen}{_bind_problem(listen)}")
    await server.start()
    await health.set(service_name, health_pb2.HealthCheckResponse.SERVING)
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    return port, health


def _bind_problem(listen: str) -> str:
    """Why `listen` cannot be bound, as the system says it (`: [Errno 98] Address already in
    use`), found by binding a plain socket there; grpc itself reports only that it failed."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit():
        return ""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host or "0.0.0.0", int(port)))
    except OSError as exc:
        return f": {exc.strerror or exc}"
    return ""


def warn_if_exposed(what: str, listen: str, *, authenticated: bool, tls: bool) -> bool:
    """Logs a loud warning when `listen` is reachable from other hosts and no authentication
    is configured (every caller may do everything), or bearer tokens would cross the network
    in plaintext. True when it warned. Loopback stays quiet: the embedded default is open."""
    if is_loopback(listen):
        return False
    if not authenticated:
        log.warning(
            "%s: SECURITY WARNING: listening on %s (not loopback) with NO AUTHENTICATION: any "
            "client that reaches this port may do everything. Configure tls_client_ca_file "
            "and/or auth tokens and grants (see docs/security.md).",
            what,
            listen,
        )
        return True
    if not tls:
        log.warning(
            "%s: SECURITY WARNING: listening on %s without TLS: bearer tokens cross the "
            "network in plaintext (set tls_cert_file and tls_key_file).",
            what,
            listen,
        )
        return True
    return False


class ServiceSettings(Protocol):
    @property
    def log_format(self) -> Literal["text", "json"]: ...

    def telemetry_config(self) -> TelemetryConfig: ...


class Running(Protocol):
    @property
    def port(self) -> int: ...

    async def stop(self, grace: float | None = None) -> None: ...


S = TypeVar("S", bound=ServiceSettings)
Starter = Callable[[S, TracerProvider | None, MeterProvider | None], Awaitable[Running]]


async def serve_until_signalled(what: str, settings: S, start: Starter[S]) -> bool:
    """Sets telemetry up, starts the service, prints `<what> listening on port N` (the line
    supervisors wait for), and stops it gracefully on SIGINT/SIGTERM. Returns whether it was
    SIGINT (Ctrl-C: the process then exits 130, as an interrupted command does).

    The signal handlers go in first: a supervisor may send SIGTERM the moment it reads the
    listening line (or while the service is still starting), and the default disposition
    would kill the process without draining. A signal during start-up stops the service as
    soon as it is up, without announcing it.
    """
    stop = asyncio.Event()
    received: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        telemetry = configure(settings.telemetry_config())
    except TelemetryConfigError as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    telemetry.install_global()
    logs.install(settings.log_format)
    log.info("%s traces: %s", what, telemetry.destination)
    try:
        running = await start(settings, telemetry.tracer_provider, telemetry.meter_provider)
        try:
            if not stop.is_set():
                # What start-up made (modules, settings, servicers, the catalog) lives as long
                # as the process: frozen out of the collector's generations, it is no longer
                # walked by every full collection (GC took ~6 % of a busy registry's CPU).
                gc.collect()
                gc.freeze()
                log.info("%s listening on port %d", what, running.port)
                print(f"{what} listening on port {running.port}", flush=True)
                await stop.wait()
        finally:
            await running.stop()
    finally:
        telemetry.shutdown()
    return received[:1] == [signal.SIGINT]
