"""The PostgreSQL approval store (domain/approval_records.py): approvals as records in the
history database, shared by every registry on it.

Like the Cordis store it works through the history store's read connection (one write = one
transaction, a failure reported through the history's health). Each write notifies
(`APPROVALS_CHANNEL`, in its transaction, so only once committed) and the history store's
LISTEN connection tells this process's broker that other registries changed approvals. A
pending approval whose asker's history writer lease is gone (expired or removed) is an
orphan: the registry that waited on it died."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from registry_service.domain.approval_records import (
    ApprovalFollower,
    ApprovalNotPending,
    ApprovalRecord,
    ApprovalState,
)
from registry_service.history import approval_rows as rows
from registry_service.history.postgres.catalog import write_note

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

APPROVALS_CHANNEL = "codemode_approvals"

_INSERT, _RESOLVE, _PENDING, _ONE, _PRUNE = map(
    rows.pg, (rows.INSERT, rows.RESOLVE, rows.PENDING, rows.ONE, rows.PRUNE)
)
_GET = f"SELECT {rows.COLUMNS} FROM approvals WHERE approval_id = ANY(%s) ORDER BY position"
_INTERRUPT = (
    rows.pg(rows.INTERRUPT) + " AND NOT EXISTS (SELECT 1 FROM history_writers w"
    " WHERE w.id = approvals.asked_by AND w.expires_at > now())"
    f" RETURNING {rows.COLUMNS}"
)


class PostgresApprovals:
    def __init__(
        self,
        connection: Callable[[], AbstractAsyncContextManager[Conn]],
        writer_id: str,
        follow: Callable[[ApprovalFollower], None],
    ) -> None:
        self._connection = connection  # the history's reads: its lock, errors and health
        self.asker_id = writer_id
        self._follow = follow

    def follow(self, changed: ApprovalFollower) -> None:
        self._follow(changed)

    async def _notify(self, conn: Conn, approval_ids: Collection[str]) -> None:
        await conn.execute(
            "SELECT pg_notify(%s, %s)",
            (APPROVALS_CHANNEL, write_note(self.asker_id, approval_ids)),
        )

    async def _one(self, conn: Conn, approval_id: str) -> ApprovalRecord | None:
        row = await (await conn.execute(_ONE, (approval_id,))).fetchone()
        return None if row is None else rows.record_of(row)

    async def add(self, record: ApprovalRecord) -> ApprovalRecord:
        async with self._connection() as conn:
            async with conn.transaction():
                added = await (await conn.execute(_INSERT, rows.insert_values(record))).fetchone()
                if added is not None:
                    await self._notify(conn, [record.approval_id])
            if added is None:
                raise ApprovalNotPending(
                    record.approval_id, await self._one(conn, record.approval_id)
                )
        return rows.record_of(added)

    async def resolve(
        self, approval_id: str, state: ApprovalState, *, by: str, at: float
    ) -> ApprovalRecord:
        values = rows.resolve_values(approval_id, state, by, at)
        async with self._connection() as conn:
            async with conn.transaction():
                moved = await (await conn.execute(_RESOLVE, values)).fetchone()
                if moved is not None:
                    await self._notify(conn, [approval_id])
            if moved is None:
                raise ApprovalNotPending(approval_id, await self._one(conn, approval_id))
        return rows.record_of(moved)

    async def get(self, approval_ids: Collection[str]) -> Sequence[ApprovalRecord]:
        async with self._connection() as conn:
            found = await (await conn.execute(_GET, (sorted(set(approval_ids)),))).fetchall()
        return [rows.record_of(row) for row in found]

    async def pending(self, *, after: int = 0, limit: int) -> Sequence[ApprovalRecord]:
        async with self._connection() as conn:
            found = await (await conn.execute(_PENDING, (after, limit))).fetchall()
        return [rows.record_of(row) for row in found]

    async def interrupt_orphans(self, *, at: float) -> Sequence[ApprovalRecord]:
        async with self._connection() as conn, conn.transaction():
            moved = await (
                await conn.execute(_INTERRUPT, (self.asker_id, at, self.asker_id))
            ).fetchall()
            records = sorted((rows.record_of(row) for row in moved), key=lambda r: r.position)
            if records:
                await self._notify(conn, [r.approval_id for r in records])
        return records

    async def prune(self, before: float, *, limit: int = 500) -> int:
        async with self._connection() as conn, conn.transaction():
            return (await conn.execute(_PRUNE, (before, limit))).rowcount
