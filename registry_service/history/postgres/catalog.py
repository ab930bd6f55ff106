"""The PostgreSQL catalog store: presets, agents and restrictions in the history database.

It reads and writes through the history store's read connection (one change = one transaction
there, all or nothing), so a catalog change never waits inside a history batch, and a failure
is reported through the history's health: one database, one health.

Several registries share the catalog: each change notifies (`CATALOG_CHANNEL`, in its own
transaction) the scopes it touched, and the history store's LISTEN connection hands what other
registries changed to this process's followers (`follow`), which reload those scopes."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, assert_never

import psycopg
from psycopg.types.json import Jsonb

from registry_service.domain.mcp_attachments import attachments_from_json, attachments_to_json
from registry_service.domain.scopes import Mode
from registry_service.history.catalog_store import (
    CatalogChange,
    CatalogConflict,
    CatalogFollower,
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

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

CATALOG_CHANNEL = "codemode_catalog"
# pg_notify's payload must stay below 8000 bytes; a change naming more scopes than fit (a
# preset deleted with many agents under it) tells the others to reload everything instead.
MAX_NOTE_BYTES = 7000

# One agent id's records, what they spilled and its open calls (DeleteHistory).
DELETE_AGENT_HISTORY = (
    "DELETE FROM history_spills WHERE id IN"
    " (SELECT spill_id FROM history_records WHERE agent_id = %s AND spill_id IS NOT NULL)",
    "DELETE FROM history_records WHERE agent_id = %s",
    "DELETE FROM history_open_calls WHERE agent_id = %s",
)


class PostgresCatalog:
    def __init__(
        self,
        connection: Callable[[], AbstractAsyncContextManager[Conn]],
        writer_id: str,
        follow: Callable[[CatalogFollower], None],
    ) -> None:
        self._connection = connection  # the history's reads: its lock, errors and health
        self._writer_id = writer_id  # who a notification is from (this process skips its own)
        self._follow = follow  # the history's LISTEN connection, which tells followers

    async def load(self) -> CatalogSnapshot:
        return await self._select(None)

    async def load_scopes(self, names: Collection[str] | None) -> CatalogSnapshot:
        return await self._select(None if names is None else sorted(names))

    def follow(self, changed: CatalogFollower) -> None:
        self._follow(changed)

    async def _select(self, names: list[str] | None) -> CatalogSnapshot:
        """The scopes (all, or those named) and their restrictions, read in one snapshot: a
        change committed between the two reads is seen by both or by neither."""
        where, params = ("", ()) if names is None else (" WHERE {} = ANY(%s)", (names,))
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            scopes = await (
                await conn.execute(
                    "SELECT name, create_time, mode, language, self_modification, preset,"
                    " agent_id, mcp_servers FROM catalog_scopes"
                    + where.format("name")
                    + " ORDER BY name LIKE 'agents/%%', name",
                    params,
                )
            ).fetchall()
            restrictions = await (
                await conn.execute(
                    "SELECT scope, restriction_id, allow, deny FROM catalog_restrictions"
                    + where.format("scope")
                    + " ORDER BY restriction_id",
                    params,
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
        """The change, and the notification that tells the other registries which scopes it
        touched, in one transaction: PostgreSQL delivers the notification only once the change
        is committed, and always if it is."""
        async with self._connection() as conn, conn.transaction():
            for change in changes:
                await _apply(conn, change)
            await conn.execute(
                "SELECT pg_notify(%s, %s)", (CATALOG_CHANNEL, self._note(changed_scopes(changes)))
            )

    def _note(self, scopes: Collection[str]) -> str:
        return write_note(self._writer_id, scopes)


def write_note(writer_id: str, names: Collection[str]) -> str:
    """A notification's payload: who wrote (`writer_id`) and what it changed (catalog scopes,
    Cordis plugins); too many names to fit tell the others to reload everything instead."""
    payload = json.dumps({"w": writer_id, "s": sorted(names)})
    if len(payload.encode()) > MAX_NOTE_BYTES:
        payload = json.dumps({"w": writer_id, "s": None})
    return payload


def read_note(payload: str, own_writer: str) -> tuple[bool, frozenset[str] | None]:
    """What a notification (`write_note`) tells this process: whether it is another
    registry's (not this process's own, and readable), and the names that registry changed
    (None: too many to name, reload everything)."""
    try:
        note = json.loads(payload)
        writer, scopes = str(note["w"]), note["s"]
        names = None if scopes is None else frozenset(str(name) for name in scopes)
    except (ValueError, KeyError, TypeError):
        return False, None
    return writer != own_writer, names


async def _apply(conn: Conn, change: CatalogChange) -> None:
    """One change's statements; `CatalogConflict` (the transaction rolls back) when the stored
    catalog is not what it expects. Row locks order it against other registries' changes: a
    create waits for a concurrent create of the name, a restriction holds its scope's row."""
    if isinstance(change, PutScope):
        row = change.row
        values = (
            row.preset,
            None if row.mode is None else row.mode.value,
            row.language,
            row.self_modification,
            attachments_to_json(row.mcp_servers),
            row.create_time,
            row.name,
            row.agent_id,
        )
        if change.create:
            cursor = await conn.execute(
                "INSERT INTO catalog_scopes (preset, mode, language, self_modification,"
                " mcp_servers, create_time, name, agent_id)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (name) DO NOTHING",
                values,
            )
        else:
            cursor = await conn.execute(
                "UPDATE catalog_scopes SET preset = %s, mode = %s, language = %s,"
                " self_modification = %s, mcp_servers = %s, create_time = %s"
                " WHERE name = %s AND agent_id = %s",
                values,
            )
        if cursor.rowcount != 1:
            raise CatalogConflict(row.name)
    elif isinstance(change, DeleteScope):
        cursor = await conn.execute(
            "DELETE FROM catalog_scopes WHERE name = %s AND agent_id = %s",
            (change.name, change.agent_id),
        )
        if cursor.rowcount != 1:
            raise CatalogConflict(change.name)
        await conn.execute("DELETE FROM catalog_restrictions WHERE scope = %s", (change.name,))
    elif isinstance(change, PutRestriction):
        r = change.row
        held = await conn.execute(
            "SELECT 1 FROM catalog_scopes WHERE name = %s FOR SHARE", (r.scope,)
        )
        if await held.fetchone() is None:
            raise CatalogConflict(r.scope)
        await conn.execute(
            "INSERT INTO catalog_restrictions (restriction_id, scope, allow, deny)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (restriction_id) DO UPDATE SET"
            " scope = excluded.scope, allow = excluded.allow, deny = excluded.deny",
            (r.restriction_id, r.scope, _json(r.allow), _json(r.deny)),
        )
    elif isinstance(change, DeleteRestriction):
        cursor = await conn.execute(
            "DELETE FROM catalog_restrictions WHERE scope = %s AND restriction_id = %s",
            (change.scope, change.restriction_id),
        )
        if cursor.rowcount != 1:
            raise CatalogConflict(change.scope)
    elif isinstance(change, DeleteHistory):
        for statement in DELETE_AGENT_HISTORY:
            await conn.execute(statement, (change.agent_id,))
    else:
        assert_never(change)


def _scope(row: Sequence[Any]) -> ScopeRow:
    name, create_time, mode, language, self_modification, preset, agent_id, mcp = row
    return ScopeRow(
        name=str(name),
        create_time=float(create_time),
        mode=None if mode is None else Mode(str(mode)),
        language=None if language is None else str(language),
        self_modification=None if self_modification is None else bool(self_modification),
        preset=str(preset),
        agent_id=str(agent_id),
        mcp_servers=attachments_from_json(str(mcp)),
    )


def _json(names: tuple[str, ...] | None) -> Jsonb | None:
    return None if names is None else Jsonb(list(names))


def _names(value: object) -> tuple[str, ...] | None:
    return None if value is None else tuple(str(n) for n in value)  # type: ignore[attr-defined]
