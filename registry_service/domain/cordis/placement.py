"""Where a running plugin's host lives when registries share one store (docs/cordis.md,
"Registries sharing one store"): in the registry that holds the plugin's host lease
(`host_leases`). The others see the plugin's run as a `RemoteHost`: its registrations come from
following the owner (`Peers.follow`), and the calls of its tools, services and handlers that
passed their own pipeline are forwarded to the owner (`Peers.call_*`).

No transport here: `Peers` is the port the registry's peer client implements (over the
authenticated `CordisPeerService`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from codemode_common.principals import Principal
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.cordis.host_leases import HostLeases
from registry_service.domain.plugin_hosts import (
    DynamicToolSpec,
    HandlerFailed,
    HostRegistrations,
    ServiceSpec,
)
from registry_service.domain.results import ToolResult
from registry_service.domain.signals import AbortSignal

__all__ = [
    "OWNER_LOST",
    "HostPlacement",
    "OwnerLost",
    "Peers",
    "RemoteHost",
    "RemoteRun",
    "RunAt",
    "registrations_from_json",
    "registrations_to_json",
]

# The code of a forwarded call whose owner was lost while it ran (or could not be reached): the
# call's outcome is unknown, so it is not retried; the agent may call again once a survivor has
# taken the plugin over.
OWNER_LOST = "ABORTED"


T = TypeVar("T")


class OwnerLost(Exception):
    """The registry running the plugin's host could not be reached, or went away mid-call."""


@dataclass(frozen=True, slots=True)
class RemoteRun:
    """A plugin's run in its owner, as the owner reports it."""

    run_id: str
    package_id: str
    epoch: int
    registrations: HostRegistrations
    principal: Principal


@dataclass(frozen=True, slots=True)
class RunAt:
    """A plugin's run in the registry at a peer address."""

    address: str
    plugin_id: str
    run_id: str


class Peers(Protocol):
    """Another registry's plugin runs, at its peer address."""

    def follow(self, address: str, plugin_id: str) -> AsyncIterator[RemoteRun]:
        """The plugin's run there, then each change; ends when the run ends there; raises
        `OwnerLost` when the owner cannot be reached or goes away."""
        ...

    async def call_tool(
        self, run: RunAt, name: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue | ToolResult:
        """`ToolCallFailure` as the owner's host raised it; `OwnerLost`."""
        ...

    async def call_service(
        self, run: RunAt, service: str, method: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue: ...

    async def call_handler(self, run: RunAt, method: str, arguments: JsonValue) -> JsonValue:
        """`HandlerFailed` as the owner's host raised it; `OwnerLost`."""
        ...

    async def stop(self, run: RunAt) -> bool:
        """Retracts the run there (returns once quiescent); `OwnerLost`."""
        ...

    async def close(self) -> None: ...


@dataclass
class HostPlacement:
    """This registry among the registries sharing the store."""

    leases: HostLeases
    peers: Peers
    instance: str  # this registry process (its host leases name it)
    lease_s: float  # cordis_host_lease_s
    address: str = ""  # where this registry's peer service answers (set once it listens)


class RemoteHost:
    """A plugin's run in another registry (its owner), seen from here: an `ActiveHost` whose
    calls go to the owner. Retracting it here only forgets it (`stop` retracts it there): its
    calls still in flight fail `OWNER_LOST` then, since this registry forgets a remote run
    when its owner is lost (its follow stream broke, or its lease expired) and an owner that
    vanished without a word may never answer them."""

    def __init__(self, peers: Peers, address: str, plugin_id: str, run: RemoteRun) -> None:
        self.peers = peers
        self.address = address
        self.plugin_id = plugin_id
        self.run = run
        self._inflight: set[asyncio.Future[Any]] = set()
        self._forgotten = False

    async def _forward(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, unless this run is forgotten first (then `OwnerLost`)."""
        if self._forgotten:
            raise OwnerLost("the run was forgotten here")
        inner = asyncio.ensure_future(call())
        self._inflight.add(inner)
        try:
            return await inner
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._forgotten and inner.cancelled() and (task is None or not task.cancelling()):
                raise OwnerLost("the run was forgotten here") from None
            raise
        finally:
            self._inflight.discard(inner)

    @property
    def registrations(self) -> HostRegistrations:
        return self.run.registrations

    @property
    def _at(self) -> RunAt:
        return RunAt(self.address, self.plugin_id, self.run.run_id)

    def _lost(self, what: str) -> str:
        return (
            f"{what} of dynamic plugin {self.plugin_id} was lost with the registry running its "
            f"host ({self.address}); its outcome is unknown. Another registry takes the plugin "
            "over once that registry's lease expires; call again then."
        )

    async def call_tool(
        self, name: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue | ToolResult:
        try:
            at = self._at
            return await self._forward(lambda: self.peers.call_tool(at, name, arguments, signal))
        except OwnerLost:
            raise ToolCallFailure(self._lost(f'the call of tool "{name}"'), OWNER_LOST) from None

    async def call_service(
        self, service: str, method: str, arguments: JsonValue, signal: AbortSignal
    ) -> JsonValue:
        try:
            at = self._at
            return await self._forward(
                lambda: self.peers.call_service(at, service, method, arguments, signal)
            )
        except OwnerLost:
            raise ToolCallFailure(
                self._lost(f'the call of service "{service}".{method}'), OWNER_LOST
            ) from None

    def update_services(self, services: tuple[ServiceSpec, ...]) -> None:
        """The owner tells its own runs."""

    def deliver_event(self, event: str, payload: JsonValue) -> None:
        """The owner delivers its runs' events (it follows the same history)."""

    async def call_handler(self, method: str, args: JsonValue) -> JsonValue:
        try:
            at = self._at
            return await self._forward(lambda: self.peers.call_handler(at, method, args))
        except OwnerLost:
            raise HandlerFailed(self._lost(f'the call of handler "{method}"')) from None

    async def retract(self) -> None:
        """Forgets the run here (the owner keeps running it); calls in flight fail."""
        self._forgotten = True
        for call in list(self._inflight):
            call.cancel()

    async def stop(self) -> None:
        """Retracts the run in its owner (an owner already gone has nothing left to stop)."""
        with contextlib.suppress(OwnerLost):
            await self.peers.stop(self._at)


def registrations_to_json(registrations: HostRegistrations) -> dict[str, JsonValue]:
    tools: list[JsonValue] = []
    for spec in registrations.tools:
        tool: dict[str, JsonValue] = {
            "name": spec.name,
            "description": spec.description,
            "inputSchema": spec.input_schema,
        }
        if spec.output_schema is not None:
            tool["outputSchema"] = spec.output_schema
        tools.append(tool)
    return {
        "tools": tools,
        "handlers": list(registrations.handlers),
        "provides": list(registrations.provides),
        "waitingFor": list(registrations.waiting_for),
        "services": [
            {"name": s.name, "methods": list(s.methods), "dataJson": s.data_json}
            for s in registrations.services
        ],
        "events": list(registrations.events),
    }


def registrations_from_json(value: JsonValue) -> HostRegistrations:
    """Raises ValueError (or TypeError, KeyError) when `value` is not such an object."""
    if not isinstance(value, dict):
        raise ValueError("registrations must be an object")

    def names(key: str) -> tuple[str, ...]:
        items = value.get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"registrations.{key} must be a list of strings")
        return tuple(str(i) for i in items)

    tools: list[DynamicToolSpec] = []
    for tool in value.get("tools", []) or []:  # type: ignore[union-attr]
        if not isinstance(tool, dict):
            raise ValueError("a registered tool must be an object")
        tools.append(
            DynamicToolSpec(
                str(tool["name"]),
                str(tool.get("description", "")),
                tool.get("inputSchema"),
                tool.get("outputSchema"),
            )
        )
    services: list[ServiceSpec] = []
    for service in value.get("services", []) or []:  # type: ignore[union-attr]
        if not isinstance(service, dict):
            raise ValueError("a service must be an object")
        methods = service.get("methods", [])
        if not isinstance(methods, list):
            raise ValueError("a service's methods must be a list")
        services.append(
            ServiceSpec(
                str(service["name"]),
                tuple(str(m) for m in methods),
                str(service.get("dataJson", "")),
            )
        )
    return HostRegistrations(
        tools=tuple(tools),
        handlers=names("handlers"),
        provides=names("provides"),
        waiting_for=names("waitingFor"),
        services=tuple(services),
        events=names("events"),
    )
