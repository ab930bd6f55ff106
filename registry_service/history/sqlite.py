"""SQLite history store: the embedded default (WAL, a file path or `:memory:`).

Appends made in the same event-loop turn are committed in one transaction, so a busy run does
not pay one commit per record; `append` returns only after its transaction committed. Content
larger than `max_inline_bytes` is stored once in a blob table and the record keeps a preview plus
a locator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from registry_service.history.build import content_preview
from registry_service.history.records import Record

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  agent TEXT NOT NULL,
  kind TEXT NOT NULL,
  call_id TEXT NOT NULL,
  root_call_id TEXT NOT NULL,
  parent_call_id TEXT NOT NULL,
  time REAL NOT NULL,
  body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_agent ON records (agent, seq);
CREATE INDEX IF NOT EXISTS records_call ON records (agent, call_id);
CREATE INDEX IF NOT EXISTS records_root ON records (agent, root_call_id);
CREATE TABLE IF NOT EXISTS spills (id INTEGER PRIMARY KEY AUTOINCREMENT, content TEXT NOT NULL);
"""
_BODY_FIELDS = ("name", "arguments_json", "content_json", "is_error", "error_code", "spilled")


class SqliteHistory:
    def __init__(self, path: str | Path = ":memory:", *, max_inline_bytes: int = 64 * 1024) -> None:
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._max_inline = max_inline_bytes
        self._batch: list[tuple[Record, asyncio.Future[Record]]] = []
        # Live watches by agent; None in a queue ends that watch (shutdown).
        self._watchers: dict[str, set[asyncio.Queue[Record | None]]] = {}

    async def append(self, record: Record) -> Record:
        return await self.submit(record)

    def submit(self, record: Record) -> asyncio.Future[Record]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Record] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._flush)  # scheduled now: before any work queued after this
        self._batch.append((record, future))
        return future

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        try:
            self._db.execute("BEGIN")
            stored = [self._insert(record) for record, _ in batch]
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._db.execute("ROLLBACK")
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), record in zip(batch, stored, strict=True):
            if not future.done():
                future.set_result(record)
            for queue in self._watchers.get(record.agent, ()):
                queue.put_nowait(record)

    def _insert(self, record: Record) -> Record:
        if len(record.content_json) > self._max_inline:
            cursor = self._db.execute(
                "INSERT INTO spills (content) VALUES (?)", (record.content_json,)
            )
            preview = content_preview(record.content_json, min(2048, self._max_inline))
            record = dataclasses.replace(
                record,
                content_json=json.dumps([{"type": "text", "text": preview}]),
                spilled=f"spill:{cursor.lastrowid}",
            )
        body = json.dumps({f: getattr(record, f) for f in _BODY_FIELDS})
        cursor = self._db.execute(
            "INSERT INTO records (agent, kind, call_id, root_call_id, parent_call_id, time, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                record.agent,
                record.kind,
                record.call_id,
                record.root_call_id,
                record.parent_call_id,
                record.time,
                body,
            ),
        )
        assert cursor.lastrowid is not None
        return dataclasses.replace(record, seq=cursor.lastrowid)

    async def list(
        self, agent: str, *, after_seq: int, limit: int, call_id: str = ""
    ) -> Sequence[Record]:
        query = (
            "SELECT seq, agent, kind, call_id, root_call_id, parent_call_id, time, body"
            " FROM records WHERE agent = ? AND seq > ?"
        )
        params: list[object] = [agent, after_seq]
        if call_id:
            query += " AND (call_id = ? OR root_call_id = ?)"
            params += [call_id, call_id]
        rows = self._db.execute(query + " ORDER BY seq LIMIT ?", [*params, limit]).fetchall()
        return [_row(row) for row in rows]

    async def watch(self, agent: str, after_seq: int) -> AsyncIterator[Record]:
        queue: asyncio.Queue[Record | None] = asyncio.Queue()
        self._watchers.setdefault(agent, set()).add(queue)
        try:
            last = after_seq
            while True:  # backlog first, in pages, then live records past the last one seen
                page = await self.list(agent, after_seq=last, limit=500)
                for record in page:
                    last = record.seq
                    yield record
                if len(page) < 500:
                    break
            while (live := await queue.get()) is not None:
                if live.seq > last:
                    last = live.seq
                    yield live
        finally:
            self._watchers[agent].discard(queue)

    def end_watches(self) -> None:
        for queues in self._watchers.values():
            for queue in queues:
                queue.put_nowait(None)

    def prune(self, before: float, *, limit: int = 500) -> int:
        """Deletes whole calls whose newest record is older than `before` (a Unix time): every
        record sharing their root call id, and the content they spilled, so no trajectory is
        left half there. At most `limit` calls at a time; returns how many were deleted."""
        roots = self._db.execute(
            "SELECT agent, root_call_id FROM records GROUP BY agent, root_call_id"
            " HAVING MAX(time) < ? LIMIT ?",
            (before, limit),
        ).fetchall()
        if not roots:
            return 0
        self._db.execute("BEGIN")
        try:
            for agent, root in roots:
                where = "FROM records WHERE agent = ? AND root_call_id = ?"
                self._db.execute(
                    "DELETE FROM spills WHERE id IN (SELECT CAST(substr("
                    "json_extract(body, '$.spilled'), 7) AS INTEGER) "
                    + where
                    + " AND json_extract(body, '$.spilled') LIKE 'spill:%')",
                    (agent, root),
                )
                self._db.execute("DELETE " + where, (agent, root))
            self._db.execute("COMMIT")
        except sqlite3.Error:
            self._db.execute("ROLLBACK")
            raise
        return len(roots)

    async def read_spill(self, locator: str) -> str | None:
        prefix, _, ident = locator.partition(":")
        if prefix != "spill" or not ident.isdigit():
            return None
        row = self._db.execute("SELECT content FROM spills WHERE id = ?", (int(ident),)).fetchone()
        return None if row is None else str(row[0])

    async def close(self) -> None:
        if self._batch:
            self._flush()
        self._db.close()


def _row(row: tuple[object, ...]) -> Record:
    seq, agent, kind, call_id, root, parent, time, body = row
    fields = json.loads(str(body))
    return Record(
        kind=str(kind),
        agent=str(agent),
        call_id=str(call_id),
        root_call_id=str(root),
        parent_call_id=str(parent),
        time=float(time),  # type: ignore[arg-type]
        seq=int(seq),  # type: ignore[call-overload]
        **fields,
    )
