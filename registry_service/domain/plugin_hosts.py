"""The seam between Cordis in the registry and the plugin hosts that run host halves.

Cordis (identities, packages, pointers, the seven tools) decides *when* a package's host half
runs; a plugin host runs it: a sandboxed, long-lived worker on a runtime, reached over one
``RuntimeService`` stream per activation (``docs/cordis.md``). This module says what Cordis
may ask of a plugin host and what it gets back, and nothing about transport: the gRPC adapter
lives beside the registry's runtime client, and tests may drive Cordis through any
implementation of ``PluginHosts``.

Lifecycle of one activation (one ``run-<n>`` attempt that got as far as the host):

1. ``PluginHosts.activate(spec)`` starts a fresh plugin host, evaluates the host half and applies
   the plugin it returns. It resolves once the plugin's synchronous start is over, with the
   registrations the plugin made (tools, handlers, services it provides, services it still
   waits for), or raises ``ActivationFailed`` with the diagnostic's phase and message (the host
   is gone by then).
2. While active, Cordis calls ``ActiveHost.call_tool`` for each call of a dynamic tool that
   reached the body stage of the pipeline, and learns of later changes (a tool registered from
   an effect, a parked plugin starting) through ``on_change``, and of a crash through
   ``on_lost``.
3. Services between the owner's plugins (docs/cordis.md): a plugin *provides* a named
   service (a contract: lossless JSON data, or methods); Cordis tells every other running
   plugin of the owner what it may inject (``ActivationSpec.services``, then
   ``update_services``) and routes a consumer's method calls (``on_service_call``) to the
   provider's host (``call_service``). Events the plugin observes (``registrations.events``)
   are delivered with ``deliver_event``.
4. ``ActiveHost.retract()`` disposes the plugin (effects in reverse order), settles in-flight
   calls and returns only when the host's processes are gone (quiescence).
   It is idempotent, and safe after ``on_lost``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.results import ToolResult
from registry_service.domain.signals import AbortSignal

__all__ = [
    "HOST_GONE",
    "RESOURCE_EXHAUSTED",
    "ActivationFailed",
    "ActivationSpec",
    "ActiveHost",
    "DynamicToolSpec",
    "HandlerFailed",
    "HostEvents",
    "HostRegistrations",
    "PluginHosts",
    "ServiceSpec",
]

ActivationPhase = Literal["host-load", "host-apply"]
# The `ToolCallFailure` code of a dynamic tool call that found its plugin host gone (not the
# plugin's own failure): Cordis treats it as the host's loss.
HOST_GONE = "PLUGIN_HOST_GONE"
# A plugin's call of another plugin's service that no running plugin provides, or of a method
# the service does not have.
SERVICE_MISSING = "SERVICE_MISSING"
SERVICE_METHOD_MISSING = "SERVICE_METHOD_MISSING"
# The Cordis reason of an activation refused for want of capacity (an admission limit, or a
# runtime out of sandboxes): nothing was started, and the same activation may succeed later.
RESOURCE_EXHAUSTED = "resource-exhausted"


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A service a plugin provides to its owner's other plugins, as they see it."""

    name: str
    methods: tuple[str, ...] = ()  # callable through the registry (a service of methods)
    data_json: str = ""  # a data service's value as JSON text ("" for a service of methods)


@dataclass(frozen=True, slots=True)
class ActivationSpec:
    """Everything a plugin host needs to run one package's host half."""

    owner: str  # the agent id that owns the plugin
    plugin_id: str  # e.g. "clock-1"
    package_id: str  # e.g. "pkg-3"
    run_id: str  # e.g. "run-4"
    language: str  # the owner's program language (a language profile's name)
    source: str  # the host half: an async function body that returns the plugin
    name: str = ""  # the package's name, for logs and diagnostics
    start_timeout_s: float = 5.0  # bounds the host half's synchronous start (vmTimeoutMs)
    memory_bytes: int | None = None  # None: the runtime's default budget
    compute_ms_per_call: int | None = None  # per handler/tool invocation
    max_output_bytes: int | None = None
    # Schemas of the owner's visible tools, for ``ctx.tools.schemas()`` / ``get(name)``.
    visible_tools: tuple[tuple[str, JsonValue], ...] = ()
    # What the owner's other running plugins provide now (for `inject` and `ctx.get`).
    services: tuple[ServiceSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class DynamicToolSpec:
    """A tool a running plugin registered (``harness.define_tool`` + ``register_tool``)."""

    name: str
    description: str
    input_schema: JsonValue
    output_schema: JsonValue | None = None


@dataclass(frozen=True, slots=True)
class HostRegistrations:
    """What the plugin holds registered right now."""

    tools: tuple[DynamicToolSpec, ...] = ()
    handlers: tuple[str, ...] = ()  # harness.handle methods (client -> host calls)
    provides: tuple[str, ...] = ()  # services it provides to the owner's other plugins
    waiting_for: tuple[str, ...] = ()  # injected services that do not exist yet ("waiting")
    services: tuple[ServiceSpec, ...] = ()  # the contracts of `provides`
    events: tuple[str, ...] = ()  # events it observes (ctx.on / ctx.once)

    @property
    def waiting(self) -> bool:
        return bool(self.waiting_for)


class ActivationFailed(Exception):
    """The host half could not be loaded (syntax, wrong return) or applied (its start threw,
    timed out, or the host died while starting). ``message`` is the text the model reads.
    ``code``: the Cordis reason when it is not the host half's own failure
    (``RESOURCE_EXHAUSTED``: no capacity, nothing started; retry after ``retry_delay_s``)."""

    def __init__(
        self,
        phase: ActivationPhase,
        message: str,
        stack: str = "",
        *,
        code: str = "",
        retry_delay_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.phase: ActivationPhase = phase
        self.message = message
        self.stack = stack
        self.code = code
        self.retry_delay_s = retry_delay_s


class HandlerFailed(Exception):
    """A `harness.handle` handler threw (or the plugin handles no such method, `not_found`),
    or the host is gone (`message` says so)."""

    def __init__(self, message: str, stack: str = "", *, not_found: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.stack = stack
        self.not_found = not_found


@dataclass(slots=True)
class HostEvents:
    """Callbacks Cordis gives an activation (called on the registry's event loop)."""

    on_change: Callable[[HostRegistrations], None] = field(default=lambda _: None)
    # The host died or the runtime went away after activation: the run is over (the adapter
    # has already removed nothing; Cordis retracts its tools and steers the owner).
    on_lost: Callable[[str], None] = field(default=lambda _: None)
    # A log line the plugin wrote (console/print), for the owner's history/diagnostics.
    on_log: Callable[[str, str], None] = field(default=lambda _stream, _text: None)
    # The plugin calls `method` of an injected `service` with a JSON array of arguments; the
    # value (or a `ToolCallFailure`'s message) goes back to it.
    on_service_call: Callable[[str, str, JsonValue], Awaitable[JsonValue]] = field(
        default=lambda service, _method, _args: _no_services(service)
    )


async def _no_services(service: str) -> JsonValue:
    raise ToolCallFailure(
        f'service "{service}" is not provided by a running plugin', SERVICE_MISSING
    )


class ActiveHost(Protocol):
    """One running activation."""

    @property
    def registrations(self) -> HostRegistrations: ...

    async def call_tool(
        self, name: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue | ToolResult:
        """Run the plugin's ``execute`` for ``name``: its value (a ``ToolResult`` carrying it
        when the tool gave presentation metadata too); raises ``ToolCallFailure`` with the
        plugin's message when it throws, or with code ``HOST_GONE`` when the host is gone."""
        ...

    async def call_service(
        self, service: str, method: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue:
        """Run ``method`` of a service this plugin provides (another plugin's call)."""
        ...

    def update_services(self, services: tuple[ServiceSpec, ...]) -> None:
        """The services the owner's other plugins provide changed (the full set)."""
        ...

    def deliver_event(self, event: str, payload: JsonValue) -> None:
        """Hands an event to the plugin's listeners (in the order of the calls)."""
        ...

    async def call_handler(self, method: str, args: JsonValue) -> JsonValue:
        """Run the plugin's ``harness.handle`` handler for ``method`` (a page's ``invoke``);
        raises ``HandlerFailed``."""
        ...

    async def retract(self) -> None: ...


class PluginHosts(Protocol):
    """Where activations run (the registry's runtime client implements it)."""

    async def activate(self, spec: ActivationSpec, events: HostEvents) -> ActiveHost: ...
