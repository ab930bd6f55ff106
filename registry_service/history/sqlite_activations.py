"""The SQLite run request store (domain/cordis/activation_records.py) in the history database.
One registry owns a SQLite file: no other registry's change is followed, and an open record
another process asked was asked by a registry that is gone (`interrupt_orphans`)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Collection, Sequence

from codemode_wire.errors import CodemodeError
from registry_service.domain.cordis.activation_records import (
    ActivationFollower,
    ActivationNotOpen,
    ActivationRecord,
    Move,
    PagesAt,
)
from registry_service.history import activation_rows as rows
from registry_service.history.sqlite_writes import synced_transaction


class SqliteActivations:
    def __init__(
        self,
        db: sqlite3.Connection,
        writer_id: str,
        failed: Callable[[BaseException], CodemodeError],
        refuse_if_corrupt: Callable[[], None],
    ) -> None:
        self._db = db
        self.asker_id = writer_id
        self._failed = failed
        self._refuse_if_corrupt = refuse_if_corrupt

    def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return synced_transaction(self._db, self._failed, self._refuse_if_corrupt)

    def _read(self, statement: str, params: Sequence[object]) -> list[ActivationRecord]:
        self._refuse_if_corrupt()
        try:
            return [rows.record_of(row) for row in self._db.execute(statement, params)]
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc

    def _stored(self, request_id: str) -> ActivationRecord | None:
        found = self._read(rows.ONE, (request_id,))
        return found[0] if found else None

    def follow(self, changed: ActivationFollower) -> None:
        """Never called: a SQLite file has one registry, whose own changes it already has."""

    async def add(self, record: ActivationRecord) -> ActivationRecord:
        with self._transaction() as db:
            added = db.execute(rows.INSERT, rows.insert_values(record)).fetchall()
        if not added:
            raise ActivationNotOpen(record.request_id, self._stored(record.request_id))
        return rows.record_of(added[0])

    async def move(self, request_id: str, move: Move) -> ActivationRecord:
        with self._transaction() as db:
            after = db.execute(rows.MOVE, rows.move_values(request_id, move)).fetchall()
        if not after:
            raise ActivationNotOpen(request_id, self._stored(request_id))
        return rows.record_of(after[0])

    async def get(self, request_ids: Collection[str]) -> Sequence[ActivationRecord]:
        found: list[ActivationRecord] = []
        for request_id in sorted(set(request_ids)):
            found += self._read(rows.ONE, (request_id,))
        return sorted(found, key=lambda r: r.position)

    async def open(self, *, limit: int) -> Sequence[ActivationRecord]:
        return self._read(rows.OPEN_ROWS, (limit,))

    async def interrupt_orphans(self, *, at: float) -> Sequence[ActivationRecord]:
        with self._transaction() as db:
            moved = db.execute(
                f"{rows.INTERRUPT} RETURNING {rows.COLUMNS}", (self.asker_id, at, self.asker_id)
            ).fetchall()
        return sorted((rows.record_of(row) for row in moved), key=lambda r: r.position)

    async def prune(self, before: float, *, limit: int = 500) -> int:
        with self._transaction() as db:
            return db.execute(rows.PRUNE, (before, limit)).rowcount

    async def attach_pages(self, agent: str, address: str, manifest_json: str) -> None:
        with self._transaction() as db:
            db.execute(rows.ATTACH_PAGES, (agent, self.asker_id, address, manifest_json))

    async def detach_pages(self, agent: str) -> None:
        with self._transaction() as db:
            db.execute(rows.DETACH_PAGES, (agent, self.asker_id))

    async def pages_elsewhere(self) -> Sequence[PagesAt]:
        """Nothing: another registry's row on this file was left by one that is gone."""
        return []
