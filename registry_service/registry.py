"""The registry composed: catalog, approvals, providers, executor and configured policy."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.codemode.bridge import CodeModeConfig, RunCodeTransport
from registry_service.codemode.runtime_port import RuntimePort
from registry_service.codemode.token import TokenMinter
from registry_service.config import ConfigError, RegistrySettings
from registry_service.domain.admission import Admission, Limits
from registry_service.domain.approval_records import ApprovalStore
from registry_service.domain.approvals import ApprovalBroker
from registry_service.domain.catalog import Catalog
from registry_service.domain.catalog_follow import CatalogFollower
from registry_service.domain.cordis.placement import HostPlacement
from registry_service.domain.cordis.service import Cordis
from registry_service.domain.cordis.source_checks import SourceChecks
from registry_service.domain.cordis.state import CordisStore
from registry_service.domain.execution import Emit, ExecutionInput, Executor, no_events
from registry_service.domain.mcp_attachments import McpAttachment
from registry_service.domain.mcp_servers import (
    ConnectionEvents,
    McpConnection,
    McpConnector,
    ServerSpec,
)
from registry_service.domain.mcp_supervisor import McpServers, McpTiming
from registry_service.domain.plugin_hosts import PluginHosts
from registry_service.domain.policy import RulesError, load_rules, rules_hook
from registry_service.domain.providers import ProviderHub
from registry_service.domain.receive_limits import ReceiveLimits
from registry_service.domain.results import ToolResult
from registry_service.domain.scopes import GLOBAL
from registry_service.domain.telemetry import RegistryTelemetry
from registry_service.domain.tool_access import ToolAuthority
from registry_service.domain.tools import (
    RUN_CODE,
    Classifier,
    Invocation,
    ToolDefinition,
)
from registry_service.history.catalog_store import CatalogConflict, CatalogStore
from registry_service.history.health import Report, keep_reporting
from registry_service.history.recorder import HistoryRecorder
from registry_service.history.retention import keep_pruning
from registry_service.history.store import HistoryStore, StoreOpenError
from registry_service.history.stores import StoreOptions, Stores, open_store
from registry_service.presentation.assembly import Assembler, PresentationConfig
from registry_service.presentation.language_profiles import HOST_LANGUAGES, LANGUAGES
from registry_service.presentation.languages import (
    LanguageSource,
    RuntimeLanguages,
    catalog_language,
)
from registry_service.presentation.run_code_schema import run_code_tool_schema

log = logging.getLogger(__name__)

_RESTORE_ATTEMPTS = 3  # registries sharing a store that start at once may race to store a scope

RUN_CODE_OUTPUT_SCHEMA: JsonValue = {
    "type": "object",
    "properties": {"logs": {"type": "array", "items": {"type": "string"}}, "result": {}},
    "required": ["logs"],
    "additionalProperties": False,
}


@dataclass
class Registry:
    settings: RegistrySettings
    catalog: Catalog
    approvals: ApprovalBroker
    providers: ProviderHub
    executor: Executor
    assembler: Assembler
    history: HistoryStore
    transport: RunCodeTransport
    runtime: RuntimePort | None
    cordis: Cordis
    catalog_store: CatalogStore
    # Who may call which tool, for every path a call takes (domain/tool_access.py); the RPC
    # guard and the presentation RPCs ask it too.
    authority: ToolAuthority
    # The MCP servers the scopes attach, connected and supervised (domain/mcp_supervisor.py).
    mcp: McpServers
    telemetry: RegistryTelemetry = field(default_factory=RegistryTelemetry)
    admission: Admission = field(default_factory=Admission)
    follower: CatalogFollower | None = None  # other registries' catalog changes, once restored
    # Which languages are served: the runtimes' report under `runtime_languages`.
    languages: RuntimeLanguages = field(default_factory=lambda: RuntimeLanguages(None))
    _background: list[asyncio.Task[None]] = field(default_factory=list)

    async def restore_catalog(self) -> None:
        """At start, before any call: the stored presets and agents join the settings' ones.
        A store that cannot be read leaves the settings' scopes only (logged): it reports
        itself unavailable or damaged through the health service meanwhile, and a preset or
        agent not declared in the settings is answered with the store's error, not as not
        found. From then on,
        what other registries sharing the store change is reloaded here (first everything,
        for what changed since this load, or what it could not read)."""
        for _ in range(_RESTORE_ATTEMPTS):
            try:
                snapshot = await self.catalog_store.load()
            except CodemodeError as exc:
                log.error("catalog: cannot read the stored presets and agents: %s", exc.message)
                self.catalog.unreadable(exc)
                break
            try:
                await self.catalog.restore(snapshot)
            except CatalogConflict as conflict:  # a registry starting beside this one was first
                log.info("catalog: %s; restoring again", conflict)
                continue
            except CodemodeError as exc:
                log.error("catalog: cannot restore the stored presets and agents: %s", exc.message)
            break
        self.follower = CatalogFollower(self.catalog)
        self.catalog_store.follow(self.follower.changed)
        await self.cordis.runner.load()  # after the catalog: plugins belong to its agents
        await self.cordis.start()  # then the run requests other registries keep open
        # From now on the running MCP servers follow the catalog: what a scope created here or
        # on another registry attaches starts, what a deleted one attached stops.
        self.catalog.on_change(self.mcp.sync)
        self.mcp.sync()

    async def close_interrupted(self) -> None:
        """At start, before any call: closes the calls a crash left open in the history."""
        try:
            await self.history.close_interrupted()
        except CodemodeError as exc:  # the store reports itself unavailable; calls fail
            log.error("history: cannot close the calls left open by a crash: %s", exc.message)
        # Approvals in the store: what registries that are gone (this one's earlier life
        # among them) left pending is interrupted, and other registries' are followed.
        await self.approvals.start()

    async def start_background(self, report_health: Report | None = None) -> None:
        """Starts what runs beside the RPCs: history retention (when configured: ended
        approval records too) and the store's health reports (the first one made before this
        returns)."""
        if self._background:
            return
        days = self.settings.history_retention_days
        if days is not None:
            self._background.append(
                asyncio.ensure_future(keep_pruning(self.history, days * 86_400))
            )
            if self.approvals.store is not None:  # ended approvals go with the calls' age
                pruning = keep_pruning(self.approvals.store, days * 86_400, "ended approvals")
                self._background.append(asyncio.ensure_future(pruning))
            runs = self.cordis.client_runs
            if runs.shared:  # and so do ended Cordis run requests
                pruning = keep_pruning(runs.store, days * 86_400, "ended Cordis run requests")
                self._background.append(asyncio.ensure_future(pruning))
        if report_health is not None:
            first = asyncio.Event()

            async def report(serving: bool) -> None:
                await report_health(serving)
                first.set()

            self._background.append(asyncio.ensure_future(keep_reporting(self.history, report)))
            await first.wait()

    async def execute(self, inp: ExecutionInput, emit: Emit = no_events) -> ToolResult:
        """A model-direct call: the outer `tool/call` and `tool/result` records around it.

        A result that carries an `rpc_error` (the code runtime unavailable) is recorded like
        any other, then raised: the call ends with that status instead of a result.

        Admission first: a call over a limit is refused (RESOURCE_EXHAUSTED) before its
        first record, so nothing of it exists."""
        if inp.agent and not inp.agent_id:  # a caller that did not look the agent up
            inp = dataclasses.replace(inp, agent_id=self.catalog.get_agent(inp.agent).agent_id)
        scope = inp.agent or GLOBAL
        self.admission.admit_call(scope)
        if inp.name != RUN_CODE:
            return await self._execute(inp, emit)
        with self.admission.run(scope):
            return await self._execute(inp, emit)

    async def _execute(self, inp: ExecutionInput, emit: Emit) -> ToolResult:
        result = await self.executor.execute(inp, emit)  # recorded by the history recorder
        if result.rpc_error is not None:
            raise result.rpc_error
        return result

    async def close(self) -> None:
        await self.mcp.close()  # every stdio server's process group is gone when it returns
        if self.follower is not None:
            await self.follower.close()
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.cordis.close()  # every host half unwinds before the runtime client closes
        await self.approvals.close()  # the cancellations of calls that went away are written
        close_runtime = getattr(self.runtime, "close", None)
        if close_runtime is not None:
            await close_runtime()
        await self.history.close()

    def register_tool(
        self,
        name: str,
        body: Callable[[Invocation], Awaitable[JsonValue]],
        *,
        description: str = "",
        input_schema: JsonValue = None,
        output_schema: JsonValue = None,
        concurrency_safe: bool | Classifier = False,
        guidance: str = "",
        scope: str = GLOBAL,
    ) -> ToolDefinition:
        """Registers an in-process tool; it runs through the same pipeline as remote ones."""
        classifier: Classifier | None
        if callable(concurrency_safe):
            classifier = concurrency_safe
        else:
            classifier = (lambda _a: True) if concurrency_safe else None
        defn = ToolDefinition(
            name=name,
            description=description,
            input_schema=input_schema if input_schema is not None else {"type": "object"},
            output_schema=output_schema if output_schema is not None else {},
            body=body,
            is_concurrency_safe=classifier,
            guidance=guidance,
        )
        self.catalog.register(scope, [defn])
        return defn


def _open_stores(settings: RegistrySettings) -> Stores:
    try:
        return open_store(settings.history_store, _store_options(settings))
    except StoreOpenError as exc:
        raise ConfigError(str(exc)) from exc


def _store_options(settings: RegistrySettings) -> StoreOptions:
    return StoreOptions(
        path=settings.history_path,
        dsn=settings.history_dsn.get_secret_value(),
        max_inline_bytes=settings.history_max_inline_bytes,
        lease_s=settings.history_writer_lease_s,
        statement_timeout_s=settings.history_statement_timeout_s,
    )


def _connect_runtime(
    settings: RegistrySettings, tracer_provider: TracerProvider | None
) -> RuntimePort | None:
    if not settings.runtime_targets:
        return None
    from registry_service.runtime_client import GrpcRuntime  # the transport adapter (grpc)

    return GrpcRuntime(
        settings.runtime_targets,
        settings.max_message_bytes,
        tracer_provider=tracer_provider,
        keepalive_s=settings.runtime_keepalive_s,
        tls=settings.runtime_tls(),
        start_timeout_s=settings.runtime_start_timeout_s,
        reconnect_backoff_max_s=settings.runtime_reconnect_backoff_max_s,
        channel=settings.runtime_channel,
    )


def _cordis(
    catalog: Catalog,
    hosts: PluginHosts | None,
    stores: Stores,
    settings: RegistrySettings,
    *,
    source_checks: SourceChecks | None,
    authority: ToolAuthority,
    admission: Admission,
) -> Cordis:
    placement = _placement(stores, settings, _cordis_store(stores, settings))
    page_peers = None
    if placement is not None:  # client-half calls ride the same peer channel
        from registry_service.cordis_page_peers import GrpcPagePeers  # the transport (grpc)
        from registry_service.cordis_peers import GrpcPeers

        assert isinstance(placement.peers, GrpcPeers)
        page_peers = GrpcPagePeers(placement.peers)
    cordis = Cordis(
        catalog,
        hosts,
        stores.history.submit,
        _cordis_store(stores, settings),
        stores.history.watch,
        host_languages=HOST_LANGUAGES,
        source_checks=source_checks,
        start_timeout_s=settings.cordis_start_timeout_s,
        compute_ms_per_call=settings.cordis_compute_ms_per_call,
        authority=authority,
        admission=admission,
        placement=placement,
        page_peers=page_peers,
        # Pending run requests live where the plugins do: with their records in the store,
        # every registry sharing it shows them to its pages and takes their answers.
        activations=stores.activations if _cordis_store(stores, settings) is not None else None,
        activation_poll_s=settings.cordis_activation_poll_s,
    )
    # A page's render failure of a run another registry holds is carried to it the same way.
    cordis.client_runs.owners = page_peers
    return cordis


def _placement(
    stores: Stores, settings: RegistrySettings, store: CordisStore | None
) -> HostPlacement | None:
    """Registries sharing a PostgreSQL store (and the Cordis records on it) run each running
    plugin's host in one of them, reached over the authenticated peer channel; without a
    shared secret (`cordis_peer_secret`, else `token_key`) each runs the hosts it activates."""
    token = settings.cordis_peer_token()
    if settings.history_store != "postgres" or store is None or token is None:
        return None
    tls = settings.cordis_peer_tls()
    if settings.tls_cert_file is not None and tls is None:
        # Never plaintext to a TLS registry (the peer token would travel in clear).
        log.warning(
            "cordis: the registry serves TLS and cordis_peer_tls_ca_file is unset, so the "
            "Cordis peer channel is off: each registry runs the plugin hosts it activates"
        )
        return None
    from registry_service.cordis_peers import GrpcPeers

    return HostPlacement(
        stores.host_leases,
        GrpcPeers(token, settings.max_message_bytes, tls=tls),
        uuid.uuid4().hex,
        settings.cordis_host_lease_s,
    )


def _in_store(settings: RegistrySettings, setting: str, wanted: bool | None) -> bool:
    """Whether what `setting` names is kept in the history database: when it outlives the
    process (unset), always (true: refused when it does not), or never (false: memory)."""
    in_memory = settings.history_store == "sqlite" and settings.history_path == ":memory:"
    if wanted is False:
        return False
    if in_memory:
        if wanted:
            raise ConfigError(
                f"{setting} keeps its records in the history database: set history_path "
                "to a file (it is :memory:)"
            )
        return False
    return True


def _cordis_store(stores: Stores, settings: RegistrySettings) -> CordisStore | None:
    """Where Cordis keeps its records (`cordis_durable`): the history's database, or memory."""
    in_store = _in_store(settings, "cordis_durable", settings.cordis_durable)
    return stores.cordis if in_store else None


def _approval_store(stores: Stores, settings: RegistrySettings) -> ApprovalStore | None:
    """Where approvals wait (`approvals_in_store`): the history's database, or memory."""
    in_store = _in_store(settings, "approvals_in_store", settings.approvals_in_store)
    return stores.approvals if in_store else None


def _plugin_hosts(runtime: RuntimePort | None) -> PluginHosts | None:
    """Host halves run on the runtimes `run_code` uses (one `Host` stream per activation)."""
    from registry_service.runtime_client import GrpcRuntime

    if not isinstance(runtime, GrpcRuntime):
        return None  # no runtime, or one injected by a test: `cordis_run` says hosts are absent
    from registry_service.plugin_host_client import GrpcPluginHosts

    return GrpcPluginHosts(runtime)


class _LazyMcpConnector:
    """`McpConnector` over the MCP SDK (`registry_service/mcp/`), imported at the first
    connection: the SDK and what it brings (cryptography among them) cost a registry that
    attaches no MCP server nothing."""

    def __init__(self, settings: RegistrySettings) -> None:
        self._settings = settings
        self._connector: McpConnector | None = None

    async def connect(
        self, spec: ServerSpec, label: str, events: ConnectionEvents
    ) -> McpConnection:
        if self._connector is None:
            from registry_service.mcp.connector import SdkConnector  # the SDK adapter

            settings = self._settings
            self._connector = SdkConnector(
                settings.max_message_bytes,
                settings.max_json_depth,
                user=settings.mcp_user,
                messages_per_second=settings.mcp_messages_per_second,
                json_limits=settings.json_limits(),
            )
        return await self._connector.connect(spec, label, events)


def build_registry(
    settings: RegistrySettings,
    runtime: RuntimePort | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    plugin_hosts: PluginHosts | None = None,
) -> Registry:
    """Composes the registry. Telemetry uses the given providers, else the global ones (a
    no-op unless the process installed an SDK: see `codemode_common.telemetry.setup`).
    `plugin_hosts` runs dynamic Cordis host halves (default: the plugin hosts of the runtimes
    `run_code` uses; none without a runtime: a `cordis_run` of a host half fails
    with a tool error saying so)."""
    # The catalog's run_code (listing, argument validation) speaks the default language; the
    # wire schema is rendered per requested language by the assembler.
    flavour = run_code_tool_schema(
        catalog_language(
            settings.runtime_languages
            if settings.runtime_languages is not None
            else [settings.default_code_language()]
        )
    )
    holder: list[RunCodeTransport] = []

    async def run_code_body(invocation: Invocation) -> ToolResult:
        return await holder[0](invocation)

    run_code = ToolDefinition(
        name=RUN_CODE,
        description=flavour["description"],
        input_schema=flavour["parameters"],
        output_schema=RUN_CODE_OUTPUT_SCHEMA,
        body=run_code_body,
    )
    stores = _open_stores(settings)
    history = stores.history
    authority = ToolAuthority(settings.access_policy(), history.append)
    catalog = Catalog(
        settings.default_mode,
        run_code,
        settings.default_code_language(),
        languages=LANGUAGES,
        default_self_modification=settings.self_modification,
        store=stores.catalog,
        delete_history_with_agent=settings.delete_history_with_agent,
    )
    presentation = PresentationConfig(
        runtime_languages=tuple(settings.runtime_languages or ()),
        prompt_sections=tuple(s.to_section() for s in settings.prompt_sections),
        tool_order=tuple(settings.tool_order),
    )
    from registry_service.convert import approval_request_bytes  # the wire encoding (protobuf)

    # Nothing sent to a provider or an approver exceeds what it declared it receives.
    receive_limits = ReceiveLimits(settings.max_message_bytes)
    approvals = ApprovalBroker(
        receive_limits,
        approval_request_bytes,
        _approval_store(stores, settings),
        poll_s=settings.approval_poll_s,
        expiry_s=settings.approval_expiry_s,
    )
    telemetry = RegistryTelemetry(tracer_provider, meter_provider)
    # The history recorder is the outermost observer: a call's `tool/call` is durable before
    # its span opens, and its span ends before its `tool/result` is written.
    executor = Executor(
        catalog,
        approvals,
        telemetry,
        settings.json_limits(),
        observers=(HistoryRecorder(history),),
    )
    admission = _admission(settings, catalog)
    runtime = runtime or _connect_runtime(settings, telemetry.tracer_provider)
    languages = RuntimeLanguages(
        settings.runtime_languages, runtime if isinstance(runtime, LanguageSource) else None
    )
    transport = RunCodeTransport(
        executor,
        runtime,
        CodeModeConfig(
            max_parallel_sub_calls=settings.max_parallel_sub_calls,
            retry_delay_s=settings.runtime_retry_delay_s,
        ),
        TokenMinter(bytes.fromhex(settings.token_key) if settings.token_key else None),
        admission=admission,
        authority=authority,
    )
    holder.append(transport)
    providers = ProviderHub(catalog, receive_limits)
    mcp = McpServers(
        catalog.mcp_attachments,
        policy=settings.mcp_policy(),
        connector=_LazyMcpConnector(settings),
        providers=providers,
        admission=admission,
        timing=McpTiming(
            initialize_timeout_s=settings.mcp_initialize_timeout_s,
            backoff_max_s=settings.mcp_restart_backoff_max_s,
        ),
    )
    registry = Registry(
        settings=settings,
        catalog=catalog,
        approvals=approvals,
        providers=providers,
        executor=executor,
        assembler=Assembler(catalog, presentation, served=languages.snapshot),
        languages=languages,
        history=history,
        transport=transport,
        runtime=runtime,
        cordis=_cordis(
            catalog,
            plugin_hosts or _plugin_hosts(runtime),
            stores,
            settings,
            # A define's halves are parsed by the runtimes that would run them.
            source_checks=runtime if isinstance(runtime, SourceChecks) else None,
            authority=authority,
            admission=admission,
        ),
        catalog_store=stores.catalog,
        authority=authority,
        mcp=mcp,
        telemetry=telemetry,
        admission=admission,
    )
    _declare_scopes(catalog, settings)
    if settings.policy_rules is not None:
        try:
            rules = load_rules(settings.policy_rules)
        except RulesError as exc:
            raise ConfigError(str(exc)) from exc
        catalog.hooks(GLOBAL).pre_execute.append(rules_hook(rules))
    for entry in settings.plugins:
        _load_plugin(entry)(registry)
    return registry


def _admission(settings: RegistrySettings, catalog: Catalog) -> Admission:
    """Limits: the agent's own declaration, over its preset's, over `agent_limits`."""
    default = settings.default_agent_limits()
    declared = {
        **{f"presets/{p.id}": p.limits.to_limits() for p in settings.presets if p.limits},
        **{f"agents/{a.id}": a.limits.to_limits() for a in settings.agents if a.limits},
    }

    def limits_for(scope: str) -> Limits:
        limits = default
        chain: list[str] = []
        if declared:
            with contextlib.suppress(KeyError):  # an agent deleted meanwhile: the default
                chain = catalog.chain(scope)
        for key in reversed(chain):  # the preset first, then the agent over it
            if key in declared:
                limits = declared[key].over(limits)
        return limits

    return Admission(
        settings.global_limits(), limits_for, retry_delay_s=settings.admission_retry_delay_s
    )


def _declare_scopes(catalog: Catalog, settings: RegistrySettings) -> None:
    """Declares the configured presets, then agents (a bad entry stops the start); the stored
    ones join them at start (`Registry.restore_catalog`)."""
    try:
        for preset in settings.presets:
            catalog.declare_preset(
                preset.id,
                preset.mode,
                preset.code_language,
                preset.self_modification,
                mcp_servers=tuple(McpAttachment(server=name) for name in preset.mcp_servers),
            )
        for agent in settings.agents:
            parent = agent.preset
            if parent and not parent.startswith("presets/"):
                parent = f"presets/{parent}"
            catalog.declare_agent(
                agent.id,
                parent,
                agent.mode,
                agent.code_language,
                agent.self_modification,
                mcp_servers=tuple(McpAttachment(server=name) for name in agent.mcp_servers),
            )
    except CodemodeError as exc:
        raise ConfigError(f"invalid presets/agents settings: {exc.message}") from exc


def _load_plugin(entry: str) -> Callable[[Registry], None]:
    module_name, sep, attr = entry.partition(":")
    if not sep:
        raise ConfigError(f"plugin {entry!r} must be written `module:function`")
    try:
        plugin = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load plugin {entry!r}: {exc}") from exc
    if not callable(plugin):
        raise ConfigError(f"plugin {entry!r} is not callable")
    return plugin  # type: ignore[no-any-return]
