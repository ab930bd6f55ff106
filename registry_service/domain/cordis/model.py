"""The state Cordis keeps per plugin and the JSON views the tools return.

A plugin owns immutable packages in define order and two pointers: `current` (the last fully
successful activation; never cleared by stop, an update's start or its failure) and `next` (the
target in flight or most recently failed; cleared on commit). `run` is the one physical
activation, `latest` the record of the last attempt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from codemode_common.principals import ANONYMOUS, Principal
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.plugin_hosts import ActiveHost, HostRegistrations
from registry_service.domain.tools import ToolDefinition

Mode = Literal["run", "update"]
AttemptStatus = Literal[
    "awaiting-approval",
    "starting-host",
    "client-pending",
    "running",
    "waiting",
    "rejected",
    "failed",
    "cancelled",
    "stopped",
]
HalfStatus = Literal["absent", "pending", "stopped", "running", "waiting", "failed"]
Phase = Literal[
    "approval", "host-load", "host-apply", "client-load", "client-apply", "client-render"
]


@dataclass(frozen=True, slots=True)
class Diagnostic:
    phase: Phase
    message: str
    plugin_id: str
    package_id: str
    run_id: str
    stack: str = ""

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"phase": self.phase, "message": self.message}
        if self.stack:
            out["stack"] = self.stack
        out.update(pluginId=self.plugin_id, packageId=self.package_id, pluginRunId=self.run_id)
        return out


@dataclass(slots=True)
class HalfState:
    status: HalfStatus
    waiting_for: tuple[str, ...] = ()
    error: Diagnostic | None = None

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"status": self.status, "waitingFor": list(self.waiting_for)}
        if self.error is not None:
            out["error"] = self.error.to_json()
        return out


@dataclass(frozen=True, slots=True)
class Package:
    package_id: str
    name: str
    purpose: str
    host: str | None
    client: str | None

    @property
    def has_host(self) -> bool:
        return self.host is not None

    @property
    def has_client(self) -> bool:
        return self.client is not None

    def code_json(self) -> dict[str, JsonValue]:
        code: dict[str, JsonValue] = {}
        if self.host is not None:
            code["host"] = self.host
        if self.client is not None:
            code["client"] = self.client
        return code


@dataclass(slots=True)
class Attempt:
    """One `run-<n>` activation attempt (every attempt, retries included)."""

    run_id: str
    package_id: str
    mode: Mode
    status: AttemptStatus
    host: HalfState
    client: HalfState
    error: Diagnostic | None = None
    # Who started it (a `cordis_run` caller, or a panel's page runner): its plugin host acts
    # as them (domain/tool_access.py). Not durable: runs are not restarted.
    principal: Principal = ANONYMOUS

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {
            "pluginRunId": self.run_id,
            "packageId": self.package_id,
            "mode": self.mode,
            "status": self.status,
            "host": self.host.to_json(),
            "client": self.client.to_json(),
        }
        if self.error is not None:
            out["error"] = self.error.to_json()
        return out


@dataclass(slots=True)
class ActiveRun:
    """The one physical activation of a plugin."""

    run_id: str
    package_id: str
    host: ActiveHost | None
    registrations: HostRegistrations = field(default_factory=HostRegistrations)
    # The catalog entries its dynamic tools hold in the owner's scope, by name.
    tools: dict[str, ToolDefinition] = field(default_factory=dict)
    # The last render failure a page reported for this run (gone with the run).
    render_failure: Diagnostic | None = None


@dataclass(slots=True)
class Plugin:
    plugin_id: str
    owner: str  # agents/{id}
    packages: dict[str, Package] = field(default_factory=dict)  # define order
    current: str | None = None
    next: str | None = None
    run: ActiveRun | None = None
    latest: Attempt | None = None
    starting: bool = False  # a start is in flight (`transition-in-flight`)
    # Grants for client halves (recorded when a page runs a request or a panel gesture).
    approved_client_packages: set[str] = field(default_factory=set)
    client_version_updates_approved: bool = False
    # The owner's stable agent id: a plugin belongs to that agent, not to a later one of the
    # same name ("" in a snapshot from before agents had ids: adopted at start).
    owner_id: str = ""
    # The stored revision of its pointers this registry last read or wrote (a pointer write
    # names it: domain/cordis/state.py).
    revision: int = 0

    @property
    def last_package(self) -> Package:
        return next(reversed(self.packages.values()))

    @property
    def name(self) -> str:
        base = self.packages.get(self.base_package_id)
        return (base or self.last_package).name

    @property
    def base_package_id(self) -> str:
        """The package a modification starts from: next, else current, else the last defined."""
        return self.next or self.current or self.last_package.package_id

    def state(self) -> str:
        """`defined|awaiting-approval|client-pending|stopped|running|waiting|failed`."""
        status = self.latest.status if self.latest is not None else None
        if status == "awaiting-approval":
            return "awaiting-approval"
        if status in ("client-pending", "starting-host"):
            return "client-pending"
        if status in ("failed", "rejected", "cancelled"):
            return "failed"
        if status in ("waiting", "running"):
            return status
        if self.run is not None:  # (a run another registry started: its registrations say)
            return "waiting" if self.run.registrations.waiting else "running"
        return "defined" if self.current is None else "stopped"

    def _pointers(self) -> dict[str, JsonValue]:
        """current / next / the active run, those that are set (summaries and references)."""
        out: dict[str, JsonValue] = {}
        if self.current is not None:
            out["currentPackageId"] = self.current
        if self.next is not None:
            out["nextPackageId"] = self.next
        if self.run is not None:
            out["activeRun"] = {"pluginRunId": self.run.run_id, "packageId": self.run.package_id}
        return out

    def summary(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {
            "pluginId": self.plugin_id,
            "name": self.name,
            "packageCount": len(self.packages),
            "state": self.state(),
        }
        out.update(self._pointers())
        if self.latest is not None and self.latest.status == "awaiting-approval":
            out["pendingApproval"] = {
                "pluginRunId": self.latest.run_id,
                "packageId": self.latest.package_id,
                "mode": self.latest.mode,
            }
        return out

    def reference(self) -> dict[str, JsonValue]:
        """The source-free reference an `@pluginId` mention resolves to."""
        base = self.packages[self.base_package_id]
        out: dict[str, JsonValue] = {
            "pluginId": self.plugin_id,
            "packageId": base.package_id,
            "name": base.name,
            "purpose": base.purpose,
        }
        out.update(self._pointers())
        if self.latest is not None:
            out["latestRun"] = self.latest.to_json()
        return out

    def plugin_view(self) -> dict[str, JsonValue]:
        """`cordis_inspect_self` with a plugin id: summary, then every package's metadata."""
        out: dict[str, JsonValue] = {"mode": "plugin", **self.summary()}
        out["packages"] = [
            {
                "packageId": pkg.package_id,
                "name": pkg.name,
                "purpose": pkg.purpose,
                "hasHostHalf": pkg.has_host,
                "hasClientHalf": pkg.has_client,
                "isCurrent": pkg.package_id == self.current,
                "isNext": pkg.package_id == self.next,
            }
            for pkg in self.packages.values()
        ]
        return out

    def package_view(self, package_id: str) -> dict[str, JsonValue]:
        """`cordis_inspect_self` with both ids: the exact source and its runtime diagnostics."""
        pkg = self.packages[package_id]
        active = self.run if self.run is not None and self.run.package_id == package_id else None
        latest = (
            self.latest
            if self.latest is not None and self.latest.package_id == package_id
            else None
        )
        host: dict[str, JsonValue]
        if latest is not None and pkg.has_host:
            host = latest.host.to_json()
        elif not pkg.has_host:
            host = {"status": "absent", "waitingFor": []}
        else:
            host = {"status": "stopped" if active is None else "running", "waitingFor": []}
        registrations = active.registrations if active is not None else HostRegistrations()
        host["provides"] = list(registrations.provides)
        host["handlers"] = list(registrations.handlers)
        if active is not None:
            host["waitingFor"] = list(registrations.waiting_for)
        if latest is not None and pkg.has_client:
            client = latest.client.to_json()
        else:
            client = {"status": "stopped" if pkg.has_client else "absent", "waitingFor": []}
        if active is not None and active.render_failure is not None:
            client["renderFailure"] = active.render_failure.to_json()
        return {
            "mode": "package",
            "plugin": self.summary(),
            "packageId": package_id,
            "name": pkg.name,
            "purpose": pkg.purpose,
            "code": pkg.code_json(),
            "runtime": {
                "state": self.state(),
                "host": _ordered(host, ("status", "provides", "waitingFor", "handlers", "error")),
                "client": client,
            },
        }


def _ordered(values: dict[str, JsonValue], keys: tuple[str, ...]) -> dict[str, JsonValue]:
    return {key: values[key] for key in keys if key in values}
