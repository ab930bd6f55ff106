"""The Cordis runner: define, run/update/rollback, stop, undefine and the read-only views, per
owning agent (docs/cordis.md).

Invariants kept here (and tested through the API):
- define never runs code, never asks approval and never moves a pointer; packages are immutable
  and ids are never reused;
- `current` moves only on a fully successful activation; a failed update keeps `current` and
  sets `next`; a rollback with `run` clears `next`;
- one physical run per plugin: an update retracts the old run first and awaits its quiescence
  (its tools are gone from the catalog, the plugin host has settled its calls, disposed its
  effects and its processes are gone) before the new host half starts;
- a dynamic tool is an ordinary catalog entry in the owner's scope: every call goes through the
  pipeline, and its body is an invocation on the plugin host;
- the owner's running plugins learn of each other's services whenever the set changes
  (`services.ServiceRouter`): a consumer parks `waiting` while one is missing and starts when
  it appears, in its own plugin host.

What defines a plugin (packages, pointers, grants, ids) is written through to the Cordis store
(`state.CordisStore`) record by record, under one lock with the reloads of what other
registries sharing the store change, so a reload never interleaves with a write of this
registry. Runs and attempts live here only. Without a `placement` a plugin's host lives in the
registry that activated it. With one (registries sharing a store, each reachable by the others'
peer channel), a running plugin's host lives in exactly one registry, the holder of its host
lease (`host_leases`): `_activate` takes the lease before it starts a host; the others follow
the owner's run as a `placement.RemoteHost` (its tools are in their catalogs too, and their
calls, after their own pipeline, run in the owner); a stop or an update anywhere retracts the
run in its owner first; and when an owner stops renewing, a survivor takes the expired lease
and reactivates the current package (`_take_over`), steering the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from typing import Protocol, cast

from codemode_common.principals import ANONYMOUS, Principal
from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.access import AccessPolicy
from registry_service.domain.admission import Admission
from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.catalog import Catalog
from registry_service.domain.change_follow import ChangeFollower
from registry_service.domain.cordis import legacy
from registry_service.domain.cordis.events import OwnerEvents, Watch, payload
from registry_service.domain.cordis.host_languages import HostLanguages
from registry_service.domain.cordis.host_leases import HostLease
from registry_service.domain.cordis.ids import Ids, check_prefix
from registry_service.domain.cordis.model import (
    ActiveRun,
    Attempt,
    AttemptStatus,
    Diagnostic,
    HalfState,
    Mode,
    Package,
    Phase,
    Plugin,
)
from registry_service.domain.cordis.placement import (
    HostPlacement,
    OwnerLost,
    RemoteHost,
    RemoteRun,
    RunAt,
)
from registry_service.domain.cordis.refusals import CordisError, plugin_missing, stale_state
from registry_service.domain.cordis.services import ServiceRouter
from registry_service.domain.cordis.source_checks import SourceChecks, check_half
from registry_service.domain.cordis.state import (
    CordisSnapshot,
    CordisStore,
    MemoryCordisStore,
    PackageImmutable,
    PluginRow,
    StaleWrite,
)
from registry_service.domain.cordis.steering import (
    HOST_LOST,
    Steering,
    completed_text,
    failed_text,
    take_over_failed_text,
    taken_over_text,
)
from registry_service.domain.plugin_host_admission import AdmittedPluginHosts
from registry_service.domain.plugin_hosts import (
    HOST_GONE,
    ActivationFailed,
    ActivationSpec,
    ActiveHost,
    DynamicToolSpec,
    HandlerFailed,
    HostEvents,
    HostRegistrations,
    PluginHosts,
    ServiceSpec,
)
from registry_service.domain.records import Record
from registry_service.domain.results import ToolResult, aborted
from registry_service.domain.signals import AbortSignal
from registry_service.domain.tool_access import CallKind, ToolAccess, ToolAuthority
from registry_service.domain.tools import RUN_CODE, Invocation, ToolDefinition

log = logging.getLogger(__name__)

PLUGIN_NOT_RUNNING = "PLUGIN_NOT_RUNNING"
NO_PLUGIN_HOSTS = (
    "cordis_run cannot start a Host half: this registry has no plugin hosts configured "
    "(host halves run on a runtime; configure `runtime_targets`)"
)


class ClientActivation(Protocol):
    """The page-runner half of activation (`page_runners.ClientRuns`): client-bearing packages
    become requests that a page settles."""

    def has_pending(self, plugin_id: str) -> bool: ...

    async def request(
        self,
        plugin: Plugin,
        package: Package,
        mode: Mode,
        principal: Principal,
        recheck: Callable[[], object],
    ) -> dict[str, JsonValue]:
        """`recheck` plans the run again once the attempt is about to be recorded."""
        ...

    def cancel_pending(self, plugin: Plugin) -> bool:
        """Cancels the plugin's pending request (stop, undefine); True when there was one."""
        ...


class CordisRunner:
    def __init__(
        self,
        catalog: Catalog,
        hosts: PluginHosts | None = None,
        *,
        host_languages: HostLanguages,
        source_checks: SourceChecks | None = None,
        reserved_names: Iterable[str] = (),
        start_timeout_s: float = 5.0,
        steering: Steering | None = None,
        store: CordisStore | None = None,
        history_watch: Watch | None = None,
        compute_ms_per_call: int | None = None,
        authority: ToolAuthority | None = None,
        admission: Admission | None = None,
        placement: HostPlacement | None = None,
    ) -> None:
        """`host_languages` names a host half's language (its owner's program language) and
        `source_checks` parses a define's halves before anything is stored (a runtime's
        `CheckSource`; None: a registry without runtimes, where halves are recorded unchecked).
        `store`: where plugins, packages, grants, pointers and id counters are kept (read by
        `load`; runs are not restarted). None: process memory only.
        `history_watch` (the history store's `watch`) is where plugins' events come from.
        `authority`: what a plugin host may do and see, as the principal that started it
        (None: everything, the open default).
        `admission`: each live plugin host holds a slot of its owner there (None: no limits).
        `placement`: registries sharing the store run each plugin's host in one of them (see
        the module's docstring); None: every registry runs the hosts it activates."""
        self._catalog = catalog
        self._host_languages = host_languages
        self._source_checks = source_checks
        self._authority = authority or ToolAuthority(AccessPolicy((), enforced=False))
        self.hosts = hosts
        self.steering = steering or Steering()
        self._reserved = frozenset(reserved_names)
        self._start_timeout_s = start_timeout_s
        self._compute_ms_per_call = compute_ms_per_call
        self._admission = admission
        self._store: CordisStore = store if store is not None else MemoryCordisStore()
        self._ids = Ids(self._store)
        # Store writes and reloads, one at a time (see the module's docstring).
        self._lock = asyncio.Lock()
        self._dirty: set[str] = set()  # plugins whose pointers wait to be written
        self._writes: set[asyncio.Task[None]] = set()
        self._follower: ChangeFollower | None = None
        self._plugins: dict[str, Plugin] = {}
        self._starts: dict[str, asyncio.Task[dict[str, JsonValue]]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._services = ServiceRouter()
        self._events = OwnerEvents(history_watch, self._deliver_event)
        # Set when page runners exist (the Cordis service wires them in).
        self.client_activation: ClientActivation | None = None
        self._placement = placement
        self._held: dict[str, HostLease] = {}  # the host leases this registry holds
        self._following: dict[str, tuple[str, asyncio.Task[None]]] = {}  # id -> (address, task)
        self._keeper: asyncio.Task[None] | None = None
        self._taking: set[str] = set()  # plugins this registry is taking over now
        # The run each lost owner was running when it was lost: (its address, run id), named
        # in the steering record of the takeover (the mirrored run is retracted before it).
        self._lost_runs: dict[str, tuple[str, str]] = {}
        self._run_changed = asyncio.Event()  # set (and replaced) whenever a run changes here
        catalog.on_delete(self._scope_deleted)

    # -- the store ----------------------------------------------------------------------------

    async def load(self) -> None:
        """At start, once the stored catalog is restored: imports a whole-state snapshot an
        older registry left, reads every stored plugin, and from then on follows what other
        registries sharing the store change (first everything, for what changed meanwhile).
        A store that cannot be read now is read again until it can."""
        self._follower = ChangeFollower(self.refresh, "cordis")
        try:
            async with self._lock:
                body = await self._store.take_legacy()
                if body is not None:
                    await self._import_legacy(body)
                await self._reload(None)
        except CodemodeError as exc:
            log.error("cordis: cannot read the stored plugins: %s", exc.message)
            self._follower.changed(None)
        self._store.follow(self._follower.changed)
        if self._placement is not None:
            self._keeper = asyncio.ensure_future(self._keep_leases(self._placement))

    @property
    def placement(self) -> HostPlacement | None:
        """This registry among those sharing the store (None: it runs what it activates)."""
        return self._placement

    @property
    def follower(self) -> ChangeFollower | None:
        """What follows other registries' changes (once `load` ran)."""
        return self._follower

    async def _import_legacy(self, body: str) -> None:
        try:
            counters, plugins = legacy.read(body, self._owner_id_of)
        except (ValueError, KeyError, TypeError) as exc:
            # Already taken from the store: kept in the log rather than lost.
            log.error("cordis: an unreadable stored snapshot was dropped (%s): %s", exc, body)
            return
        await self._store.raise_ids(counters)
        for old in plugins:
            first, *rest = old.packages
            try:
                await self._store.create_plugin(old.row, first)
                for package in rest:
                    await self._store.add_package(old.row.plugin_id, package)
                for package_id in old.grants:
                    await self._store.grant(old.row.plugin_id, package_id, any_version=False)
            except (StaleWrite, PackageImmutable) as exc:
                log.warning("cordis: a stored snapshot's plugin was not imported: %s", exc)
        log.info("cordis: imported %d plugins from a stored snapshot", len(plugins))

    def _owner_id_of(self, owner: str) -> str:
        try:
            return self._catalog.get_agent(owner).agent_id
        except CodemodeError:
            return ""

    async def refresh(self, plugin_ids: Collection[str] | None) -> None:
        """Makes the plugins named (None: all) what the store holds now: what another registry
        sharing the store changed."""
        async with self._lock:
            await self._reload(plugin_ids)
        if self._placement is not None:  # a lease may have changed hands (acquire notifies)
            await self._look_at_leases(self._placement, plugin_ids)

    async def _reload(self, plugin_ids: Collection[str] | None) -> None:
        """Under the lock."""
        self._reconcile(await self._store.load(plugin_ids), plugin_ids)

    def _reconcile(self, snapshot: CordisSnapshot, plugin_ids: Collection[str] | None) -> None:
        packages: dict[str, list[Package]] = {}
        for stored_package in snapshot.packages:
            packages.setdefault(stored_package.plugin_id, []).append(stored_package.package)
        grants: dict[str, set[str]] = {}
        for plugin_id, package_id in snapshot.grants:
            grants.setdefault(plugin_id, set()).add(package_id)
        stored: set[str] = set()
        for row in snapshot.plugins:
            if not packages.get(row.plugin_id):
                continue  # a plugin has a package from its first write on
            stored.add(row.plugin_id)
            plugin = self._plugins.get(row.plugin_id)
            if plugin is None:
                plugin = Plugin(row.plugin_id, row.owner, owner_id=row.owner_id)
                self._plugins[row.plugin_id] = plugin
            for package in packages[row.plugin_id]:  # immutable: only ever added
                plugin.packages.setdefault(package.package_id, package)
            plugin.approved_client_packages |= grants.get(row.plugin_id, set())
            plugin.client_version_updates_approved |= row.any_version_approved
            if row.plugin_id not in self._dirty:  # else this registry's newer change is owed
                plugin.current, plugin.next, plugin.revision = row.current, row.next, row.revision
        names = list(self._plugins) if plugin_ids is None else list(plugin_ids)
        for plugin_id in names:
            gone = self._plugins.get(plugin_id)
            if gone is not None and plugin_id not in stored:
                self._forget(gone)  # undefined (or its agent deleted) by another registry

    def _forget(self, plugin: Plugin) -> None:
        """Drops a plugin from this registry: its pending request is cancelled and its host
        retracted (its tools go at once)."""
        if self.client_activation is not None:
            self.client_activation.cancel_pending(plugin)
        if self._plugins.get(plugin.plugin_id) is plugin:
            del self._plugins[plugin.plugin_id]
        self.in_background(self._retract(plugin))

    def changed(self, plugin: Plugin) -> None:
        """The plugin's pointers changed here: written in the background, the newest wins;
        a write another registry's change made stale reloads the plugin instead."""
        if plugin.plugin_id in self._dirty:
            return
        self._dirty.add(plugin.plugin_id)
        self._write_in_background(self._save_pointers(plugin))

    async def _save_pointers(self, plugin: Plugin) -> None:
        async with self._lock:
            self._dirty.discard(plugin.plugin_id)
            if self._plugins.get(plugin.plugin_id) is not plugin:
                return
            try:
                plugin.revision = await self._store.set_pointers(
                    plugin.plugin_id, plugin.current, plugin.next, revision=plugin.revision
                )
            except StaleWrite:
                log.warning("cordis: %s was changed by another registry", plugin.plugin_id)
                await self._reload({plugin.plugin_id})

    def grant(self, plugin: Plugin, package_id: str, any_version: bool) -> None:
        """A page granted the package (and later versions, with `any_version`)."""
        plugin.approved_client_packages.add(package_id)
        plugin.client_version_updates_approved |= any_version
        self._write_in_background(self._save_grant(plugin.plugin_id, package_id, any_version))

    async def _save_grant(self, plugin_id: str, package_id: str, any_version: bool) -> None:
        async with self._lock:
            try:
                await self._store.grant(plugin_id, package_id, any_version=any_version)
            except StaleWrite:
                await self._reload({plugin_id})

    def _write_in_background(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except CodemodeError as exc:  # kept here; the plugin's next change writes it
                log.error("cordis: a change was not stored: %s", exc.message)
            except Exception:
                log.exception("cordis: a change was not stored")

        task = asyncio.ensure_future(run())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    # -- lookups ------------------------------------------------------------------------------

    def _belongs(self, plugin: Plugin | None, owner: str) -> bool:
        """Whether `owner` owns the plugin: the agent of that name, with the stable id the
        plugin was defined by (a later agent of the same name does not inherit it)."""
        if plugin is None or plugin.owner != owner:
            return False
        return not plugin.owner_id or self._owner_id_of(owner) == plugin.owner_id

    def _owned(self, owner: str, plugin_id: str) -> Plugin:
        plugin = self._plugins.get(plugin_id)
        if plugin is None or not self._belongs(plugin, owner):
            raise plugin_missing(plugin_id)
        return plugin

    def find(self, owner: str, plugin_id: str) -> Plugin | None:
        """The plugin when `owner` owns it (another agent's plugin reads as absent)."""
        plugin = self._plugins.get(plugin_id)
        return plugin if self._belongs(plugin, owner) else None

    def plan(self, plugin: Plugin, package_id: str, mode: str) -> Package:
        return self._plan(plugin, package_id, mode)

    @property
    def ids(self) -> Ids:
        return self._ids

    async def retract(self, plugin: Plugin) -> None:
        await self._retract(plugin)

    def owned(self, owner: str) -> list[Plugin]:
        return [p for p in self._plugins.values() if self._belongs(p, owner)]

    def visible_tools(self, owner: str, access: ToolAccess | None = None) -> list[ToolDefinition]:
        """What the owner sees (run_code excluded); with `access`, only what it may call."""
        view = self._catalog.view(owner)
        if access is not None:
            view = access.restrict(view)
        return [defn for name, defn in view.visible.items() if name != RUN_CODE]

    def provided_services(self, owner: str) -> list[tuple[str, str, ServiceSpec | None]]:
        """(service, providing plugin, its contract when the host reported one)."""
        out: list[tuple[str, str, ServiceSpec | None]] = []
        for plugin in self.owned(owner):
            if plugin.run is None:
                continue
            contracts = {spec.name: spec for spec in plugin.run.registrations.services}
            for service in plugin.run.registrations.provides:
                out.append((service, plugin.plugin_id, contracts.get(service)))
        return out

    def _host_language(self, owner: str) -> str:
        """What `owner`'s host halves are written in: its program language's host language."""
        return self._host_languages.host_language(self._catalog.language_for(owner))

    # -- define -------------------------------------------------------------------------------

    async def define(
        self,
        owner: str,
        plugin: dict[str, JsonValue],
        name: str,
        purpose: str,
        code: dict[str, JsonValue],
    ) -> dict[str, JsonValue]:
        name, purpose = name.strip(), purpose.strip()
        if not name:
            raise CordisError("cordis_define needs a non-empty `name`", "invalid-define")
        if not purpose:
            raise CordisError("cordis_define needs a non-empty `purpose`", "invalid-define")
        host = cast("str | None", code.get("host"))
        client = cast("str | None", code.get("client"))
        if host is None and client is None:
            raise CordisError(
                "cordis_define needs `code.host`, `code.client`, or both", "invalid-define"
            )
        prefix = ""
        if plugin.get("kind") == "new":
            prefix = check_prefix(cast(str, plugin.get("idPrefix", "")))
        else:
            self._owned(owner, cast(str, plugin.get("pluginId", "")))
        language = self._host_language(owner)
        checks = self._source_checks
        title = self._host_languages.title(language)
        if checks is not None and host is not None:
            await check_half(checks, "host", language, title, host)
        if checks is not None and client is not None:
            await check_half(checks, "client", language, title, client)
        async with self._lock:
            # Looked up again: the plugin may have been undefined while a runtime parsed the
            # halves.
            target = None if prefix else self._owned(owner, cast(str, plugin.get("pluginId", "")))
            package = Package(await self._ids.package(), name, purpose, host, client)
            try:
                if target is None:
                    owner_id = self._catalog.get_agent(owner).agent_id
                    row = PluginRow(await self._ids.plugin(prefix, self._plugins), owner, owner_id)
                    await self._store.create_plugin(row, package)
                    target = Plugin(row.plugin_id, owner, owner_id=owner_id, revision=row.revision)
                    self._plugins[target.plugin_id] = target
                else:
                    await self._store.add_package(target.plugin_id, package)
            except StaleWrite as exc:  # undefined by another registry this one had not heard of
                await self._reload({exc.plugin_id})
                raise plugin_missing(exc.plugin_id) from None
            except PackageImmutable as exc:
                raise CordisError(str(exc), "package-immutable") from None
            target.packages[package.package_id] = package
        return {
            "pluginId": target.plugin_id,
            "packageId": package.package_id,
            "name": name,
            "purpose": purpose,
            "hasHostHalf": package.has_host,
            "hasClientHalf": package.has_client,
        }

    # -- run / update / rollback --------------------------------------------------------------

    def _plan(self, plugin: Plugin, package_id: str, mode: str) -> Package:
        """Plan validation shared by every entry point."""
        p = plugin.plugin_id
        package = plugin.packages.get(package_id)
        if package is None:
            raise CordisError(f'plugin "{p}" has no package "{package_id}"', "package-missing")
        if mode == "update":
            if plugin.current is None:
                raise CordisError(
                    f'plugin "{p}" has no successful version yet; start "{package_id}" with '
                    'mode "run"',
                    "invalid-mode",
                )
            if plugin.current == package_id:
                raise CordisError(
                    f'package "{package_id}" is already current; use mode "run"', "invalid-mode"
                )
        elif mode == "run":
            if plugin.current is not None and plugin.current != package_id:
                raise CordisError(
                    f'package "{package_id}" differs from current "{plugin.current}"; use mode '
                    '"update"',
                    "invalid-mode",
                )
        else:
            raise CordisError(f'mode must be "run" or "update", not "{mode}"', "invalid-mode")
        if plugin.starting:
            raise CordisError(f'plugin "{p}" is already starting', "transition-in-flight")
        return package

    async def run(
        self,
        owner: str,
        plugin_id: str,
        package_id: str,
        mode: str,
        signal: AbortSignal,
        *,
        principal: Principal = ANONYMOUS,
    ) -> dict[str, JsonValue]:
        """`principal`: the caller of `cordis_run`; the plugin host acts as it."""
        plugin = self._owned(owner, plugin_id)
        client = self.client_activation

        def planned() -> Package:
            """Checked now, and again once the attempt is recorded (the plugin may have moved
            while this waited for the store)."""
            package = self._plan(plugin, package_id, mode)
            if client is not None and client.has_pending(plugin_id):
                raise CordisError(
                    f'dynamic plugin "{plugin_id}" already has a pending run request',
                    "transition-in-flight",
                )
            return package

        package = planned()
        if signal.aborted:
            raise CordisError("cordis_run was cancelled", "cancelled")
        if package.has_client:
            if client is None:
                raise CordisError(
                    f'package "{package_id}" has a Client half; client halves run in a page '
                    "runner, which this registry does not have. Host-only packages run now.",
                    "client-unavailable",
                )
            # Never waits for a page: the outcome arrives later as a steering record.
            return await client.request(plugin, package, cast(Mode, mode), principal, planned)
        if self.hosts is None:
            raise CordisError(NO_PLUGIN_HOSTS, "plugin-hosts-unavailable")
        attempt = await self.new_attempt(
            plugin, package, cast(Mode, mode), "starting-host", principal=principal, recheck=planned
        )
        # Shielded: a cancelled tool call must not leave a half-started host behind; the start
        # runs to its end (commit or failure) and the state stays consistent either way.
        task = self.start_host(plugin, package, attempt, self.hosts)
        task.add_done_callback(lambda t: self._settled_late(plugin, attempt, signal, t))
        return await asyncio.shield(task)

    async def new_attempt(
        self,
        plugin: Plugin,
        package: Package,
        mode: Mode,
        status: AttemptStatus,
        *,
        principal: Principal = ANONYMOUS,
        recheck: Callable[[], object] | None = None,
    ) -> Attempt:
        """Mints `run-<n>` and records the attempt as the plugin's latest, `next` its target
        (stored first: a registry that had not heard of another's change to the plugin is
        refused with `stale-state`, and nothing changes); `principal` started it (its plugin
        host acts as it). `recheck` plans the run again under the store's lock."""
        async with self._lock:
            if self._plugins.get(plugin.plugin_id) is not plugin:
                raise plugin_missing(plugin.plugin_id)
            if recheck is not None:
                recheck()
            run_id = await self._ids.run()
            try:
                plugin.revision = await self._store.set_pointers(
                    plugin.plugin_id, plugin.current, package.package_id, revision=plugin.revision
                )
            except StaleWrite:
                await self._reload({plugin.plugin_id})
                raise stale_state(plugin.plugin_id) from None
        attempt = Attempt(
            run_id=run_id,
            package_id=package.package_id,
            mode=mode,
            status=status,
            host=HalfState("pending" if package.has_host else "absent"),
            client=HalfState("pending" if package.has_client else "absent"),
            principal=principal,
        )
        plugin.next = package.package_id
        plugin.latest = attempt
        return attempt

    def start_host(
        self,
        plugin: Plugin,
        package: Package,
        attempt: Attempt,
        hosts: PluginHosts | None,
        *,
        client_pending: bool = False,
    ) -> asyncio.Task[dict[str, JsonValue]]:
        """Starts the activation (retracting the old run first); `client_pending`: a
        client-bearing package stops at `client-pending` instead of committing (the page's
        settlement commits it). Concurrent callers share the task in `starting_task`."""
        plugin.starting = True
        # Before the plugin can listen: nothing is missed. (A runner without a catalog -- unit
        # tests -- keys history by the name.)
        self._events.follow(plugin.owner, plugin.owner_id or plugin.owner)
        task = asyncio.ensure_future(
            self._start(plugin, package, attempt, hosts, client_pending=client_pending)
        )
        self._starts[plugin.plugin_id] = task
        return task

    def starting_task(self, plugin_id: str) -> asyncio.Task[dict[str, JsonValue]] | None:
        return self._starts.get(plugin_id)

    def _settled_late(
        self,
        plugin: Plugin,
        attempt: Attempt,
        signal: AbortSignal,
        task: asyncio.Task[dict[str, JsonValue]],
    ) -> None:
        """A start whose `cordis_run` call was cancelled ends after the tool returned: the
        agent learns the outcome from a steering record instead of the result."""
        if not signal.aborted or task.cancelled():
            return
        p, k, run_id = plugin.plugin_id, attempt.package_id, attempt.run_id
        metadata: dict[str, JsonValue] = {"pluginId": p, "packageId": k, "pluginRunId": run_id}
        if task.exception() is None:
            text = completed_text(attempt.mode, p, k, run_id, plugin.current or k)
        else:
            error = attempt.error
            text = failed_text(
                attempt.mode,
                p,
                k,
                run_id,
                returned="cancelled",
                reason="host-half-failed",
                detail=_detail(error.message, error.stack) if error else str(task.exception()),
                current=plugin.current,
                next_=plugin.next,
            )
        self.steering.steer(plugin.owner, text, metadata)

    async def _start(
        self,
        plugin: Plugin,
        package: Package,
        attempt: Attempt,
        hosts: PluginHosts | None,
        *,
        client_pending: bool,
    ) -> dict[str, JsonValue]:
        try:
            if plugin.run is not None:
                await self._retract(plugin)  # update = retract, await quiescence, then start
            if not package.has_host:  # a client-only package: the run has no plugin host
                return self._client_only_run(plugin, package, attempt)
            if hosts is None:
                raise self._failed(plugin, attempt, "host-load", NO_PLUGIN_HOSTS)
            return await self._activate(
                plugin, package, attempt, hosts, client_pending=client_pending
            )
        finally:
            plugin.starting = False
            if self._starts.get(plugin.plugin_id) is asyncio.current_task():
                del self._starts[plugin.plugin_id]
            self._changed_run()

    def _client_only_run(
        self, plugin: Plugin, package: Package, attempt: Attempt
    ) -> dict[str, JsonValue]:
        if plugin.latest is not attempt or self._plugins.get(plugin.plugin_id) is not plugin:
            raise CordisError(
                f'plugin "{plugin.plugin_id}" was removed while starting', "cancelled"
            )
        plugin.run = ActiveRun(attempt.run_id, package.package_id, None)
        attempt.status = "client-pending"
        return {"status": "client-pending", "pluginRunId": attempt.run_id}

    async def _activate(
        self,
        plugin: Plugin,
        package: Package,
        attempt: Attempt,
        hosts: PluginHosts,
        *,
        client_pending: bool = False,
    ) -> dict[str, JsonValue]:
        run_id = attempt.run_id
        owner, plugin_id = plugin.owner, plugin.plugin_id
        services = self._services.available(self._plugins.values(), owner, plugin_id)
        # The host acts as the principal that started it: it is shown the tools that
        # principal may call, and its own calls are admitted by the same rule.
        access = self._authority.access(attempt.principal, owner)
        spec = ActivationSpec(
            owner=plugin.owner,
            plugin_id=plugin.plugin_id,
            package_id=package.package_id,
            run_id=run_id,
            language=self._host_language(plugin.owner),
            source=package.host or "",
            name=package.name,
            start_timeout_s=self._start_timeout_s,
            compute_ms_per_call=self._compute_ms_per_call,
            # (name, input schema), as the seam and the runtime adapter read them.
            visible_tools=tuple(
                (d.name, d.input_schema) for d in self.visible_tools(plugin.owner, access)
            ),
            services=services,
        )
        events = HostEvents(
            on_change=lambda regs: self._host_changed(plugin, run_id, regs),
            on_lost=lambda reason: self._host_lost(plugin, run_id, reason),
            on_log=lambda stream, text: log.info(
                "[cordis:%s] %s: %s", plugin.plugin_id, stream, text.rstrip()
            ),
            on_service_call=lambda service, method, args: self._host_call(
                access, owner, plugin_id, run_id, service=service, method=method, arguments=args
            ),
        )
        if self._admission is not None:  # whatever runs the hosts, each holds a slot
            hosts = AdmittedPluginHosts(hosts, self._admission)
        if self._placement is not None:
            await self._take_lease(self._placement, plugin, attempt)
        try:
            try:
                host = await hosts.activate(spec, events)
            except BaseException:
                self._release_soon(plugin_id)
                raise
        except ActivationFailed as exc:
            raise self._failed(
                plugin, attempt, exc.phase, exc.message, exc.stack, reason=exc.code
            ) from None
        except CodemodeError as exc:  # the runtime is unavailable, or refused the start
            raise self._failed(plugin, attempt, "host-load", exc.message) from None
        except Exception as exc:  # an adapter's bug must not leave the attempt "starting"
            log.exception("cordis %s: the activation failed unexpectedly", plugin.plugin_id)
            raise self._failed(
                plugin, attempt, "host-apply", str(exc) or type(exc).__name__
            ) from None
        if plugin.latest is not attempt or self._plugins.get(plugin.plugin_id) is not plugin:
            await host.retract()  # undefined (or its owner deleted) while it started
            self._release_soon(plugin_id)
            raise CordisError(
                f'plugin "{plugin.plugin_id}" was removed while starting', "cancelled"
            )
        run = ActiveRun(run_id, package.package_id, host)
        plugin.run = run
        self._services.told(run_id, services)
        try:
            self._sync_tools(plugin, run, host.registrations, strict=True)
        except CordisError as exc:
            await self._retract(plugin)
            raise self._failed(plugin, attempt, "host-apply", exc.message) from None
        self._tell_services(plugin.owner)  # what it provides, and what appeared meanwhile
        registrations = run.registrations
        waiting = registrations.waiting
        attempt.host = HalfState("waiting" if waiting else "running", registrations.waiting_for)
        if client_pending:  # the page's settlement commits (or fails) the activation
            attempt.status = "client-pending"
            return {"status": "client-pending", "pluginRunId": run_id}
        attempt.status = "waiting" if waiting else "running"  # a parked plugin counts as success
        plugin.current = package.package_id
        plugin.next = None
        self.changed(plugin)
        return {
            "status": "running",
            "pluginId": plugin.plugin_id,
            "packageId": package.package_id,
            "pluginRunId": run_id,
            "currentPackageId": package.package_id,
            "host": {
                "status": attempt.host.status,
                "provides": list(registrations.provides),
                "waitingFor": list(registrations.waiting_for),
            },
            "client": {"status": "absent", "waitingFor": []},
        }

    async def _host_call(
        self,
        access: ToolAccess,
        owner: str,
        plugin_id: str,
        run_id: str,
        *,
        service: str,
        method: str,
        arguments: JsonValue,
    ) -> JsonValue:
        """A plugin host's call of another plugin's service method, as the host's principal."""
        try:
            await self._authority.check(
                access,
                owner,
                f"{service}.{method}",
                call_id="",
                via="plugin-host",
                parent_call_id=run_id,
                kind=CallKind.HOST,
            )
        except CodemodeError as exc:
            raise ToolCallFailure(
                f"PERMISSION_DENIED: {exc.message}", "PERMISSION_DENIED"
            ) from None
        return await self._services.call(
            list(self._plugins.values()),
            owner,
            caller=plugin_id,
            service=service,
            method=method,
            arguments=arguments,
        )

    def _failed(
        self,
        plugin: Plugin,
        attempt: Attempt,
        phase: Phase,
        message: str,
        stack: str = "",
        *,
        reason: str = "",
    ) -> CordisError:
        """Records a failed attempt: `current` stays, `next` is the failed target. `reason`:
        the error code when it is not the host half's failure (no capacity, say)."""
        diagnostic = Diagnostic(
            phase, message, plugin.plugin_id, attempt.package_id, attempt.run_id, stack
        )
        attempt.status = "failed"
        attempt.error = diagnostic
        attempt.host = HalfState("failed", (), diagnostic)
        plugin.next = attempt.package_id
        self.changed(plugin)
        return CordisError(message, reason or "host-half-failed")

    # -- dynamic tools --------------------------------------------------------------------------

    def _sync_tools(
        self, plugin: Plugin, run: ActiveRun, registrations: HostRegistrations, *, strict: bool
    ) -> None:
        """Makes the catalog hold exactly the tools the plugin has registered right now.

        `strict` (at activation): any refusal fails the activation. Later changes (a tool
        registered from an effect) skip what cannot be registered and log it."""
        wanted = {spec.name: spec for spec in registrations.tools}
        for name, defn in list(run.tools.items()):
            spec = wanted.get(name)
            if spec is None or _spec_of(defn) != spec:
                self._catalog.unregister(plugin.owner, defn)
                del run.tools[name]
        fresh = [
            self._dynamic_definition(plugin, run, spec)
            for name, spec in wanted.items()
            if name not in run.tools
        ]
        for defn in fresh:
            try:
                if defn.name in self._reserved:
                    raise CordisError(
                        f'tool "{defn.name}" is reserved for the Cordis tools; choose another name',
                        "host-apply",
                    )
                self._catalog.register(plugin.owner, [defn])
            except CodemodeError as exc:
                message = exc.message
                if "already registered" in message:
                    message += (
                        ". To replace a tool of a running plugin, update that plugin (cordis_run "
                        'mode="update") or stop it first (cordis_stop), then run this package.'
                    )
                if strict:
                    raise CordisError(message, "host-apply") from None
                log.warning("cordis %s: %s", plugin.plugin_id, message)
                continue
            except CordisError as exc:
                if strict:
                    raise
                log.warning("cordis %s: %s", plugin.plugin_id, exc.message)
                continue
            run.tools[defn.name] = defn
        run.registrations = registrations
        self._changed_run()

    def _dynamic_definition(
        self, plugin: Plugin, run: ActiveRun, spec: DynamicToolSpec
    ) -> ToolDefinition:
        plugin_id, run_id, name = plugin.plugin_id, run.run_id, spec.name

        async def body(invocation: Invocation) -> JsonValue | ToolResult:
            current = self._plugins.get(plugin_id)
            active = current.run if current is not None else None
            if active is None or active.run_id != run_id or active.host is None:
                raise ToolCallFailure(
                    f'tool "{name}" belongs to dynamic plugin {plugin_id}, which is no longer '
                    "running",
                    PLUGIN_NOT_RUNNING,
                )
            try:
                return await _call_until_aborted(active.host, name, invocation)
            except ToolCallFailure as exc:
                if (
                    exc.code == HOST_GONE
                    and current is not None
                    and not isinstance(active.host, RemoteHost)
                ):
                    # The host died under this call before its stream said so: the same loss.
                    self._host_lost(current, run_id, f'a call of tool "{name}" found it gone')
                raise

        return ToolDefinition(
            name=name,
            description=spec.description,
            input_schema=spec.input_schema,
            output_schema=spec.output_schema if spec.output_schema is not None else {},
            body=body,
            owner=f"cordis:{plugin_id}",
            metadata={
                "cordis.pluginId": plugin_id,
                "cordis.packageId": run.package_id,
                "cordis.pluginRunId": run_id,
            },
        )

    def _host_changed(self, plugin: Plugin, run_id: str, registrations: HostRegistrations) -> None:
        run = plugin.run
        if run is None or run.run_id != run_id:
            return  # a stale report from a retracted run
        self._sync_tools(plugin, run, registrations, strict=False)
        self._tell_services(plugin.owner)
        latest = plugin.latest
        if (
            latest is not None
            and latest.run_id == run_id
            and latest.status in ("running", "waiting", "client-pending")
        ):
            waiting = registrations.waiting
            latest.host = HalfState("waiting" if waiting else "running", registrations.waiting_for)
            if latest.status != "client-pending":
                client_waits = latest.client.status == "waiting"
                latest.status = "waiting" if waiting or client_waits else "running"

    def _host_lost(self, plugin: Plugin, run_id: str, reason: str) -> None:
        run = plugin.run
        if run is None or run.run_id != run_id:
            return
        plugin.run = None
        self._unregister(plugin, run)
        self._tell_services(plugin.owner)  # its services are gone: consumers park again
        latest = plugin.latest
        message = f"the plugin host stopped unexpectedly: {reason}"
        if latest is not None and latest.run_id == run_id:
            diagnostic = Diagnostic("host-apply", message, plugin.plugin_id, run.package_id, run_id)
            latest.status = "failed"
            latest.error = diagnostic
            latest.host = HalfState("failed", (), diagnostic)
            plugin.next = run.package_id  # the most recently failed target; `current` stays
            self.changed(plugin)
            self.steering.steer_once(
                run_id,
                HOST_LOST,
                plugin.owner,
                failed_text(
                    latest.mode,
                    plugin.plugin_id,
                    run.package_id,
                    run_id,
                    returned="running",
                    reason="plugin-host-lost",
                    detail=f"the plugin host of {plugin.plugin_id} stopped unexpectedly: {reason}",
                    current=plugin.current,
                    next_=plugin.next,
                ),
                {"pluginId": plugin.plugin_id, "packageId": run.package_id, "pluginRunId": run_id},
            )
        if run.host is not None:
            self.in_background(run.host.retract())  # idempotent; reaps whatever is left
        self._release_soon(plugin.plugin_id)  # a crashed host stops the plugin everywhere
        self._changed_run()

    def _unregister(self, plugin: Plugin, run: ActiveRun) -> None:
        for defn in run.tools.values():
            self._catalog.unregister(plugin.owner, defn)
        run.tools.clear()
        self._services.forget(run.run_id)

    def _deliver_event(self, owner: str, record: Record) -> None:
        event: JsonValue | None = None
        for plugin in self.owned(owner):
            run = plugin.run
            if run is None or run.host is None or record.kind not in run.registrations.events:
                continue
            event = payload(record) if event is None else event
            run.host.deliver_event(record.kind, event)

    def _tell_services(self, owner: str) -> None:
        self._services.tell_all(list(self._plugins.values()), owner)

    async def _retract(self, plugin: Plugin, *, here_only: bool = False) -> None:
        """Detaches the run, removes its tools, and returns only once the plugin host has
        reached quiescence (in-flight calls settled, effects disposed, processes gone).
        A run another registry owns is retracted there (and released there), unless
        `here_only`: this registry forgets it, and its own host's lease is kept (a registry
        shutting down hands its plugins over rather than stopping them)."""
        run = plugin.run
        if run is None:
            return
        plugin.run = None
        self._unregister(plugin, run)
        self._tell_services(plugin.owner)  # consumers of its services park again
        self._changed_run()
        if isinstance(run.host, RemoteHost):
            if here_only:
                await run.host.retract()
            else:
                await run.host.stop()
            return
        if run.host is not None:
            await run.host.retract()
        if not here_only:
            await self._release(plugin.plugin_id)

    # -- stop / undefine ------------------------------------------------------------------------

    async def _settle_start(self, plugin_id: str) -> None:
        task = self._starts.get(plugin_id)
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)

    async def stop(self, owner: str, plugin_id: str) -> dict[str, JsonValue]:
        plugin = self._owned(owner, plugin_id)
        client = self.client_activation
        cancelled = client.cancel_pending(plugin) if client is not None else False
        if plugin.run is None and not plugin.starting and not cancelled:
            raise CordisError(f'dynamic plugin "{plugin_id}" is not running', "not-running")
        await self._settle_start(plugin_id)
        await self._retract(plugin)
        _mark_stopped(plugin)
        return {"pluginId": plugin_id}

    async def undefine(self, owner: str, plugin_id: str) -> dict[str, JsonValue]:
        plugin = self._owned(owner, plugin_id)
        if self.client_activation is not None:
            self.client_activation.cancel_pending(plugin)
        await self._settle_start(plugin_id)
        async with self._lock:
            await self._store.delete_plugin(plugin_id)
            if self._plugins.get(plugin_id) is plugin:
                del self._plugins[plugin_id]
        was_running = plugin.run is not None
        await self._retract(plugin)
        return {"pluginId": plugin_id, "wasRunning": was_running}

    def _scope_deleted(self, scope: str) -> None:
        """An agent's deletion revokes its plugins: they are forgotten and their hosts
        retracted (the layer, with its dynamic tools, is already gone), and their pending
        requests cancelled."""
        self._events.forget(scope)
        still = self._owner_id_of(scope)  # a new agent of the name keeps its own plugins
        for plugin in [p for p in self._plugins.values() if p.owner == scope]:
            if still and plugin.owner_id == still:
                continue
            self._forget(plugin)
            self._write_in_background(self._delete(plugin.plugin_id))

    async def _delete(self, plugin_id: str) -> None:
        async with self._lock:
            await self._store.delete_plugin(plugin_id)

    def in_background(self, work: object) -> None:
        async def run() -> None:
            try:
                await cast("asyncio.Future[None]", work)
            except Exception:
                log.exception("cordis: retract failed")

        task = asyncio.ensure_future(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Registry shutdown unwinds every host half (and waits for it). Sharing the store, it
        hands the plugins it runs over: their leases expire at once, and a survivor takes
        them over."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._keeper
        follows = [following for _address, following in self._following.values()]
        for following in follows:
            following.cancel()
        await asyncio.gather(*follows, return_exceptions=True)
        for task in list(self._starts.values()):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)
        for plugin in list(self._plugins.values()):
            with contextlib.suppress(Exception):
                await self._retract(plugin, here_only=True)
        if self._placement is not None:
            with contextlib.suppress(CodemodeError):
                await self._placement.leases.expire(self._placement.instance)
            await self._placement.peers.close()
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._follower is not None:
            await self._follower.close()
        while self._writes:  # what changed last is stored before the store closes
            await asyncio.gather(*self._writes, return_exceptions=True)
        await self._events.close()
        await self.steering.flush()

    # -- one host per running plugin across registries ------------------------------------------

    def _changed_run(self) -> None:
        """Wakes whoever follows this registry's runs (`follow_run`)."""
        self._run_changed.set()
        self._run_changed = asyncio.Event()

    async def _take_lease(self, placement: HostPlacement, plugin: Plugin, attempt: Attempt) -> None:
        """Before this registry starts the plugin's host: the lease is this registry's, naming
        the attempt's principal (a survivor reactivates the plugin as it), or the activation
        fails and nothing starts (another live registry runs the plugin)."""
        held = self._held.get(plugin.plugin_id)
        if held is not None and held.principal == attempt.principal:
            return  # taken over just now for this activator (kept by the renewals)
        try:
            lease = await placement.leases.acquire(
                plugin.plugin_id,
                placement.instance,
                placement.address,
                placement.lease_s,
                principal=attempt.principal,
            )
        except CodemodeError as exc:
            raise self._failed(plugin, attempt, "host-load", exc.message) from None
        if lease is None:
            raise self._failed(
                plugin,
                attempt,
                "host-load",
                f'dynamic plugin "{plugin.plugin_id}" is being started or run by another '
                "registry; stop it first (cordis_stop) or retry",
                reason="transition-in-flight",
            )
        self._held[plugin.plugin_id] = lease

    async def _release(self, plugin_id: str) -> None:
        lease = self._held.pop(plugin_id, None)
        if lease is not None:
            await self._release_lease(lease)

    async def _release_lease(self, lease: HostLease) -> None:
        if self._placement is None:
            return
        try:
            await self._placement.leases.release(lease)
        except CodemodeError as exc:  # it expires instead
            log.warning("cordis: the host lease of %s was not released: %s", lease.plugin_id, exc)

    def _release_soon(self, plugin_id: str) -> None:
        """Taken from this registry now (a start right after holds a lease of its own)."""
        lease = self._held.pop(plugin_id, None)
        if lease is not None:
            self._write_in_background(self._release_lease(lease))

    async def _keep_leases(self, placement: HostPlacement) -> None:
        """Renews this registry's leases a few times per lease period, follows the plugins
        other registries run, and takes over those whose owner stopped renewing."""
        while True:
            try:
                await self._renew(placement)
                await self._look_at_leases(placement, None)
            except CodemodeError as exc:
                log.warning("cordis: host leases not kept this time: %s", exc.message)
            except Exception:
                log.exception("cordis: host leases not kept this time")
            await asyncio.sleep(placement.lease_s / 3)

    async def _renew(self, placement: HostPlacement) -> None:
        for plugin_id, lease in list(self._held.items()):
            renewed = await placement.leases.renew(lease, placement.lease_s)
            if self._held.get(plugin_id) is not lease:
                continue  # released meanwhile
            if renewed is not None:
                self._held[plugin_id] = renewed
                continue
            # Taken over (this registry missed its renewals): the other registry runs it now.
            del self._held[plugin_id]
            log.warning("cordis: the host lease of %s was taken over", plugin_id)
            plugin = self._plugins.get(plugin_id)
            if plugin is not None and plugin.run is not None:
                await self._retract(plugin, here_only=True)

    async def _look_at_leases(
        self, placement: HostPlacement, plugin_ids: Collection[str] | None
    ) -> None:
        for lease in await placement.leases.load(plugin_ids):
            plugin = self._plugins.get(lease.plugin_id)
            if lease.owner == placement.instance or plugin is None:
                continue
            if lease.expired:
                if plugin.plugin_id not in self._taking:  # an activation: not in this loop
                    self._taking.add(plugin.plugin_id)
                    self.in_background(self._take_over(placement, plugin, lease))
            else:
                self._follow_owner(placement, plugin, lease)

    def _follow_owner(self, placement: HostPlacement, plugin: Plugin, lease: HostLease) -> None:
        following = self._following.get(plugin.plugin_id)
        if following is not None and following[0] == lease.address and not following[1].done():
            return
        if following is not None:
            following[1].cancel()
        task = asyncio.ensure_future(self._follow(placement, plugin.plugin_id, lease.address))
        self._following[plugin.plugin_id] = (lease.address, task)

    async def _follow(self, placement: HostPlacement, plugin_id: str, address: str) -> None:
        """Mirrors the owner's run of the plugin here (a `RemoteHost`: its tools in this
        registry's catalog) until it ends there or the owner is lost."""
        try:
            async for remote in placement.peers.follow(address, plugin_id):
                plugin = self._plugins.get(plugin_id)
                if plugin is None or plugin.starting:
                    return
                run = plugin.run
                if run is not None and not isinstance(run.host, RemoteHost):
                    return  # this registry runs it now
                if run is None or run.run_id != remote.run_id:
                    if run is not None:
                        await self._retract(plugin, here_only=True)
                    host = RemoteHost(placement.peers, address, plugin_id, remote)
                    run = ActiveRun(remote.run_id, remote.package_id, host)
                    plugin.run = run
                else:
                    cast(RemoteHost, run.host).run = remote
                self._sync_tools(plugin, run, remote.registrations, strict=False)
                self._tell_services(plugin.owner)
                self._lost_runs.pop(plugin_id, None)  # the owner answers again
        except OwnerLost as exc:
            log.info("cordis: the registry running %s is lost: %s", plugin_id, exc)
            plugin = self._plugins.get(plugin_id)
            run = plugin.run if plugin is not None else None
            if run is not None and isinstance(run.host, RemoteHost):
                self._lost_runs[plugin_id] = (address, run.run_id)
        finally:
            plugin = self._plugins.get(plugin_id)
            run = plugin.run if plugin is not None else None
            if (
                plugin is not None
                and run is not None
                and isinstance(run.host, RemoteHost)
                and run.host.address == address
            ):
                await self._retract(plugin, here_only=True)
            following = self._following.get(plugin_id)
            if following is not None and following[1] is asyncio.current_task():
                del self._following[plugin_id]

    async def _take_over(self, placement: HostPlacement, plugin: Plugin, lease: HostLease) -> None:
        """The plugin's owner stopped renewing its lease: this registry takes the lease (one
        survivor wins it) and reactivates the plugin's current package as the principal the
        lease names (who activated the lost run), and the agent is steered. A package with a
        Client half has its Host half reactivated and waits at `client-pending` until a page
        attached to the agent loads the Client half of the new run and settles it (its grant
        holds: no new approval); the Client half that ran in a page of the lost registry went
        with it. A plugin with no current package, or a Client-only one (no host to move), is
        left stopped."""
        try:
            await self._take_over_now(placement, plugin, lease)
        except CodemodeError as exc:  # the store failed: the next look tries again
            log.warning("cordis: %s not taken over: %s", plugin.plugin_id, exc.message)
        finally:
            self._taking.discard(plugin.plugin_id)

    async def _take_over_now(
        self, placement: HostPlacement, plugin: Plugin, lease: HostLease
    ) -> None:
        following = self._following.pop(plugin.plugin_id, None)
        if following is not None:  # an owner that vanished may never end its stream
            following[1].cancel()
        lost = plugin.run
        lost_at = self._lost_runs.pop(plugin.plugin_id, None)
        lost_run = (
            lost.run_id
            if lost is not None
            else lost_at[1]
            if lost_at is not None and lost_at[0] == lease.address
            else "its run"
        )
        if lost is not None and isinstance(lost.host, RemoteHost):
            await self._retract(plugin, here_only=True)  # its tools leave this catalog
        current = plugin.current
        package = plugin.packages.get(current) if current is not None else None
        if (
            package is None
            or not package.has_host
            or plugin.starting
            or self.hosts is None
            or not placement.address
        ):
            return
        # The activator comes from the store (the lost owner wrote it), never from a peer's
        # claim or whoever called the plugin since.
        principal = lease.principal
        taken = await placement.leases.acquire(
            plugin.plugin_id,
            placement.instance,
            placement.address,
            placement.lease_s,
            principal=principal,
        )
        if taken is None:
            return  # another survivor was first
        self._held[plugin.plugin_id] = taken
        try:
            attempt = await self.new_attempt(
                plugin, package, "run", "starting-host", principal=principal
            )
        except CordisError as exc:
            log.warning("cordis: %s not taken over: %s", plugin.plugin_id, exc.message)
            await self._release(plugin.plugin_id)
            return
        metadata: dict[str, JsonValue] = {
            "pluginId": plugin.plugin_id,
            "packageId": package.package_id,
            "pluginRunId": attempt.run_id,
        }
        try:
            await self.start_host(
                plugin, package, attempt, self.hosts, client_pending=package.has_client
            )
        except CordisError as exc:
            text = take_over_failed_text(
                plugin.plugin_id, package.package_id, attempt.run_id, lease.address, exc.message
            )
        else:
            text = taken_over_text(
                plugin.plugin_id,
                package.package_id,
                attempt.run_id,
                lost_run,
                lease.address,
                client_half=package.has_client,
            )
        self.steering.steer(plugin.owner, text, metadata)

    # The owner's side of the peer channel: what another registry forwards, after its own
    # pipeline authorized it, to the run this registry holds the lease of.

    def _local_run(self, plugin_id: str, run_id: str | None = None) -> tuple[Plugin, ActiveRun]:
        plugin = self._plugins.get(plugin_id)
        run = plugin.run if plugin is not None else None
        if (
            plugin is None
            or run is None
            or run.host is None
            or isinstance(run.host, RemoteHost)
            or plugin_id not in self._held
            or (run_id is not None and run.run_id != run_id)
        ):
            raise ToolCallFailure(
                f"dynamic plugin {plugin_id} has no run {run_id or ''} in this registry",
                PLUGIN_NOT_RUNNING,
            )
        return plugin, run

    async def follow_run(self, plugin_id: str) -> AsyncIterator[RemoteRun]:
        """The plugin's run here, then each change, until it ends here (`ToolCallFailure`
        with `PLUGIN_NOT_RUNNING` when there is none). A follower that heard of the lease
        before the host had started waits for the start."""
        while True:
            changed = self._run_changed
            starting = self._plugins.get(plugin_id)
            if starting is None or not starting.starting or plugin_id not in self._held:
                break
            await changed.wait()
        plugin, run = self._local_run(plugin_id)
        first = run.run_id
        last: RemoteRun | None = None
        while True:
            changed = self._run_changed  # before reading: a change meanwhile wakes the wait
            try:
                plugin, run = self._local_run(plugin_id, first)
            except ToolCallFailure:
                return
            latest = plugin.latest
            principal = (
                latest.principal if latest is not None and latest.run_id == first else ANONYMOUS
            )
            state = RemoteRun(
                first, run.package_id, self._held[plugin_id].epoch, run.registrations, principal
            )
            if state != last:
                yield state
                last = state
            await changed.wait()

    async def call_run_tool(
        self, plugin_id: str, run_id: str, name: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue | ToolResult:
        plugin, run = self._local_run(plugin_id, run_id)
        assert run.host is not None
        try:
            return await run.host.call_tool(name, arguments, signal)
        except ToolCallFailure as exc:
            if exc.code == HOST_GONE:
                self._host_lost(plugin, run_id, f'a call of tool "{name}" found it gone')
            raise

    async def call_run_service(
        self, at: RunAt, service: str, method: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue:
        _plugin, run = self._local_run(at.plugin_id, at.run_id)
        assert run.host is not None
        return await run.host.call_service(service, method, arguments, signal)

    async def call_run_handler(
        self, plugin_id: str, run_id: str, method: str, arguments: JsonValue
    ) -> JsonValue:
        try:
            _plugin, run = self._local_run(plugin_id, run_id)
        except ToolCallFailure as exc:
            raise HandlerFailed(str(exc)) from None
        assert run.host is not None
        return await run.host.call_handler(method, arguments)

    async def stop_run(self, plugin_id: str, run_id: str) -> bool:
        """Another registry's `cordis_stop` (or update) of the run this registry holds."""
        try:
            plugin, _run = self._local_run(plugin_id, run_id)
        except ToolCallFailure:
            return False
        await self._retract(plugin)
        _mark_stopped(plugin)
        return True

    # -- read-only views ----------------------------------------------------------------------

    def list_summaries(self, owner: str) -> list[JsonValue]:
        return [p.summary() for p in self.owned(owner)]

    def inspect_plugin(self, owner: str, plugin_id: str) -> dict[str, JsonValue]:
        return self._owned(owner, plugin_id).plugin_view()

    def inspect_package(self, owner: str, plugin_id: str, package_id: str) -> dict[str, JsonValue]:
        plugin = self._owned(owner, plugin_id)
        if package_id not in plugin.packages:
            raise CordisError(
                f'plugin "{plugin_id}" has no package "{package_id}"', "package-missing"
            )
        return plugin.package_view(package_id)

    def reference(self, owner: str, plugin_id: str) -> dict[str, JsonValue] | None:
        plugin = self.find(owner, plugin_id)
        return None if plugin is None else plugin.reference()


def _mark_stopped(plugin: Plugin) -> None:
    latest = plugin.latest
    if latest is not None and latest.status in (
        "running",
        "waiting",
        "starting-host",
        "client-pending",
    ):
        latest.status = "stopped"
        for half in (latest.host, latest.client):
            if half.status != "absent":
                half.status = "stopped"
                half.waiting_for = ()


def _detail(message: str, stack: str) -> str:
    return f"{message}\n{stack}" if stack else message


def _spec_of(defn: ToolDefinition) -> DynamicToolSpec:
    return DynamicToolSpec(
        defn.name, defn.description, defn.input_schema, defn.output_schema or None
    )


async def _call_until_aborted(
    host: ActiveHost, name: str, invocation: Invocation
) -> JsonValue | ToolResult:
    """The host gets the call's signal (it cancels the handler); the call settles at once on
    abort, like a provider's (a late result is dropped)."""
    signal = invocation.signal
    if signal.aborted:
        return aborted(before_dispatch=True)
    call = asyncio.ensure_future(host.call_tool(name, invocation.arguments, signal))
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_abort(_reason: str) -> None:
        if not gate.done():
            gate.set_result(None)

    remove = signal.add_listener(on_abort)
    try:
        await asyncio.wait(
            cast("set[asyncio.Future[object]]", {call, gate}),
            return_when=asyncio.FIRST_COMPLETED,
        )
    except asyncio.CancelledError:
        call.cancel()
        raise
    finally:
        remove()
    if call.done():
        return call.result()
    call.add_done_callback(lambda f: f.cancelled() or f.exception())  # drop the late outcome
    return aborted(before_dispatch=False)
