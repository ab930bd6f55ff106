"""The PostgreSQL catalog store: presets, agents and restrictions in the history database.

It reads and writes through the history store's read connection (one change = one transaction
there, all or nothing), so a catalog change never waits inside a history batch, and a failure
is reported through the history's health: one database, one health."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, assert_never

import psycopg
from psycopg.types.json import Jsonb

from registry_service.domain.scopes import Mode
from registry_service.history.catalog_store import (
    CatalogChange,
    CatalogSnapshot,
    DeleteHistory,
    DeleteRestriction,
    DeleteScope,
    PutRestriction,
    PutScope,
    RestrictionRow,
    ScopeRow,
)

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

# One agent id's records, what they spilled and its open calls (DeleteHistory).
DELETE_AGENT_HISTORY = (
    "DELETE FROM history_spills WHERE id IN"
    " (SELECT spill_id FROM history_records WHERE agent_id = %s AND spill_id IS NOT NULL)",
    "DELETE FROM history_records WHERE agent_id = %s",
    "DELETE FROM history_open_calls WHERE agent_id = %s",
)


class PostgresCatalog:
    def __init__(self, connection: Callable[[], AbstractAsyncContextManager[Conn]]) -> None:
        self._connection = connection  # the history's reads: its lock, errors and health

    async def load(self) -> CatalogSnapshot:
        async with self._connection() as conn:
            scopes = await (
                await conn.execute(
                    "SELECT name, create_time, mode, language, self_modification, preset,"
                    " agent_id FROM catalog_scopes ORDER BY name LIKE 'agents/%%', name"
                )
            ).fetchall()
            restrictions = await (
                await conn.execute(
                    "SELECT scope, restriction_id, allow, deny FROM catalog_restrictions"
                    " ORDER BY restriction_id"
                )
            ).fetchall()
        return CatalogSnapshot(
            scopes=[_scope(row) for row in scopes],
            restrictions=[
                RestrictionRow(str(scope), str(rid), _names(allow), _names(deny))
                for scope, rid, allow, deny in restrictions
            ],
            # PostgreSQL databases began with agent ids: no records kept under names.
            legacy_agents={},
        )

    async def apply(self, changes: Sequence[CatalogChange]) -> None:
        async with self._connection() as conn, conn.transaction():
            for change in changes:
                await _apply(conn, change)


async def _apply(conn: Conn, change: CatalogChange) -> None:
    if isinstance(change, PutScope):
        row = change.row
        await conn.execute(
            "INSERT INTO catalog_scopes (name, agent_id, preset, mode, language,"
            " self_modification, create_time) VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET agent_id = excluded.agent_id,"
            " preset = excluded.preset, mode = excluded.mode, language = excluded.language,"
            " self_modification = excluded.self_modification,"
            " create_time = excluded.create_time",
            (
                row.name,
                row.agent_id,
                row.preset,
                None if row.mode is None else row.mode.value,
                row.language,
                row.self_modification,
                row.create_time,
            ),
        )
    elif isinstance(change, DeleteScope):
        await conn.execute("DELETE FROM catalog_restrictions WHERE scope = %s", (change.name,))
        await conn.execute("DELETE FROM catalog_scopes WHERE name = %s", (change.name,))
    elif isinstance(change, PutRestriction):
        r = change.row
        await conn.execute(
            "INSERT INTO catalog_restrictions (restriction_id, scope, allow, deny)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (restriction_id) DO UPDATE SET"
            " scope = excluded.scope, allow = excluded.allow, deny = excluded.deny",
            (r.restriction_id, r.scope, _json(r.allow), _json(r.deny)),
        )
    elif isinstance(change, DeleteRestriction):
        await conn.execute(
            "DELETE FROM catalog_restrictions WHERE scope = %s AND restriction_id = %s",
            (change.scope, change.restriction_id),
        )
    elif isinstance(change, DeleteHistory):
        for statement in DELETE_AGENT_HISTORY:
            await conn.execute(statement, (change.agent_id,))
    else:
        assert_never(change)


def _scope(row: Sequence[Any]) -> ScopeRow:
    name, create_time, mode, language, self_modification, preset, agent_id = row
    return ScopeRow(
        name=str(name),
        create_time=float(create_time),
        mode=None if mode is None else Mode(str(mode)),
        language=None if language is None else str(language),
        self_modification=None if self_modification is None else bool(self_modification),
        preset=str(preset),
        agent_id=str(agent_id),
    )


def _json(names: tuple[str, ...] | None) -> Jsonb | None:
    return None if names is None else Jsonb(list(names))


def _names(value: object) -> tuple[str, ...] | None:
    return None if value is None else tuple(str(n) for n in value)  # type: ignore[attr-defined]
