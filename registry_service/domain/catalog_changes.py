"""The catalog's durable changes: the rows a preset, an agent and a restriction are stored as,
and the change records the catalog emits through its port (`CatalogPort`) before it changes
itself. The store that writes them is `history.catalog_store.CatalogStore`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from registry_service.domain.mcp_attachments import McpAttachment
from registry_service.domain.scopes import Mode


@dataclass(frozen=True, slots=True)
class ScopeRow:
    """One preset (`presets/{id}`) or agent (`agents/{id}`) and what its scope declares."""

    name: str
    create_time: float
    mode: Mode | None = None  # None: not declared in this scope
    language: str | None = None
    self_modification: bool | None = None
    preset: str = ""  # an agent's parent preset; "" when unparented (and for presets)
    agent_id: str = ""  # an agent's stable identity; "" for presets
    mcp_servers: tuple[McpAttachment, ...] = ()  # fixed at creation

    @property
    def is_agent(self) -> bool:
        return self.name.startswith("agents/")


@dataclass(frozen=True, slots=True)
class RestrictionRow:
    scope: str
    restriction_id: str  # unique in the registry, never reused
    allow: tuple[str, ...] | None  # None: no allow list (an empty tuple allows nothing)
    deny: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class PutScope:
    """`create`: inserts the scope, a conflict when one of that name is stored. Else replaces
    the stored row of that name and agent id (its restrictions stay), a conflict when there is
    none (deleted, or deleted and re-created, by another registry)."""

    row: ScopeRow
    create: bool = False


@dataclass(frozen=True, slots=True)
class DeleteScope:
    """Deletes the scope of that name and agent id ("" for a preset) and its restrictions; a
    conflict when there is none."""

    name: str
    agent_id: str = ""


@dataclass(frozen=True, slots=True)
class PutRestriction:
    """Stores the restriction; a conflict when its scope is not stored."""

    row: RestrictionRow


@dataclass(frozen=True, slots=True)
class DeleteRestriction:
    """Deletes the restriction; a conflict when it is not stored."""

    scope: str
    restriction_id: str


class CatalogConflict(Exception):
    """The stored catalog is not what a change expects: another registry sharing the store
    changed `scope` first. Nothing of the change is stored."""

    def __init__(self, scope: str) -> None:
        super().__init__(f"{scope} was changed by another registry")
        self.scope = scope


@dataclass(frozen=True, slots=True)
class DeleteHistory:
    """Deletes every history record of an agent id, and the content they spilled."""

    agent_id: str


CatalogChange: TypeAlias = (
    PutScope | DeleteScope | PutRestriction | DeleteRestriction | DeleteHistory
)


def changed_scopes(changes: Sequence[CatalogChange]) -> set[str]:
    """The presets and agents whose stored form `changes` alter (what another registry
    reloads after them; a history deletion alters none)."""
    names: set[str] = set()
    for change in changes:
        if isinstance(change, PutScope | PutRestriction):
            names.add(change.row.name if isinstance(change, PutScope) else change.row.scope)
        elif isinstance(change, DeleteScope):
            names.add(change.name)
        elif isinstance(change, DeleteRestriction):
            names.add(change.scope)
    return names


# Told what another registry sharing the store changed: the scope names, or None when anything
# may have changed (too many to name, or notifications may have been missed).
CatalogFollower: TypeAlias = Callable[[Collection[str] | None], None]


@dataclass(frozen=True, slots=True)
class CatalogSnapshot:
    """What `load` returns: presets before agents (in name order), then restrictions."""

    scopes: Sequence[ScopeRow] = ()
    restrictions: Sequence[RestrictionRow] = ()
    # Agent name -> the id its records written before agents had ids were migrated to.
    legacy_agents: Mapping[str, str] = field(default_factory=dict)


class CatalogPort(Protocol):
    """Where the catalog writes its changes: one call per change, in one transaction, durable
    when it returns; a `CodemodeError` when it is not, a `CatalogConflict` when the stored
    catalog is not what the change expects (the catalog then stays as it was)."""

    async def apply(self, changes: Sequence[CatalogChange]) -> None: ...

    async def load_scopes(self, names: Collection[str] | None) -> CatalogSnapshot:
        """The stored rows and restrictions of the scopes named (a name not stored is
        absent; None: every scope), read in one snapshot."""
        ...


class InMemory:
    """No store: the catalog lives in process memory only."""

    async def apply(self, changes: Sequence[CatalogChange]) -> None:
        return None

    async def load_scopes(self, names: Collection[str] | None) -> CatalogSnapshot:
        return CatalogSnapshot()  # never asked: nothing else changes a memory-only catalog
