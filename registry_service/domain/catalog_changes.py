"""The catalog's durable changes: the rows a preset, an agent and a restriction are stored as,
and the change records the catalog emits through its port (`CatalogPort`) before it changes
itself. The store that writes them is `history.catalog_store.CatalogStore`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

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
    """Inserts the scope, or replaces the stored row of that name (its restrictions stay)."""

    row: ScopeRow


@dataclass(frozen=True, slots=True)
class DeleteScope:
    """Deletes the scope and its restrictions."""

    name: str


@dataclass(frozen=True, slots=True)
class PutRestriction:
    row: RestrictionRow


@dataclass(frozen=True, slots=True)
class DeleteRestriction:
    scope: str
    restriction_id: str


@dataclass(frozen=True, slots=True)
class DeleteHistory:
    """Deletes every history record of an agent id, and the content they spilled."""

    agent_id: str


CatalogChange: TypeAlias = (
    PutScope | DeleteScope | PutRestriction | DeleteRestriction | DeleteHistory
)


@dataclass(frozen=True, slots=True)
class CatalogSnapshot:
    """What `load` returns: presets before agents (in name order), then restrictions."""

    scopes: Sequence[ScopeRow] = ()
    restrictions: Sequence[RestrictionRow] = ()
    # Agent name -> the id its records written before agents had ids were migrated to.
    legacy_agents: Mapping[str, str] = field(default_factory=dict)


class CatalogPort(Protocol):
    """Where the catalog writes its changes: one call per change, in one transaction, durable
    when it returns; a `CodemodeError` when it is not (the catalog then stays as it was)."""

    async def apply(self, changes: Sequence[CatalogChange]) -> None: ...


class InMemory:
    """No store: the catalog lives in process memory only."""

    async def apply(self, changes: Sequence[CatalogChange]) -> None:
        return None
