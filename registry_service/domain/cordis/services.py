"""Services between one owner's plugins: who provides what, and who is told (docs/cordis.md).

A running plugin's registrations carry the contracts of the services it provides. Every other
running plugin of the same owner may inject them: it is told the full set at its start and
whenever the set changes, and its calls of a service's methods are routed to the provider's
plugin host. A service name two plugins provide resolves to the one that started first (the
owner's plugins in define order); a plugin never injects its own services through Cordis (it
holds them itself)."""

from __future__ import annotations

from collections.abc import Iterable

from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.cordis.model import ActiveRun, Plugin
from registry_service.domain.plugin_hosts import (
    SERVICE_METHOD_MISSING,
    SERVICE_MISSING,
    ServiceSpec,
)
from registry_service.domain.signals import AbortSignal

__all__ = ["ServiceRouter"]


class ServiceRouter:
    """Resolves and routes the services of the plugins ``plugins()`` returns (one registry)."""

    def __init__(self) -> None:
        # What each run was last told is available (to tell it only of real changes).
        self._told: dict[str, tuple[ServiceSpec, ...]] = {}

    @staticmethod
    def _providers(
        plugins: Iterable[Plugin], owner: str, exclude: str
    ) -> dict[str, tuple[ServiceSpec, ActiveRun]]:
        found: dict[str, tuple[ServiceSpec, ActiveRun]] = {}
        for plugin in plugins:
            run = plugin.run
            if plugin.owner != owner or plugin.plugin_id == exclude or run is None:
                continue
            for service in run.registrations.services:
                found.setdefault(service.name, (service, run))
        return found

    def available(
        self, plugins: Iterable[Plugin], owner: str, plugin_id: str
    ) -> tuple[ServiceSpec, ...]:
        """The services ``plugin_id`` may inject now (its own excluded)."""
        providers = self._providers(plugins, owner, plugin_id)
        return tuple(spec for spec, _run in providers.values())

    def told(self, run_id: str, services: tuple[ServiceSpec, ...]) -> None:
        """``run_id`` started knowing ``services`` (its activation carried them)."""
        self._told[run_id] = services

    def forget(self, run_id: str) -> None:
        self._told.pop(run_id, None)

    def tell_all(self, plugins: list[Plugin], owner: str) -> None:
        """Tells each running plugin of ``owner`` whose set of services changed its new set."""
        for plugin in plugins:
            run = plugin.run
            if plugin.owner != owner or run is None or run.host is None:
                continue
            services = self.available(plugins, owner, plugin.plugin_id)
            if self._told.get(run.run_id) != services:
                self._told[run.run_id] = services
                run.host.update_services(services)

    async def call(
        self,
        plugins: list[Plugin],
        owner: str,
        *,
        caller: str,
        service: str,
        method: str,
        arguments: JsonValue,
    ) -> JsonValue:
        """A call by plugin ``caller`` of ``service``.``method``, run by its provider's host."""
        entry = self._providers(plugins, owner, caller).get(service)
        if entry is None or entry[1].host is None:
            raise ToolCallFailure(
                f'service "{service}" is not provided by a running plugin', SERVICE_MISSING
            )
        spec, run = entry
        if method not in spec.methods:
            raise ToolCallFailure(
                f'service "{service}" has no method "{method}"', SERVICE_METHOD_MISSING
            )
        assert run.host is not None
        return await run.host.call_service(service, method, arguments, AbortSignal())
