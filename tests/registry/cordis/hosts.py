"""A `PluginHosts` for tests at the seam: it runs a Python host half *in this process* with a
small façade (harness.define_tool / register_tool / handle, ctx.effect / provide / tools,
`inject`), and behaves like a plugin host towards Cordis: registrations after the start,
`ActivationFailed` with the real phases and texts, calls that honour the abort signal,
and a retract that settles in-flight calls and disposes effects in reverse order before it
returns. Not a sandbox: the real plugin hosts (runtime side) are tested by their own suite.

Every step is appended to `InProcessHosts.log`, so tests can assert ordering (quiescence)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.plugin_hosts import (
    ActivationFailed,
    ActivationSpec,
    DynamicToolSpec,
    HandlerFailed,
    HostEvents,
    HostRegistrations,
    ServiceSpec,
)
from registry_service.domain.signals import AbortSignal

_MARK = object()


@dataclass
class _Tool:
    spec: DynamicToolSpec
    execute: Callable[[Any], Awaitable[Any]]
    mark: object = _MARK


@dataclass
class Probe:
    """Shared between a test and its host halves (the global `probe`)."""

    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())


class _Harness:
    def __init__(self, host: InProcessHost) -> None:
        self._host = host

    def define_tool(
        self,
        *,
        name: str,
        description: str,
        parameters: JsonValue,
        execute: Callable[[Any], Awaitable[Any]],
        output_schema: JsonValue = None,
    ) -> _Tool:
        return _Tool(DynamicToolSpec(name, description, parameters, output_schema), execute)

    def register_tool(self, tool: object) -> None:
        if not isinstance(tool, _Tool) or tool.mark is not _MARK:
            raise TypeError(
                "dynamic tool registration must use a tool returned by harness.define_tool(...)"
            )
        self._host.tools[tool.spec.name] = tool
        self._host.changed()

    def unregister_tool(self, name: str) -> None:  # test-only: a tool going away while running
        self._host.tools.pop(name, None)
        self._host.changed()

    def handle(self, method: str, fn: Callable[..., Any]) -> None:
        self._host.handlers[method] = fn
        self._host.changed()


class _Ctx:
    def __init__(self, host: InProcessHost) -> None:
        self._host = host

    def effect(self, fn: Callable[[], Callable[[], None] | None], label: str = "") -> None:
        disposer = fn()
        self._host.disposers.append((label, disposer))

    def provide(self, name: str, _service: object) -> None:
        self._host.provides.append(name)
        self._host.changed()

    def schemas(self) -> list[JsonValue]:
        return [
            {"name": name, "inputSchema": schema} for name, schema in self._host.spec.visible_tools
        ]


class InProcessHost:
    def __init__(self, hosts: InProcessHosts, spec: ActivationSpec, events: HostEvents) -> None:
        self.hosts = hosts
        self.spec = spec
        self.events = events
        self.tools: dict[str, _Tool] = {}
        self.handlers: dict[str, Callable[..., Any]] = {}
        self.provides: list[str] = []
        self.waiting_for: tuple[str, ...] = ()
        self.disposers: list[tuple[str, Callable[[], None] | None]] = []
        self.inflight: set[asyncio.Task[Any]] = set()
        self.settling: set[asyncio.Future[None]] = set()  # resolved once a call has settled
        self.started = False
        self.gone = False

    @property
    def registrations(self) -> HostRegistrations:
        return HostRegistrations(
            tools=tuple(t.spec for t in self.tools.values()),
            handlers=tuple(self.handlers),
            provides=tuple(self.provides),
            waiting_for=self.waiting_for,
        )

    def changed(self) -> None:
        if self.started and not self.gone:
            self.events.on_change(self.registrations)

    async def call_tool(self, name: str, arguments: JsonValue, signal: AbortSignal) -> JsonValue:
        log = self.hosts.log
        if self.gone:
            raise ToolCallFailure(f"plugin {self.spec.plugin_id} is not running", "PLUGIN_GONE")
        tool = self.tools.get(name)
        if tool is None:
            raise ToolCallFailure(f'unknown dynamic tool "{name}"', "UNKNOWN_TOOL")
        log.append(("call-start", self.spec.run_id, name))
        task = asyncio.ensure_future(tool.execute(arguments))
        self.inflight.add(task)
        settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.settling.add(settled)

        def cancel(_reason: str) -> None:
            task.cancel()

        remove = signal.add_listener(cancel)
        try:
            return await task  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            log.append(("call-cancelled", self.spec.run_id, name))
            if self.gone or signal.aborted:
                raise ToolCallFailure("the call was cancelled", "CANCELLED") from None
            raise
        except Exception as exc:
            raise ToolCallFailure(str(exc) or type(exc).__name__) from None
        finally:
            remove()
            self.inflight.discard(task)
            log.append(("call-settled", self.spec.run_id, name))
            self.settling.discard(settled)
            settled.set_result(None)

    async def call_service(
        self, service: str, method: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue:
        # Services between plugins are exercised with real plugin hosts (test_services.py).
        raise ToolCallFailure(f'service "{service}" is not modelled in process')

    def update_services(self, services: tuple[ServiceSpec, ...]) -> None:
        self.hosts.log.append(("services", self.spec.run_id, *(s.name for s in services)))

    def deliver_event(self, event: str, payload: JsonValue) -> None:
        self.hosts.log.append(("event", self.spec.run_id, event))

    async def call_handler(self, method: str, args: JsonValue) -> JsonValue:
        """A page's `invoke` of a `harness.handle` handler (sync or async)."""
        if self.gone:
            raise HandlerFailed(f"plugin {self.spec.plugin_id} is not running")
        handler = self.handlers.get(method)
        if handler is None:
            raise HandlerFailed(f'no handler "{method}"', not_found=True)
        self.hosts.log.append(("handler", self.spec.run_id, method))
        try:
            value = handler(args)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            raise HandlerFailed(f"{type(exc).__name__}: {exc}", "Traceback: (in-process)") from None
        return cast(JsonValue, value)

    async def retract(self) -> None:
        if self.gone:
            return
        self.gone = True
        log = self.hosts.log
        log.append(("retract-start", self.spec.run_id))
        for task in list(self.inflight):
            task.cancel()
        # Each in-flight call settles (its caller sees the failure) before anything is disposed.
        await asyncio.gather(*self.settling)
        for label, disposer in reversed(self.disposers):
            if disposer is not None:
                disposer()
            log.append(("dispose", self.spec.run_id, label))
        self.hosts.live.discard(self.spec.run_id)
        log.append(("retracted", self.spec.run_id))

    def crash(self, reason: str = "worker exited with code 137") -> None:
        """The plugin host dies on its own (a kill, an OOM)."""
        self.gone = True
        self.hosts.live.discard(self.spec.run_id)
        self.hosts.log.append(("lost", self.spec.run_id))
        self.events.on_lost(reason)


class InProcessHosts:
    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []
        self.live: set[str] = set()  # run ids whose host is up
        self.hosts: dict[str, InProcessHost] = {}  # by run id
        self.probe = Probe()
        self.activation_gate: asyncio.Event | None = None  # holds activations while unset
        self.max_live_per_plugin: dict[str, int] = {}

    async def activate(self, spec: ActivationSpec, events: HostEvents) -> InProcessHost:
        self.log.append(("activate", spec.run_id, spec.package_id))
        host = InProcessHost(self, spec, events)
        self.hosts[spec.run_id] = host
        self.live.add(spec.run_id)
        same_plugin = [r for r in self.live if self.hosts[r].spec.plugin_id == spec.plugin_id]
        self.max_live_per_plugin[spec.plugin_id] = max(
            self.max_live_per_plugin.get(spec.plugin_id, 0), len(same_plugin)
        )
        try:
            if self.activation_gate is not None:
                await self.activation_gate.wait()
            plugin = await self._load(host, spec)
            await self._apply(host, plugin)
        except ActivationFailed:
            host.gone = True
            self.live.discard(spec.run_id)
            self.log.append(("failed", spec.run_id))
            raise
        host.started = True
        self.log.append(("started", spec.run_id))
        return host

    async def _load(self, host: InProcessHost, spec: ActivationSpec) -> Any:
        body = "".join("    " + line for line in spec.source.splitlines(keepends=True))
        source = f"async def __cordis_host__():\n{body}\n    pass\n"
        namespace: dict[str, Any] = {"harness": _Harness(host), "probe": self.probe}
        try:
            exec(compile(source, f"cordis-dyn-{spec.plugin_id}.py", "exec"), namespace)
            plugin = await namespace["__cordis_host__"]()
        except SyntaxError as exc:
            raise ActivationFailed("host-load", f"SyntaxError: {exc.msg}") from None
        except Exception as exc:
            raise ActivationFailed("host-load", f"{type(exc).__name__}: {exc}") from None
        if plugin is None:
            raise ActivationFailed(
                "host-load", "the Host half returned `None` — did you forget `return`?"
            )
        if not callable(plugin) and not callable(getattr(plugin, "apply", None)):
            raise ActivationFailed(
                "host-load",
                "the Host half must return a Plugin function or an object with apply(ctx)",
            )
        return plugin

    async def _apply(self, host: InProcessHost, plugin: Any) -> None:
        inject = tuple(getattr(plugin, "inject", ()) or ())
        provided = {n for h in self.hosts.values() if not h.gone for n in h.provides}
        host.waiting_for = tuple(s for s in inject if s not in provided and s != "timer")
        if host.waiting_for:
            return  # parked: starts when its services appear (not modelled further here)
        apply = plugin if callable(plugin) else plugin.apply
        try:
            with contextlib.suppress(StopAsyncIteration):
                await asyncio.wait_for(apply(_Ctx(host)), host.spec.start_timeout_s)
        except Exception as exc:
            for _label, disposer in reversed(host.disposers):  # a failed start is disposed
                if disposer is not None:
                    disposer()
            raise ActivationFailed("host-apply", f"{type(exc).__name__}: {exc}") from None
