"""Cordis composed for one registry: the runner, the inspect registry with this product's host
providers, the seven tools installed into the catalog, and `@pluginId` resolution."""

from __future__ import annotations

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.admission import Admission
from registry_service.domain.catalog import Catalog
from registry_service.domain.cordis.activation_records import ActivationStore
from registry_service.domain.cordis.client_queries import ClientQueries
from registry_service.domain.cordis.client_runs import ClientRuns
from registry_service.domain.cordis.events import Watch
from registry_service.domain.cordis.host_languages import HostLanguages
from registry_service.domain.cordis.host_providers import host_providers
from registry_service.domain.cordis.inspect import InspectRegistry, client_providers
from registry_service.domain.cordis.names import NAMES
from registry_service.domain.cordis.page_presence import PagePeers, PagePresence
from registry_service.domain.cordis.page_runners import Answer, Page, PageHub, refused
from registry_service.domain.cordis.placement import HostPlacement
from registry_service.domain.cordis.references import (
    ReferenceContext,
    referenced_ids,
    render_reference,
    render_unavailable,
)
from registry_service.domain.cordis.runner import CordisRunner
from registry_service.domain.cordis.source_checks import SourceChecks
from registry_service.domain.cordis.state import CordisStore
from registry_service.domain.cordis.steering import SOURCE, Steering, Submit
from registry_service.domain.cordis.tools import cordis_tools
from registry_service.domain.plugin_hosts import PluginHosts
from registry_service.domain.tool_access import ToolAuthority


class Cordis:
    def __init__(
        self,
        catalog: Catalog,
        hosts: PluginHosts | None = None,
        history_submit: Submit | None = None,
        store: CordisStore | None = None,
        history_watch: Watch | None = None,
        *,
        host_languages: HostLanguages,
        source_checks: SourceChecks | None = None,
        start_timeout_s: float = 5.0,
        compute_ms_per_call: int | None = None,
        authority: ToolAuthority | None = None,
        admission: Admission | None = None,
        placement: HostPlacement | None = None,
        activations: ActivationStore | None = None,
        activation_poll_s: float = 2.0,
        page_peers: PagePeers | None = None,
    ) -> None:
        """`history_submit` writes the steering records (the history store's `submit`);
        `store` keeps what defines the plugins (none: process memory only);
        `history_watch` (the store's `watch`) feeds the events plugins observe;
        `host_languages` describes host halves per program language; `source_checks` parses
        a define's halves (a runtime's `CheckSource`; None: recorded unchecked);
        `activations` keeps the pending run requests that registries sharing it answer (None:
        process memory), read every `activation_poll_s` besides its notifications;
        `page_peers` carries client-half calls to the pages of other registries sharing that
        store (with a `placement`: where this registry's own peer channel answers)."""
        self.inspect = InspectRegistry()
        self.steering = Steering(history_submit, lambda owner: catalog.get_agent(owner).agent_id)
        self.runner = CordisRunner(
            catalog,
            hosts,
            host_languages=host_languages,
            source_checks=source_checks,
            reserved_names=NAMES,
            steering=self.steering,
            store=store,
            history_watch=history_watch,
            start_timeout_s=start_timeout_s,
            compute_ms_per_call=compute_ms_per_call,
            authority=authority,
            admission=admission,
            placement=placement,
        )
        for provider in host_providers(
            self.runner.visible_tools,
            self.runner.provided_services,
            lambda owner: host_languages.facade(
                host_languages.host_language(catalog.language_for(owner))
            ),
        ):
            self.inspect.register_host(provider)
        # Page runners: the pages attached per agent, client-bearing activations, client queries.
        self.pages = PageHub()
        self.client_runs = ClientRuns(
            self.runner, self.pages, self.steering, activations, poll_s=activation_poll_s
        )
        self.client_queries = ClientQueries(self.pages, self.runner.ids)
        self.inspect.client_query = self.client_queries
        self.presence: PagePresence | None = None
        if activations is not None and placement is not None and page_peers is not None:
            address = placement
            presence = self.presence = PagePresence(
                activations, page_peers, lambda: address.address, poll_s=activation_poll_s
            )
            self.pages.add_presence_listener(presence.changed)
            self.client_queries.presence = presence
            self.inspect.client_elsewhere = presence.providers_elsewhere
        catalog.install_cordis_tools(cordis_tools(self.runner, self.inspect))

    def sync_manifest(self, page: Page, providers: JsonValue) -> Answer:
        """A page's client inspect manifest, replacing the agent's previous one wholesale."""
        try:
            self.inspect.sync_client_manifest(page.agent, client_providers(providers))
        except ValueError as exc:
            return refused(str(exc), "invalid-manifest")
        if self.presence is not None:  # other registries' programs may query these pages
            self.presence.changed(page.agent, True, jsonvalue.dumps(providers))
        return Answer(True)

    @property
    def hosts(self) -> PluginHosts | None:
        return self.runner.hosts

    @hosts.setter
    def hosts(self, hosts: PluginHosts | None) -> None:
        """Where host halves run; the registry's runtime adapter is wired in here."""
        self.runner.hosts = hosts

    def references(self, agent: str, text: str) -> list[ReferenceContext]:
        """The context blocks for one user message's `@pluginId` mentions."""
        out: list[ReferenceContext] = []
        for plugin_id in referenced_ids(text):
            reference = self.runner.reference(agent, plugin_id)
            if reference is None:
                out.append(ReferenceContext(plugin_id, False, render_unavailable(plugin_id)))
            else:
                out.append(ReferenceContext(plugin_id, True, render_reference(reference)))
        return out

    def inject(
        self,
        agent: str,
        text: str,
        metadata: dict[str, JsonValue] | None = None,
        source: str = SOURCE,
    ) -> None:
        """Writes an `agent/inject` record: context for the agent's next step, from a person's
        action on a plugin panel (page runners write them for a panel run's outcome, a stop or
        a remove)."""
        self.steering.inject(agent, text, metadata, source)

    async def start(self) -> None:
        """At start, once the plugins are loaded: the run requests other registries sharing
        the store keep open are read, then followed."""
        await self.client_runs.start()
        if self.presence is not None:
            await self.presence.start()

    async def close(self) -> None:
        if self.presence is not None:
            await self.presence.close()
        await self.client_runs.close()
        await self.runner.close()
