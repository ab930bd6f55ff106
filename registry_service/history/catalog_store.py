"""The catalog store interface: presets and agents declared over the API, kept with the history.

A backend that provides a `HistoryStore` provides a `CatalogStore` on the same database (both are
opened together by `history.stores.open_store`). The contract:

- `load` returns everything stored, once, at start: the catalog is rebuilt from it before any
  call (settings-declared scopes are merged over it by the registry, not by the store).
- `apply` writes one change (a list of rows) in one transaction, all or nothing, and returns only
  once it is durable; on failure it raises `CodemodeError` (`HISTORY_UNAVAILABLE` or
  `HISTORY_CORRUPT`, the history store's codes: it is the same database) and nothing of the
  change is stored. Changes are row-level: no change rewrites the whole catalog.
- Changes say what they expect to find (a name not stored yet, a scope with this agent id, a
  restriction): when the store holds otherwise, `apply` raises `CatalogConflict` (another
  registry changed that scope first) and stores nothing.
- Tools are not stored (they belong to their provider's stream), nor are policy hooks (they
  come from settings and plugins at start).
- An agent's `agent_id` is never reused: the catalog draws a random 128-bit id per agent. History
  is keyed by it (`Record.agent_id`), so a re-created name starts an empty history.
- `DeleteHistory` deletes every record (and spilled content) of one agent id, in the same
  transaction as the rest of its change.
- Several registries may share one store (PostgreSQL): `follow` tells a registry, on its event
  loop and once committed, the scopes the others changed (never its own changes), or None when
  it may have missed some (anything may have changed: reload everything); `load_scopes` reads
  what they are now. A store only one registry can open (SQLite) never calls its followers.
- Records written before agents had ids (keyed by name) are migrated at start under a new id per
  name; until an agent claims it, such an id is listed in `CatalogSnapshot.legacy_agents`. A
  `PutScope` of an agent whose `agent_id` is a legacy one claims it (it is no longer listed).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from registry_service.domain.catalog_changes import (
    CatalogChange,
    CatalogConflict,
    CatalogFollower,
    CatalogPort,
    CatalogSnapshot,
    DeleteHistory,
    DeleteRestriction,
    DeleteScope,
    PutRestriction,
    PutScope,
    RestrictionRow,
    ScopeRow,
    changed_scopes,
)

__all__ = [
    "CatalogChange",
    "CatalogConflict",
    "CatalogFollower",
    "CatalogSnapshot",
    "CatalogStore",
    "DeleteHistory",
    "DeleteRestriction",
    "DeleteScope",
    "PutRestriction",
    "PutScope",
    "RestrictionRow",
    "ScopeRow",
    "changed_scopes",
]


class CatalogStore(CatalogPort, Protocol):
    """Durable presets, agents and their declarations. Every operation raises `CodemodeError`
    (never a driver's own exception) when the backend fails."""

    async def load(self) -> CatalogSnapshot:
        """Everything stored (called once, at start)."""
        ...

    async def apply(self, changes: Sequence[CatalogChange]) -> None:
        """Writes `changes` in one transaction, in order; returns once they are durable."""
        ...

    async def load_scopes(self, names: Collection[str] | None) -> CatalogSnapshot:
        """The stored rows and restrictions of the scopes named (None: all), in one snapshot."""
        ...

    def follow(self, changed: CatalogFollower) -> None:
        """Calls `changed` with what other registries sharing the store change (see above)."""
        ...
