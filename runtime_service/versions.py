"""The versions a runtime reports per language in GetCapabilities (no grpc)."""

from __future__ import annotations

from codemode_wire import host_facade

__all__ = ["HOST_FACADE_VERSION", "PROGRAM_WIRE_VERSION"]

PROGRAM_WIRE_VERSION = 1
"""The runtime-to-worker protocol (ready, start, log, call, reply, done; host and check
frames): raised when a worker could no longer talk to an older runtime, or the reverse."""

HOST_FACADE_VERSION = str(host_facade.load().version)
"""The plugin host façade (harness, ctx, inject) every host harness implements: the version of
its one specification, codemode_wire/host_facade.json."""
