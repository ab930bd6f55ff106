"""The SQLite catalog store: presets, agents and restrictions in the history database.

It shares the history's connection, and with it the event-loop thread every write of that
connection runs on: a catalog change is committed between two history batches, never inside
one, and never waits for a lock the other holds. A change is a handful of rows, so its commit
on the loop costs what one history batch does."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import Callable, Collection, Sequence
from typing import assert_never

from codemode_wire.errors import CodemodeError
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
)

# Deletes one agent's records and what they spilled (the history's own deletion, shared).
DELETE_AGENT_HISTORY = (
    "DELETE FROM spills WHERE id IN (SELECT CAST(substr(json_extract(body, '$.spilled'), 7)"
    " AS INTEGER) FROM records WHERE agent_id = ? AND json_extract(body, '$.spilled')"
    " LIKE 'spill:%')",
    "DELETE FROM records WHERE agent_id = ?",
    "DELETE FROM open_calls WHERE agent_id = ?",
)


class SqliteCatalog:
    def __init__(
        self,
        db: sqlite3.Connection,
        failed: Callable[[BaseException], CodemodeError],
        refuse_if_corrupt: Callable[[], None],
    ) -> None:
        self._db = db
        self._failed = failed  # the history's: one database, one health
        self._refuse_if_corrupt = refuse_if_corrupt

    async def load(self) -> CatalogSnapshot:
        self._refuse_if_corrupt()
        try:
            scopes = self._db.execute(
                "SELECT name, create_time, mode, language, self_modification, preset, agent_id,"
                " mcp_servers FROM catalog_scopes ORDER BY name LIKE 'agents/%', name"
            ).fetchall()
            restrictions = self._db.execute(
                "SELECT scope, restriction_id, allow, deny FROM catalog_restrictions"
                " ORDER BY restriction_id"
            ).fetchall()
            legacy = self._db.execute("SELECT name, agent_id FROM legacy_agents").fetchall()
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        return CatalogSnapshot(
            scopes=[_scope(row) for row in scopes],
            restrictions=[
                RestrictionRow(str(scope), str(rid), _names(allow), _names(deny))
                for scope, rid, allow, deny in restrictions
            ],
            legacy_agents={str(name): str(agent_id) for name, agent_id in legacy},
        )

    async def load_scopes(self, names: Collection[str] | None) -> CatalogSnapshot:
        snapshot = await self.load()  # one connection, one thread: already one snapshot
        if names is None:
            return dataclasses.replace(snapshot, legacy_agents={})
        wanted = set(names)
        return CatalogSnapshot(
            scopes=[row for row in snapshot.scopes if row.name in wanted],
            restrictions=[r for r in snapshot.restrictions if r.scope in wanted],
        )

    def follow(self, changed: CatalogFollower) -> None:
        """Never called: a SQLite file has one registry, whose own changes it already has."""

    async def apply(self, changes: Sequence[CatalogChange]) -> None:
        self._refuse_if_corrupt()
        db = self._db
        try:
            if db.in_transaction:  # left open by a ROLLBACK that failed
                db.execute("ROLLBACK")
            # The history commits without a sync (it survives a crash of the process, not of
            # the machine); a catalog change is rare and answered as done, so its commit
            # syncs the log to the disk as well.
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN")
            for change in changes:
                self._apply(change)
            db.execute("COMMIT")
        except BaseException as exc:
            # A failed COMMIT (SQLITE_FULL) may already have rolled back: ROLLBACK would raise.
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            if isinstance(exc, CodemodeError | sqlite3.Error):
                raise self._failed(exc) from exc
            raise
        finally:
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA synchronous=NORMAL")

    def _apply(self, change: CatalogChange) -> None:
        """One change's statements; `CatalogConflict` when the stored catalog is not what it
        expects (one registry per file: only a bug of its own gets there)."""
        db = self._db
        if isinstance(change, PutScope):
            row = change.row
            values = (
                row.preset,
                None if row.mode is None else row.mode.value,
                row.language,
                None if row.self_modification is None else int(row.self_modification),
                attachments_to_json(row.mcp_servers),
                row.create_time,
                row.name,
                row.agent_id,
            )
            if change.create:
                cursor = db.execute(
                    "INSERT INTO catalog_scopes (preset, mode, language, self_modification,"
                    " mcp_servers, create_time, name, agent_id)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (name) DO NOTHING",
                    values,
                )
            else:
                cursor = db.execute(
                    "UPDATE catalog_scopes SET preset = ?, mode = ?, language = ?,"
                    " self_modification = ?, mcp_servers = ?, create_time = ?"
                    " WHERE name = ? AND agent_id = ?",
                    values,
                )
            if cursor.rowcount != 1:
                raise CatalogConflict(row.name)
            if row.agent_id:
                db.execute("DELETE FROM legacy_agents WHERE agent_id = ?", (row.agent_id,))
        elif isinstance(change, DeleteScope):
            cursor = db.execute(
                "DELETE FROM catalog_scopes WHERE name = ? AND agent_id = ?",
                (change.name, change.agent_id),
            )
            if cursor.rowcount != 1:
                raise CatalogConflict(change.name)
            db.execute("DELETE FROM catalog_restrictions WHERE scope = ?", (change.name,))
        elif isinstance(change, PutRestriction):
            r = change.row
            if (
                db.execute("SELECT 1 FROM catalog_scopes WHERE name = ?", (r.scope,)).fetchone()
                is None
            ):
                raise CatalogConflict(r.scope)
            db.execute(
                "INSERT OR REPLACE INTO catalog_restrictions (restriction_id, scope, allow, deny)"
                " VALUES (?, ?, ?, ?)",
                (r.restriction_id, r.scope, _json(r.allow), _json(r.deny)),
            )
        elif isinstance(change, DeleteRestriction):
            cursor = db.execute(
                "DELETE FROM catalog_restrictions WHERE scope = ? AND restriction_id = ?",
                (change.scope, change.restriction_id),
            )
            if cursor.rowcount != 1:
                raise CatalogConflict(change.scope)
        elif isinstance(change, DeleteHistory):
            for statement in DELETE_AGENT_HISTORY:
                db.execute(statement, (change.agent_id,))
        else:
            assert_never(change)


def _scope(row: tuple[object, ...]) -> ScopeRow:
    name, create_time, mode, language, self_modification, preset, agent_id, mcp = row
    return ScopeRow(
        name=str(name),
        create_time=float(create_time),  # type: ignore[arg-type]
        mode=None if mode is None else Mode(str(mode)),
        language=None if language is None else str(language),
        self_modification=None if self_modification is None else bool(self_modification),
        preset=str(preset),
        agent_id=str(agent_id),
        mcp_servers=attachments_from_json(str(mcp)),
    )


def _json(names: tuple[str, ...] | None) -> str | None:
    return None if names is None else json.dumps(list(names))


def _names(text: object) -> tuple[str, ...] | None:
    return None if text is None else tuple(str(n) for n in json.loads(str(text)))
