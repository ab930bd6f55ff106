"""Cordis composed for one registry: the runner, the inspect registry with this product's host
providers, the seven tools installed into the catalog, and `@pluginId` resolution."""

from __future__ import annotations

from registry_service.domain.catalog import Catalog
from registry_service.domain.cordis.host_providers import host_providers
from registry_service.domain.cordis.inspect import InspectRegistry
from registry_service.domain.cordis.references import (
    ReferenceContext,
    referenced_ids,
    render_reference,
    render_unavailable,
)
from registry_service.domain.cordis.runner import CordisRunner
from registry_service.domain.cordis.tools import NAMES, cordis_tools
from registry_service.domain.plugin_hosts import PluginHosts


class Cordis:
    def __init__(self, catalog: Catalog, hosts: PluginHosts | None = None) -> None:
        self.inspect = InspectRegistry()
        self.runner = CordisRunner(catalog, hosts, reserved_names=NAMES)
        for provider in host_providers(self.runner.visible_tools, self.runner.provided_services):
            self.inspect.register_host(provider)
        catalog.install_cordis_tools(cordis_tools(self.runner, self.inspect))

    @property
    def hosts(self) -> PluginHosts | None:
        return self.runner.hosts

    @hosts.setter
    def hosts(self, hosts: PluginHosts | None) -> None:
        """Where host halves run; the registry's runtime adapter is wired in here."""
        self.runner.hosts = hosts

    def references(self, agent: str, text: str) -> list[ReferenceContext]:
        """The context blocks for one user message's `@pluginId` mentions (§9.5)."""
        out: list[ReferenceContext] = []
        for plugin_id in referenced_ids(text):
            reference = self.runner.reference(agent, plugin_id)
            if reference is None:
                out.append(ReferenceContext(plugin_id, False, render_unavailable(plugin_id)))
            else:
                out.append(ReferenceContext(plugin_id, True, render_reference(reference)))
        return out

    async def close(self) -> None:
        await self.runner.close()
