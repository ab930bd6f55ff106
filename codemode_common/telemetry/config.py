"""What a process's telemetry should do (no OpenTelemetry import: settings models use it)."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["OFF", "PROTOCOLS", "TelemetryConfig", "TelemetryConfigError", "resolve_service_name"]

OFF = "off"
PROTOCOLS = ("grpc", "http/protobuf")


class TelemetryConfigError(ValueError):
    pass


def resolve_service_name(setting: str, explicit: bool) -> str:
    """The setting when set explicitly, else `OTEL_SERVICE_NAME`, else the setting's default."""
    return setting if explicit else os.environ.get("OTEL_SERVICE_NAME") or setting


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    service_name: str
    trace_file: str = "var/traces.jsonl"
    """JSON-lines span file used when no OTLP endpoint is configured; "off" disables tracing."""
    otlp_endpoint: str = ""
    """OTLP collector URL; empty: `OTEL_EXPORTER_OTLP_ENDPOINT` (or the traces variant) if set."""
    otlp_protocol: str = ""
    """`grpc` or `http/protobuf`; empty: `OTEL_EXPORTER_OTLP_PROTOCOL`, else `http/protobuf`."""

    @property
    def enabled(self) -> bool:
        return self.trace_file.strip().lower() != OFF

    def endpoint(self) -> str:
        return (
            self.otlp_endpoint
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        )

    def protocol(self) -> str:
        protocol = (
            self.otlp_protocol
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
            or "http/protobuf"
        ).strip()
        if protocol not in PROTOCOLS:
            raise TelemetryConfigError(
                f"unsupported OTLP protocol {protocol!r} (supported: {', '.join(PROTOCOLS)})"
            )
        return protocol

    def validate(self) -> None:
        """Raises `TelemetryConfigError` (a ValueError) for a setting that cannot work."""
        if self.enabled and self.endpoint():
            self.protocol()
        if self.enabled and not self.service_name:
            raise TelemetryConfigError("service_name must not be empty")
        if self.enabled and not self.endpoint() and not self.trace_file.strip():
            raise TelemetryConfigError('trace_file must be a path, or "off"')
