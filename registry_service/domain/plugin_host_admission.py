"""Plugin hosts count in admission control: each live host holds a slot of its owner.

A plugin host is a long-lived sandbox on a runtime (a worker and a sandbox uid), so it is held
against the owner's `max_plugin_hosts` and the registry's sandboxes (`Admission.plugin_host`)
from the start of its activation until `retract` has returned, when its processes are gone.
Every activation goes through this seam (a `cordis_run`, a page's settlement, an update),
whatever `PluginHosts` runs it. Over a limit the activation fails before anything is started,
with the Cordis reason `resource-exhausted`.
"""

from __future__ import annotations

from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.admission import Admission, Slot
from registry_service.domain.plugin_hosts import (
    RESOURCE_EXHAUSTED,
    ActivationFailed,
    ActivationSpec,
    ActiveHost,
    HostEvents,
    HostRegistrations,
    PluginHosts,
    ServiceSpec,
)
from registry_service.domain.results import ToolResult
from registry_service.domain.signals import AbortSignal

__all__ = ["AdmittedPluginHosts"]


class AdmittedPluginHosts:
    """`PluginHosts` whose activations are admitted first (implements `PluginHosts`)."""

    def __init__(self, hosts: PluginHosts, admission: Admission) -> None:
        self._hosts = hosts
        self._admission = admission

    async def activate(self, spec: ActivationSpec, events: HostEvents) -> ActiveHost:
        try:
            slot = self._admission.plugin_host(spec.owner)
        except CodemodeError as exc:
            message = exc.message
            if exc.metadata.get("scope") == "agent":  # its own hosts: waiting alone may not do
                message += ", or stop one of its running plugins (cordis_stop)"
            raise ActivationFailed(
                "host-load", message, code=RESOURCE_EXHAUSTED, retry_delay_s=exc.retry_delay
            ) from None
        try:
            host = await self._hosts.activate(spec, events)
        except BaseException:
            slot.release()
            raise
        return _AdmittedHost(host, slot)


class _AdmittedHost:
    """An activation that gives its slot back once its retract has returned."""

    def __init__(self, host: ActiveHost, slot: Slot) -> None:
        self._host = host
        self._slot = slot

    @property
    def registrations(self) -> HostRegistrations:
        return self._host.registrations

    async def call_tool(
        self, name: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue | ToolResult:
        return await self._host.call_tool(name, arguments, signal)

    async def call_service(
        self, service: str, method: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue:
        return await self._host.call_service(service, method, arguments, signal)

    def update_services(self, services: tuple[ServiceSpec, ...]) -> None:
        self._host.update_services(services)

    def deliver_event(self, event: str, payload: JsonValue) -> None:
        self._host.deliver_event(event, payload)

    async def call_handler(self, method: str, args: JsonValue) -> JsonValue:
        return await self._host.call_handler(method, args)

    async def retract(self) -> None:
        try:
            await self._host.retract()
        finally:  # retract returns once the host's processes are gone (or its stream ended)
            self._slot.release()
