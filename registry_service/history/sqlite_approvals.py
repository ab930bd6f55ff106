"""The SQLite approval store (domain/approval_records.py) in the history database. One
registry owns a SQLite file: no other registry's change is followed, and a pending approval
another process asked was asked by a registry that is gone (`interrupt_orphans`)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Collection, Sequence

from codemode_wire.errors import CodemodeError
from registry_service.domain.approval_records import (
    ApprovalFollower,
    ApprovalNotPending,
    ApprovalRecord,
    ApprovalState,
)
from registry_service.history import approval_rows as rows
from registry_service.history.sqlite_writes import synced_transaction


class SqliteApprovals:
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

    def _read(self, statement: str, params: Sequence[object]) -> list[ApprovalRecord]:
        self._refuse_if_corrupt()
        try:
            return [rows.record_of(row) for row in self._db.execute(statement, params)]
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc

    def follow(self, changed: ApprovalFollower) -> None:
        """Never called: a SQLite file has one registry, whose own changes it already has."""

    async def add(self, record: ApprovalRecord) -> ApprovalRecord:
        with self._transaction() as db:
            added = db.execute(rows.INSERT, rows.insert_values(record)).fetchall()
        if not added:
            stored = self._read(rows.ONE, (record.approval_id,))
            raise ApprovalNotPending(record.approval_id, stored[0] if stored else None)
        return rows.record_of(added[0])

    async def resolve(
        self, approval_id: str, state: ApprovalState, *, by: str, at: float
    ) -> ApprovalRecord:
        values = rows.resolve_values(approval_id, state, by, at)
        with self._transaction() as db:
            moved = db.execute(rows.RESOLVE, values).fetchall()
        if not moved:
            stored = self._read(rows.ONE, (approval_id,))
            raise ApprovalNotPending(approval_id, stored[0] if stored else None)
        return rows.record_of(moved[0])

    async def get(self, approval_ids: Collection[str]) -> Sequence[ApprovalRecord]:
        found: list[ApprovalRecord] = []
        for approval_id in sorted(set(approval_ids)):
            found += self._read(rows.ONE, (approval_id,))
        return sorted(found, key=lambda r: r.position)

    async def pending(self, *, after: int = 0, limit: int) -> Sequence[ApprovalRecord]:
        return self._read(rows.PENDING, (after, limit))

    async def interrupt_orphans(self, *, at: float) -> Sequence[ApprovalRecord]:
        with self._transaction() as db:
            moved = db.execute(
                f"{rows.INTERRUPT} RETURNING {rows.COLUMNS}", (self.asker_id, at, self.asker_id)
            ).fetchall()
        return sorted((rows.record_of(row) for row in moved), key=lambda r: r.position)

    async def prune(self, before: float, *, limit: int = 500) -> int:
        with self._transaction() as db:
            return db.execute(rows.PRUNE, (before, limit)).rowcount
