"""The PostgreSQL run request store (domain/cordis/activation_records.py): pending
client-bearing activations as records in the history database, shared by every registry on
it.

Like the approval store it works through the history store's read connection (one write = one
transaction, a failure reported through the history's health). Each write notifies
(`ACTIVATIONS_CHANNEL`, in its transaction, so only once committed) and the history store's
LISTEN connection tells this process's `ClientRuns` that other registries changed records. An
open record whose asker's history writer lease is gone (expired or removed) is an orphan: the
registry that held its attempt died."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from registry_service.domain.cordis.activation_records import (
    ActivationFollower,
    ActivationNotOpen,
    ActivationRecord,
    Move,
    PagesAt,
)
from registry_service.history import activation_rows as rows
from registry_service.history.postgres.catalog import write_note

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

ACTIVATIONS_CHANNEL = "codemode_activations"

_INSERT, _MOVE, _OPEN, _ONE, _PRUNE = map(
    rows.pg, (rows.INSERT, rows.MOVE, rows.OPEN_ROWS, rows.ONE, rows.PRUNE)
)
_GET = f"SELECT {rows.COLUMNS} FROM cordis_activations WHERE request_id = ANY(%s) ORDER BY position"
_INTERRUPT = (
    rows.pg(rows.INTERRUPT) + " AND NOT EXISTS (SELECT 1 FROM history_writers w"
    " WHERE w.id = cordis_activations.asked_by AND w.expires_at > now())"
    f" RETURNING {rows.COLUMNS}"
)


# Only registries whose history writer lease holds: a row a dead one left is ignored.
_PAGES_ELSEWHERE = (
    rows.pg(rows.PAGES_ELSEWHERE) + " AND EXISTS (SELECT 1 FROM history_writers w"
    " WHERE w.id = cordis_pages.registry AND w.expires_at > now()) ORDER BY agent, registry"
)


class PostgresActivations:
    def __init__(
        self,
        connection: Callable[[], AbstractAsyncContextManager[Conn]],
        writer_id: str,
        follow: Callable[[ActivationFollower], None],
    ) -> None:
        self._connection = connection  # the history's reads: its lock, errors and health
        self.asker_id = writer_id
        self._follow = follow

    def follow(self, changed: ActivationFollower) -> None:
        self._follow(changed)

    async def _notify(self, conn: Conn, request_ids: Collection[str]) -> None:
        await conn.execute(
            "SELECT pg_notify(%s, %s)",
            (ACTIVATIONS_CHANNEL, write_note(self.asker_id, request_ids)),
        )

    async def _one(self, conn: Conn, request_id: str) -> ActivationRecord | None:
        row = await (await conn.execute(_ONE, (request_id,))).fetchone()
        return None if row is None else rows.record_of(row)

    async def add(self, record: ActivationRecord) -> ActivationRecord:
        async with self._connection() as conn:
            async with conn.transaction():
                added = await (await conn.execute(_INSERT, rows.insert_values(record))).fetchone()
                if added is not None:
                    await self._notify(conn, [record.request_id])
            if added is None:
                raise ActivationNotOpen(record.request_id, await self._one(conn, record.request_id))
        return rows.record_of(added)

    async def move(self, request_id: str, move: Move) -> ActivationRecord:
        async with self._connection() as conn:
            async with conn.transaction():
                after = await (
                    await conn.execute(_MOVE, rows.move_values(request_id, move))
                ).fetchone()
                if after is not None:
                    await self._notify(conn, [request_id])
            if after is None:
                raise ActivationNotOpen(request_id, await self._one(conn, request_id))
        return rows.record_of(after)

    async def get(self, request_ids: Collection[str]) -> Sequence[ActivationRecord]:
        async with self._connection() as conn:
            found = await (await conn.execute(_GET, (sorted(set(request_ids)),))).fetchall()
        return [rows.record_of(row) for row in found]

    async def open(self, *, limit: int) -> Sequence[ActivationRecord]:
        async with self._connection() as conn:
            found = await (await conn.execute(_OPEN, (limit,))).fetchall()
        return [rows.record_of(row) for row in found]

    async def interrupt_orphans(self, *, at: float) -> Sequence[ActivationRecord]:
        async with self._connection() as conn, conn.transaction():
            moved = await (
                await conn.execute(_INTERRUPT, (self.asker_id, at, self.asker_id))
            ).fetchall()
            records = sorted((rows.record_of(row) for row in moved), key=lambda r: r.position)
            if records:
                await self._notify(conn, [r.request_id for r in records])
        return records

    async def prune(self, before: float, *, limit: int = 500) -> int:
        async with self._connection() as conn, conn.transaction():
            return (await conn.execute(_PRUNE, (before, limit))).rowcount

    async def attach_pages(self, agent: str, address: str, manifest_json: str) -> None:
        async with self._connection() as conn, conn.transaction():
            await conn.execute(
                rows.pg(rows.ATTACH_PAGES), (agent, self.asker_id, address, manifest_json)
            )
            await self._notify(conn, [agent])

    async def detach_pages(self, agent: str) -> None:
        async with self._connection() as conn, conn.transaction():
            await conn.execute(rows.pg(rows.DETACH_PAGES), (agent, self.asker_id))
            await self._notify(conn, [agent])

    async def pages_elsewhere(self) -> Sequence[PagesAt]:
        async with self._connection() as conn:
            found = await (await conn.execute(_PAGES_ELSEWHERE, (self.asker_id,))).fetchall()
        return [PagesAt(str(a), str(r), str(address), str(m)) for a, r, address, m in found]
