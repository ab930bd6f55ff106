"""Where Cordis keeps what defines a plugin (docs/cordis.md, "Durability"): the port the runner
writes through, the rows it is stored as, and the in-memory store used when the registry has
no durable store.

The contract every store keeps (tests/registry/history/test_cordis_conformance.py runs it
against SQLite and PostgreSQL):

- Records, not snapshots: a plugin row (owner, `current`/`next`, the any-version grant and a
  revision), its packages (immutable, in define order) and its package grants. Each write
  touches one plugin's records in one transaction, so registries sharing the store never
  overwrite each other's plugins.
- `next_id` hands out the next number of a kind from a counter row, in its own transaction:
  no number is handed out twice, whichever registry asks.
- A package is written once: writing its id again with the same content does nothing, with
  other content raises `PackageImmutable` and stores nothing.
- `set_pointers` names the revision it read: when the stored one differs (another registry
  moved the pointers first) or the plugin is gone it raises `StaleWrite` and stores nothing;
  else it stores revision + 1 and returns it.
- `follow` tells a registry, on its event loop and once committed, which plugins other
  registries changed (never its own changes), or None when it may have missed some (reload
  everything). A store only one registry can open (SQLite) never calls its followers.
- Every operation raises `CodemodeError` (`HISTORY_UNAVAILABLE` or `HISTORY_CORRUPT`: it is the
  history's database) when the backend fails, and then stores nothing.

Runs, attempts, pending run requests and plugin hosts are not stored: they live in the registry
that started them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from registry_service.domain.cordis.model import Package

# The kinds of ids, each with its own counter (plugins: one counter shared by every prefix).
ID_KINDS = ("plugins", "packages", "runs", "approvals", "inspects")


@dataclass(frozen=True, slots=True)
class PluginRow:
    plugin_id: str
    owner: str  # agents/{id}
    owner_id: str  # the owner's stable agent id
    current: str | None = None
    next: str | None = None
    any_version_approved: bool = False  # `approve_future_versions` was granted
    revision: int = 1


@dataclass(frozen=True, slots=True)
class PackageRow:
    plugin_id: str
    package: Package


@dataclass(frozen=True, slots=True)
class CordisSnapshot:
    """What `load` returns: plugins in id order, packages in define order, then grants."""

    plugins: Sequence[PluginRow] = ()
    packages: Sequence[PackageRow] = ()
    grants: Sequence[tuple[str, str]] = ()  # (plugin id, package id)


class StaleWrite(Exception):
    """The stored plugin is not what the write expects: another registry changed it first (or
    removed it). Nothing of the write is stored."""

    def __init__(self, plugin_id: str) -> None:
        super().__init__(f"dynamic plugin {plugin_id} was changed by another registry")
        self.plugin_id = plugin_id


class PackageImmutable(Exception):
    """A package id written again with other content: packages never change."""

    def __init__(self, package_id: str) -> None:
        super().__init__(
            f"package {package_id} is stored with other content; packages are immutable"
        )
        self.package_id = package_id


# Told which plugins another registry changed (None: anything may have changed).
CordisFollower: TypeAlias = Callable[[Collection[str] | None], None]


class CordisStore(Protocol):
    async def next_id(self, kind: str) -> int:
        """The next number of `kind` (one of ID_KINDS), never handed out before."""
        ...

    async def raise_ids(self, counters: Mapping[str, int]) -> None:
        """Makes every counter at least the value given (a legacy snapshot's counters)."""
        ...

    async def load(self, plugin_ids: Collection[str] | None = None) -> CordisSnapshot:
        """The stored records of the plugins named (None: every plugin), in one snapshot."""
        ...

    async def create_plugin(self, row: PluginRow, first: Package) -> None:
        """Stores a new plugin with its first package; `StaleWrite` when the id is taken."""
        ...

    async def add_package(self, plugin_id: str, package: Package) -> None:
        """Appends a package; `StaleWrite` when the plugin is gone, `PackageImmutable` when
        the id is stored with other content."""
        ...

    async def set_pointers(
        self, plugin_id: str, current: str | None, next_: str | None, *, revision: int
    ) -> int:
        """Stores the pointers if the stored revision is `revision`; returns the new one."""
        ...

    async def grant(self, plugin_id: str, package_id: str, *, any_version: bool) -> None:
        """Records the grant of a package (and of any version, when `any_version`); grants
        only ever add. `StaleWrite` when the plugin is gone."""
        ...

    async def delete_plugin(self, plugin_id: str) -> None:
        """Forgets the plugin with its packages and grants (nothing when it is gone)."""
        ...

    async def take_legacy(self) -> str | None:
        """The whole-state snapshot an older registry saved (`cordis_durable` before records),
        removed in the same transaction, so only one registry imports it; None: none."""
        ...

    def follow(self, changed: CordisFollower) -> None:
        """Calls `changed` with what other registries sharing the store change."""
        ...


@dataclass
class MemoryCordisStore:
    """No durable store: the records live in this process only (and go with it)."""

    _last: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ID_KINDS, 0))
    _plugins: dict[str, PluginRow] = field(default_factory=dict)
    _packages: dict[str, PackageRow] = field(default_factory=dict)
    _grants: set[tuple[str, str]] = field(default_factory=set)

    async def next_id(self, kind: str) -> int:
        self._last[kind] += 1
        return self._last[kind]

    async def raise_ids(self, counters: Mapping[str, int]) -> None:
        for kind, last in counters.items():
            self._last[kind] = max(self._last.get(kind, 0), last)

    async def load(self, plugin_ids: Collection[str] | None = None) -> CordisSnapshot:
        def wanted(plugin_id: str) -> bool:
            return plugin_ids is None or plugin_id in plugin_ids

        return CordisSnapshot(
            [row for pid, row in sorted(self._plugins.items()) if wanted(pid)],
            [row for row in self._packages.values() if wanted(row.plugin_id)],
            sorted(g for g in self._grants if wanted(g[0])),
        )

    async def create_plugin(self, row: PluginRow, first: Package) -> None:
        if row.plugin_id in self._plugins:
            raise StaleWrite(row.plugin_id)
        self._plugins[row.plugin_id] = row
        self._packages[first.package_id] = PackageRow(row.plugin_id, first)

    async def add_package(self, plugin_id: str, package: Package) -> None:
        if plugin_id not in self._plugins:
            raise StaleWrite(plugin_id)
        stored = self._packages.get(package.package_id)
        if stored is not None:
            if stored != PackageRow(plugin_id, package):
                raise PackageImmutable(package.package_id)
            return
        self._packages[package.package_id] = PackageRow(plugin_id, package)

    async def set_pointers(
        self, plugin_id: str, current: str | None, next_: str | None, *, revision: int
    ) -> int:
        row = self._plugins.get(plugin_id)
        if row is None or row.revision != revision:
            raise StaleWrite(plugin_id)
        self._plugins[plugin_id] = dataclasses.replace(
            row, current=current, next=next_, revision=revision + 1
        )
        return revision + 1

    async def grant(self, plugin_id: str, package_id: str, *, any_version: bool) -> None:
        row = self._plugins.get(plugin_id)
        if row is None:
            raise StaleWrite(plugin_id)
        self._grants.add((plugin_id, package_id))
        if any_version:
            self._plugins[plugin_id] = dataclasses.replace(row, any_version_approved=True)

    async def delete_plugin(self, plugin_id: str) -> None:
        self._plugins.pop(plugin_id, None)
        for package_id in [k for k, r in self._packages.items() if r.plugin_id == plugin_id]:
            del self._packages[package_id]
        self._grants = {g for g in self._grants if g[0] != plugin_id}

    async def take_legacy(self) -> str | None:
        return None

    def follow(self, changed: CordisFollower) -> None:
        return None  # nothing else changes this process's memory
