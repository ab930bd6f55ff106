"""What both services' settings share: the telemetry, logging and TLS fields, and loading a YAML
file under environment variables (`CODEMODE_<SERVICE>_*`) and explicit overrides."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings

from codemode_common.telemetry.config import TelemetryConfig, resolve_service_name
from codemode_common.tls import ServerTls, server_tls

__all__ = ["ConfigError", "ConnectionLimits", "ServiceSettings", "load_settings_file"]

# gRPC takes durations as int32 milliseconds: the longest one it can hold, in seconds.
_GRPC_MAX_S = (2**31 - 1) // 1000


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one server's listener allows its clients' connections (see ServiceSettings)."""

    max_connections: int
    handshake_timeout_s: float
    max_connection_idle_s: float | None
    keepalive_time_s: float
    keepalive_timeout_s: float


class ConfigError(ValueError):
    """Settings that cannot work; raised at start with a message naming them."""


class ServiceSettings(BaseSettings):
    """Telemetry and logging; each service declares `service_name` with its own default."""

    service_name: str
    """`service.name` of this process's spans and metrics (when not set: `OTEL_SERVICE_NAME`,
    else this default)."""
    trace_file: str = "var/traces.jsonl"
    """JSON-lines file spans are appended to when no OTLP endpoint is set (`codemode trace`
    reads it); `off` disables tracing entirely."""
    otlp_endpoint: str = ""
    """OTLP collector URL for spans and metrics; empty: `OTEL_EXPORTER_OTLP_ENDPOINT` if set."""
    otlp_protocol: Literal["", "grpc", "http/protobuf"] = ""
    """OTLP transport; empty: `OTEL_EXPORTER_OTLP_PROTOCOL`, else `http/protobuf`."""
    log_format: Literal["text", "json"] = "text"
    """Log lines as text or one JSON object each; both carry the current trace and span ids."""
    tls_cert_file: Path | None = None
    """PEM certificate chain the server presents; with `tls_key_file` the port serves TLS only
    (none: plaintext)."""
    tls_key_file: Path | None = None
    """PEM private key of `tls_cert_file`."""
    tls_client_ca_file: Path | None = None
    """PEM CA bundle: every client must present a certificate it signed (mutual TLS)."""
    max_connections: int = Field(default=1000, ge=1, lt=2**31 - 1)
    """Client connections the server holds at once, handshaking or established. One more is
    closed as soon as it is accepted, before anything is read from it (and not logged: a
    flood would log a line per attempt), so the process never runs out of file descriptors;
    connections it already holds are served on. Keep it below the process's descriptor limit
    (`ulimit -n`) with room for the service's own files (a warning at start says when it is
    not). Per-client bounds need the client's real address, which only the deployment's edge
    (its load balancer or proxy) has: set them there."""
    handshake_timeout_s: float = Field(default=10.0, gt=0, le=_GRPC_MAX_S, allow_inf_nan=False)
    """A connection that has not completed its TLS handshake and sent its HTTP/2 settings
    within this is closed: a client that connects and sends nothing holds its place no
    longer than this."""
    max_connection_idle_s: float | None = Field(
        default=300.0, gt=0, le=_GRPC_MAX_S, allow_inf_nan=False
    )
    """A connection with no call in flight for this long is closed (GOAWAY; gRPC clients
    reconnect when they next call); none: idle connections stay open."""
    keepalive_time_s: float = Field(default=60.0, gt=0, le=_GRPC_MAX_S, allow_inf_nan=False)
    """The server pings a connection from which nothing arrived for this long, and closes it
    when the ping is not answered within `keepalive_timeout_s`."""
    keepalive_timeout_s: float = Field(default=20.0, gt=0, le=_GRPC_MAX_S, allow_inf_nan=False)
    """How long a ping of `keepalive_time_s` may go unanswered: a peer that vanished (its
    host gone, a half-open TCP connection) no longer holds its streams (a provider's tools,
    a run) until TCP gives up, which takes hours."""

    def server_tls(self) -> ServerTls | None:
        """The server's TLS material, read from its files (None: plaintext)."""
        return server_tls(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            max_connections=self.max_connections,
            handshake_timeout_s=self.handshake_timeout_s,
            max_connection_idle_s=self.max_connection_idle_s,
            keepalive_time_s=self.keepalive_time_s,
            keepalive_timeout_s=self.keepalive_timeout_s,
        )

    def telemetry_config(self) -> TelemetryConfig:
        return TelemetryConfig(
            service_name=resolve_service_name(
                self.service_name, "service_name" in self.model_fields_set
            ),
            trace_file=self.trace_file,
            otlp_endpoint=self.otlp_endpoint,
            otlp_protocol=self.otlp_protocol,
        )

    @model_validator(mode="after")
    def _check_telemetry_and_tls(self) -> ServiceSettings:
        self.telemetry_config().validate()
        self.server_tls()  # files readable, combination complete: checked at start
        return self


S = TypeVar("S", bound=ServiceSettings)


def load_settings_file(
    cls: type[S], path: Path | None, *, what: str, overrides: dict[str, Any]
) -> S:
    """Reads the optional YAML file, then environment variables, then explicit overrides, each
    over the one before; `what` names the service in errors."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read {what} config {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{what} config {path}: expected a mapping")
        data.update(loaded)
    try:
        # Init values outrank environment variables in pydantic-settings, so merge explicitly.
        from_env = cls().model_dump(exclude_unset=True)
        return cls(**{**data, **from_env, **overrides})
    except ValidationError as exc:
        raise ConfigError(f"invalid {what} settings: {exc}") from exc
