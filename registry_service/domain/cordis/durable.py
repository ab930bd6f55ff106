"""Durable Cordis state (docs/cordis.md, "Durability").

By default Cordis state lives in process memory. With the `cordis_durable`
setting the registry keeps what defines a plugin in its store: plugins with their owners,
packages (immutable source) in define order, grants, the `current`/`next` pointers and the id
counters (so no id is handed out twice across a restart). Runs are not: a restart leaves every
plugin without a run (`stopped` with a current package, `defined` without), and `cordis_run`
reactivates it.

The state is small and written as one JSON snapshot after each change; writes are coalesced
(the newest snapshot wins) and never block a tool call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol, cast

from codemode_wire import jsonvalue
from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.cordis.ids import Ids
from registry_service.domain.cordis.model import Package, Plugin

log = logging.getLogger(__name__)

VERSION = 1


class CordisStateStore(Protocol):
    """Where the snapshot lives (the registry's SQLite database implements it)."""

    def load(self) -> str | None:
        """The last saved snapshot (JSON text), None when there is none. Called once, at
        start, before any call."""
        ...

    async def save(self, body: str) -> None:
        """Durably replaces the snapshot; raises `CodemodeError` when the store fails."""
        ...

    async def close(self) -> None: ...


def snapshot(plugins: Iterable[Plugin], ids: Ids) -> str:
    body: dict[str, JsonValue] = {
        "version": VERSION,
        "counters": cast("dict[str, JsonValue]", ids.counters()),
        "plugins": [
            {
                "pluginId": p.plugin_id,
                "owner": p.owner,
                "ownerId": p.owner_id,
                "packages": [_package_json(pkg) for pkg in p.packages.values()],
                "current": p.current,
                "next": p.next,
                "approvedClientPackages": list[JsonValue](sorted(p.approved_client_packages)),
                "clientVersionUpdatesApproved": p.client_version_updates_approved,
            }
            for p in plugins
        ],
    }
    return jsonvalue.dumps(body)


def restore(body: str, ids: Ids) -> list[Plugin]:
    """The plugins of a snapshot (without runs); the counters go into `ids`."""
    data = cast("dict[str, object]", jsonvalue.loads(body))
    if data.get("version") != VERSION:
        raise ValueError(f"unknown Cordis state version {data.get('version')!r}")
    ids.restore(cast("dict[str, int]", data.get("counters", {})))
    plugins: list[Plugin] = []
    for raw in cast("list[dict[str, object]]", data.get("plugins", [])):
        plugin = Plugin(
            str(raw["pluginId"]), str(raw["owner"]), owner_id=str(raw.get("ownerId", ""))
        )
        for pkg in cast("list[dict[str, object]]", raw.get("packages", [])):
            package = Package(
                str(pkg["packageId"]),
                str(pkg["name"]),
                str(pkg["purpose"]),
                cast("str | None", pkg.get("host")),
                cast("str | None", pkg.get("client")),
            )
            plugin.packages[package.package_id] = package
        plugin.current = cast("str | None", raw.get("current"))
        plugin.next = cast("str | None", raw.get("next"))
        plugin.approved_client_packages = set(
            cast("list[str]", raw.get("approvedClientPackages", []))
        )
        plugin.client_version_updates_approved = bool(raw.get("clientVersionUpdatesApproved"))
        if plugin.packages:
            plugins.append(plugin)
    return plugins


def _package_json(pkg: Package) -> dict[str, JsonValue]:
    out: dict[str, JsonValue] = {
        "packageId": pkg.package_id,
        "name": pkg.name,
        "purpose": pkg.purpose,
    }
    if pkg.host is not None:
        out["host"] = pkg.host
    if pkg.client is not None:
        out["client"] = pkg.client
    return out


class Persistence:
    """Saves the snapshot after changes: one write at a time, the newest state wins."""

    def __init__(self, store: CordisStateStore, take: Callable[[], str]) -> None:
        self._store = store
        self._take = take
        self._dirty = False
        self._writer: asyncio.Task[None] | None = None

    def changed(self) -> None:
        self._dirty = True
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        while self._dirty:
            self._dirty = False
            try:
                await self._store.save(self._take())
            except CodemodeError as exc:  # kept in memory; the next change tries again
                log.error("cordis: the durable state was not saved: %s", exc.message)
            except Exception:
                log.exception("cordis: the durable state was not saved")

    async def close(self) -> None:
        """Writes what changed last, then closes the store."""
        if self._writer is not None:
            await self._writer
        await self._store.close()
