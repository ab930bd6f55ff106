"""The Cordis runner: define, run/update/rollback, stop, undefine and the read-only views, per
owning agent (reference §9.1-§9.4, design/cordis.md).

Invariants kept here (and tested through the API):
- define never runs code, never asks approval and never moves a pointer; packages are immutable
  and ids are never reused;
- `current` moves only on a fully successful activation; a failed update keeps `current` and
  sets `next`; a rollback with `run` clears `next`;
- one physical run per plugin: an update retracts the old run first and awaits its quiescence
  (its tools are gone from the catalog, the plugin host has settled its calls, disposed its
  effects and its processes are gone) before the new host half starts;
- a dynamic tool is an ordinary catalog entry in the owner's scope: every call goes through the
  pipeline, and its body is an invocation on the plugin host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import cast

from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.catalog import Catalog
from registry_service.domain.cordis.durable import (
    CordisStateStore,
    Persistence,
    restore,
    snapshot,
)
from registry_service.domain.cordis.ids import Ids, check_prefix
from registry_service.domain.cordis.model import (
    ActiveRun,
    Attempt,
    Diagnostic,
    HalfState,
    Mode,
    Package,
    Phase,
    Plugin,
)
from registry_service.domain.cordis.refusals import CordisError, plugin_missing
from registry_service.domain.cordis.steering import (
    HOST_LOST,
    Steering,
    completed_text,
    failed_text,
)
from registry_service.domain.cordis.syntax import check_javascript_client, check_python_host
from registry_service.domain.plugin_hosts import (
    HOST_GONE,
    ActivationFailed,
    ActivationSpec,
    ActiveHost,
    DynamicToolSpec,
    HostEvents,
    HostRegistrations,
    PluginHosts,
)
from registry_service.domain.results import ToolResult, aborted
from registry_service.domain.signals import AbortSignal
from registry_service.domain.tools import RUN_CODE, Invocation, ToolDefinition

log = logging.getLogger(__name__)

PLUGIN_NOT_RUNNING = "PLUGIN_NOT_RUNNING"
NO_PLUGIN_HOSTS = (
    "cordis_run cannot start a Host half: this registry has no plugin hosts configured "
    "(host halves run on a runtime; configure `runtime_targets`)"
)


class CordisRunner:
    def __init__(
        self,
        catalog: Catalog,
        hosts: PluginHosts | None = None,
        *,
        reserved_names: Iterable[str] = (),
        start_timeout_s: float = 5.0,
        steering: Steering | None = None,
        state_store: CordisStateStore | None = None,
    ) -> None:
        """`state_store`: keep plugins, packages, grants, pointers and id counters there
        across restarts (loaded now; runs are not restarted). None: process memory only."""
        self._catalog = catalog
        self.hosts = hosts
        self.steering = steering or Steering()
        self._reserved = frozenset(reserved_names)
        self._start_timeout_s = start_timeout_s
        self._ids = Ids()
        self._plugins: dict[str, Plugin] = {}
        self._starts: dict[str, asyncio.Task[dict[str, JsonValue]]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._persistence: Persistence | None = None
        if state_store is not None:
            saved = state_store.load()
            if saved is not None:
                self._plugins = {p.plugin_id: p for p in restore(saved, self._ids)}
            self._persistence = Persistence(
                state_store, lambda: snapshot(self._plugins.values(), self._ids)
            )
        catalog.on_delete(self._scope_deleted)

    def _changed(self) -> None:
        """Something durable changed (a package, a pointer, an id counter, a plugin)."""
        if self._persistence is not None:
            self._persistence.changed()

    # -- lookups ------------------------------------------------------------------------------

    def _owned(self, owner: str, plugin_id: str) -> Plugin:
        plugin = self._plugins.get(plugin_id)
        if plugin is None or plugin.owner != owner:
            raise plugin_missing(plugin_id)
        return plugin

    def owned(self, owner: str) -> list[Plugin]:
        return [p for p in self._plugins.values() if p.owner == owner]

    def visible_tools(self, owner: str) -> list[ToolDefinition]:
        view = self._catalog.view(owner)
        return [defn for name, defn in view.visible.items() if name != RUN_CODE]

    def provided_services(self, owner: str) -> list[tuple[str, str]]:
        return [
            (service, plugin.plugin_id)
            for plugin in self.owned(owner)
            if plugin.run is not None
            for service in plugin.run.registrations.provides
        ]

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
        if host is not None and self._catalog.language_for(owner) == "python":
            check_python_host(host)
        if client is not None:
            await check_javascript_client(client)
        # Looked up again: the plugin may have been undefined while node parsed the client half.
        if prefix:
            owner_id = self._catalog.get_agent(owner).agent_id
            target = Plugin(self._ids.plugin(prefix, self._plugins), owner, owner_id=owner_id)
            self._plugins[target.plugin_id] = target
        else:
            target = self._owned(owner, cast(str, plugin.get("pluginId", "")))
        package = Package(self._ids.package(), name, purpose, host, client)
        target.packages[package.package_id] = package
        self._changed()
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
        """Plan validation shared by every entry point (§9.3)."""
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
        self, owner: str, plugin_id: str, package_id: str, mode: str, signal: AbortSignal
    ) -> dict[str, JsonValue]:
        plugin = self._owned(owner, plugin_id)
        package = self._plan(plugin, package_id, mode)
        if signal.aborted:
            raise CordisError("cordis_run was cancelled", "cancelled")
        if package.has_client:
            # The page-runner seam: approval, grants and client settlement arrive with the
            # page runner (next issue). Refused before any state changes.
            raise CordisError(
                f'package "{package_id}" has a Client half; client halves run in a page runner, '
                "which this registry does not have yet. Host-only packages run now.",
                "client-unavailable",
            )
        if self.hosts is None:
            raise CordisError(NO_PLUGIN_HOSTS, "plugin-hosts-unavailable")
        attempt = Attempt(
            run_id=self._ids.run(),
            package_id=package_id,
            mode=cast(Mode, mode),
            status="starting-host",
            host=HalfState("pending"),
            client=HalfState("absent"),
        )
        plugin.next = package_id
        plugin.latest = attempt
        plugin.starting = True
        self._changed()
        # Shielded: a cancelled tool call must not leave a half-started host behind; the start
        # runs to its end (commit or failure) and the state stays consistent either way.
        task = asyncio.ensure_future(self._start(plugin, package, attempt, self.hosts))
        self._starts[plugin_id] = task
        task.add_done_callback(lambda t: self._settled_late(plugin, attempt, signal, t))
        return await asyncio.shield(task)

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
        self, plugin: Plugin, package: Package, attempt: Attempt, hosts: PluginHosts
    ) -> dict[str, JsonValue]:
        try:
            if plugin.run is not None:
                await self._retract(plugin)  # update = retract, await quiescence, then start
            return await self._activate(plugin, package, attempt, hosts)
        finally:
            plugin.starting = False
            if self._starts.get(plugin.plugin_id) is asyncio.current_task():
                del self._starts[plugin.plugin_id]

    async def _activate(
        self, plugin: Plugin, package: Package, attempt: Attempt, hosts: PluginHosts
    ) -> dict[str, JsonValue]:
        run_id = attempt.run_id
        spec = ActivationSpec(
            owner=plugin.owner,
            plugin_id=plugin.plugin_id,
            package_id=package.package_id,
            run_id=run_id,
            language=self._catalog.language_for(plugin.owner),
            source=package.host or "",
            name=package.name,
            start_timeout_s=self._start_timeout_s,
            # (name, input schema), as the seam and the runtime adapter read them.
            visible_tools=tuple((d.name, d.input_schema) for d in self.visible_tools(plugin.owner)),
        )
        events = HostEvents(
            on_change=lambda regs: self._host_changed(plugin, run_id, regs),
            on_lost=lambda reason: self._host_lost(plugin, run_id, reason),
            on_log=lambda stream, text: log.info(
                "[cordis:%s] %s: %s", plugin.plugin_id, stream, text.rstrip()
            ),
        )
        try:
            host = await hosts.activate(spec, events)
        except ActivationFailed as exc:
            raise self._failed(plugin, attempt, exc.phase, exc.message, exc.stack) from None
        except CodemodeError as exc:  # the runtime is unavailable, or refused the start
            raise self._failed(plugin, attempt, "host-load", exc.message) from None
        if plugin.latest is not attempt or self._plugins.get(plugin.plugin_id) is not plugin:
            await host.retract()  # undefined (or its owner deleted) while it started
            raise CordisError(
                f'plugin "{plugin.plugin_id}" was removed while starting', "cancelled"
            )
        run = ActiveRun(run_id, package.package_id, host)
        plugin.run = run
        try:
            self._sync_tools(plugin, run, host.registrations, strict=True)
        except CordisError as exc:
            await self._retract(plugin)
            raise self._failed(plugin, attempt, "host-apply", exc.message) from None
        registrations = run.registrations
        waiting = registrations.waiting
        attempt.status = "waiting" if waiting else "running"  # a parked plugin counts as success
        attempt.host = HalfState("waiting" if waiting else "running", registrations.waiting_for)
        plugin.current = package.package_id
        plugin.next = None
        self._changed()
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

    def _failed(
        self, plugin: Plugin, attempt: Attempt, phase: Phase, message: str, stack: str = ""
    ) -> CordisError:
        """Records a failed attempt: `current` stays, `next` is the failed target."""
        diagnostic = Diagnostic(
            phase, message, plugin.plugin_id, attempt.package_id, attempt.run_id, stack
        )
        attempt.status = "failed"
        attempt.error = diagnostic
        attempt.host = HalfState("failed", (), diagnostic)
        plugin.next = attempt.package_id
        self._changed()
        return CordisError(message, "host-half-failed")

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
                if exc.code == HOST_GONE and current is not None:
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
        latest = plugin.latest
        if (
            latest is not None
            and latest.run_id == run_id
            and latest.status
            in (
                "running",
                "waiting",
            )
        ):
            waiting = registrations.waiting
            latest.status = "waiting" if waiting else "running"
            latest.host = HalfState("waiting" if waiting else "running", registrations.waiting_for)

    def _host_lost(self, plugin: Plugin, run_id: str, reason: str) -> None:
        run = plugin.run
        if run is None or run.run_id != run_id:
            return
        plugin.run = None
        self._unregister(plugin, run)
        latest = plugin.latest
        message = f"the plugin host stopped unexpectedly: {reason}"
        if latest is not None and latest.run_id == run_id:
            diagnostic = Diagnostic("host-apply", message, plugin.plugin_id, run.package_id, run_id)
            latest.status = "failed"
            latest.error = diagnostic
            latest.host = HalfState("failed", (), diagnostic)
            plugin.next = run.package_id  # the most recently failed target; `current` stays
            self._changed()
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
            self._in_background(run.host.retract())  # idempotent; reaps whatever is left

    def _unregister(self, plugin: Plugin, run: ActiveRun) -> None:
        for defn in run.tools.values():
            self._catalog.unregister(plugin.owner, defn)
        run.tools.clear()

    async def _retract(self, plugin: Plugin) -> None:
        """Detaches the run, removes its tools, and returns only once the plugin host has
        reached quiescence (in-flight calls settled, effects disposed, processes gone)."""
        run = plugin.run
        if run is None:
            return
        plugin.run = None
        self._unregister(plugin, run)
        if run.host is not None:
            await run.host.retract()

    # -- stop / undefine ------------------------------------------------------------------------

    async def _settle_start(self, plugin_id: str) -> None:
        task = self._starts.get(plugin_id)
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)

    async def stop(self, owner: str, plugin_id: str) -> dict[str, JsonValue]:
        plugin = self._owned(owner, plugin_id)
        if plugin.run is None and not plugin.starting:
            raise CordisError(f'dynamic plugin "{plugin_id}" is not running', "not-running")
        await self._settle_start(plugin_id)
        await self._retract(plugin)
        latest = plugin.latest
        if latest is not None and latest.status in ("running", "waiting", "starting-host"):
            latest.status = "stopped"
            for half in (latest.host, latest.client):
                if half.status != "absent":
                    half.status = "stopped"
                    half.waiting_for = ()
        return {"pluginId": plugin_id}

    async def undefine(self, owner: str, plugin_id: str) -> dict[str, JsonValue]:
        plugin = self._owned(owner, plugin_id)
        await self._settle_start(plugin_id)
        was_running = plugin.run is not None
        await self._retract(plugin)
        self._plugins.pop(plugin_id, None)
        self._changed()
        return {"pluginId": plugin_id, "wasRunning": was_running}

    def adopt_owners(self) -> None:
        """At start, once the stored catalog is restored: a plugin whose owner is gone, or is
        a later agent of the same name (its deletion was not saved here: a crash, or Cordis
        not durable then), is forgotten; one saved before agents had ids takes its owner's."""
        for plugin in list(self._plugins.values()):
            try:
                owner_id = self._catalog.get_agent(plugin.owner).agent_id
            except CodemodeError:
                owner_id = ""
            if owner_id and plugin.owner_id in ("", owner_id):
                if not plugin.owner_id:
                    plugin.owner_id = owner_id
                    self._changed()
                continue
            log.warning("cordis: %s belonged to a deleted %s", plugin.plugin_id, plugin.owner)
            del self._plugins[plugin.plugin_id]
            self._changed()

    def _scope_deleted(self, scope: str) -> None:
        """An agent's deletion revokes its plugins: they are forgotten and their hosts
        retracted (the layer, with its dynamic tools, is already gone)."""
        for plugin in [p for p in self._plugins.values() if p.owner == scope]:
            del self._plugins[plugin.plugin_id]
            self._in_background(self._retract(plugin))
            self._changed()

    def _in_background(self, work: object) -> None:
        async def run() -> None:
            try:
                await cast("asyncio.Future[None]", work)
            except Exception:
                log.exception("cordis: retract failed")

        task = asyncio.ensure_future(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Registry shutdown unwinds every host half (and waits for it)."""
        for task in list(self._starts.values()):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)
        for plugin in list(self._plugins.values()):
            with contextlib.suppress(Exception):
                await self._retract(plugin)
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.steering.flush()
        if self._persistence is not None:
            await self._persistence.close()

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
        plugin = self._plugins.get(plugin_id)
        if plugin is None or plugin.owner != owner:
            return None
        return plugin.reference()


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
