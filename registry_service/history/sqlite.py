"""SQLite history store: the embedded default (WAL, a file path or `:memory:`).

Appends made in the same event-loop turn are committed in one transaction, so a busy run does
not pay one commit per record; `append` returns only after its transaction committed. Content
larger than `max_inline_bytes` is stored once in a blob table and the record keeps a preview plus
a locator. `open_calls` holds the calls whose start record has no end record yet, so closing
what a crash left open costs a look at the open calls, not a scan of the history.

One process owns a database file (its open calls are that process's calls in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

from codemode_wire.errors import CodemodeError
from registry_service.domain.records import (
    CRASHED,
    END_OF,
    Record,
    content_preview,
    interrupted,
    key_problem,
)
from registry_service.history.sqlite_activations import SqliteActivations
from registry_service.history.sqlite_approvals import SqliteApprovals
from registry_service.history.sqlite_catalog import SqliteCatalog
from registry_service.history.sqlite_cordis import SqliteCordis
from registry_service.history.sqlite_host_leases import SqliteHostLeases
from registry_service.history.sqlite_migrations import migrate
from registry_service.history.store import (
    StoreHealth,
    StoreOpenError,
    StoreState,
    record_invalid,
    store_corrupt,
    store_unavailable,
)

log = logging.getLogger(__name__)

# The oldest open call an end record closes (a call id may be reused after its call ended).
_CLOSE_OPEN_CALL = (
    "DELETE FROM open_calls WHERE seq = (SELECT seq FROM open_calls"
    " WHERE agent_id = ? AND call_id = ? AND kind = ? ORDER BY seq LIMIT 1)"
)
_START_OF = {end: start for start, end in END_OF.items()}
_COLUMNS = "seq, agent, kind, call_id, root_call_id, parent_call_id, time, body, agent_id"
_BODY_FIELDS = ("name", "arguments_json", "content_json", "is_error", "error_code", "spilled")
_CORRUPT_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
# Failures of one statement over what it was given (a constraint, a value SQLite cannot bind or
# hold), not of the database: they fail only the record at fault (history.store).
_REFUSALS = (
    sqlite3.IntegrityError,
    sqlite3.InterfaceError,
    sqlite3.DataError,
    UnicodeError,
    OverflowError,
)


class SqliteHistory(StoreHealth):
    def __init__(self, path: str | Path = ":memory:", *, max_inline_bytes: int = 64 * 1024) -> None:
        self._path = str(path)
        super().__init__(self._path)
        self._max_inline = max_inline_bytes
        self._batch: list[tuple[Record, asyncio.Future[Record]]] = []
        # Live watches by agent id; None in a queue ends that watch (shutdown).
        self._watchers: dict[str, set[asyncio.Queue[Record | None]]] = {}
        try:
            self._db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreOpenError(f"cannot open history database {self._path}: {exc}") from exc
        try:
            self._prepare()
        except sqlite3.Error as exc:
            if not _is_corrupt(exc):
                self._db.close()
                raise StoreOpenError(f"cannot open history database {self._path}: {exc}") from exc
            self._failed(exc)  # served, reporting the damage, rather than not started at all

    def _prepare(self) -> None:
        db = self._db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        # A damaged page found now, not by the first call that happens to read it. Linear in
        # the database's size (about 0.1 s per 50 MB); only its first problem is wanted.
        [(verdict,)] = db.execute("PRAGMA quick_check(1)").fetchall()
        if verdict != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed: {verdict}")
        applied = migrate(db)
        if applied:
            log.info("history database %s: applied migrations %s", self._path, applied)

    def catalog(self) -> SqliteCatalog:
        """The catalog store on this database (and this connection: see sqlite_catalog)."""
        return SqliteCatalog(self._db, self._failed, self._refuse_if_corrupt)

    def cordis(self) -> SqliteCordis:
        """The Cordis store on this database (and this connection, like the catalog)."""
        return SqliteCordis(self._db, self._failed, self._refuse_if_corrupt)

    def approvals(self) -> SqliteApprovals:
        """The approval store on this database (and this connection, like the catalog); this
        process asks under an id of its own (any other asker is a registry that is gone)."""
        return SqliteApprovals(self._db, uuid.uuid4().hex, self._failed, self._refuse_if_corrupt)

    def activations(self) -> SqliteActivations:
        """The Cordis run request store on this database (and this connection, like the
        approvals): any other asker is a registry that is gone."""
        return SqliteActivations(self._db, uuid.uuid4().hex, self._failed, self._refuse_if_corrupt)

    def host_leases(self) -> SqliteHostLeases:
        """The Cordis host leases on this database (and this connection)."""
        return SqliteHostLeases(self._db, self._failed, self._refuse_if_corrupt)

    # -- health ----------------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> CodemodeError:
        """The error to report for a failed SQLite operation; moves the state accordingly."""
        if _is_corrupt(exc):
            log.error("history database %s is damaged: %s", self._path, exc)
            self._set_state(StoreState.CORRUPT)
            return store_corrupt(f"{exc}; restore {self._path} from a backup")
        if isinstance(exc, _REFUSALS):
            return record_invalid(f"SQLite refused it: {exc}")
        if not isinstance(exc, sqlite3.Error):
            log.error("history store %s: unexpected failure", self._path, exc_info=exc)
        self._set_state(StoreState.UNAVAILABLE)
        return store_unavailable(str(exc))

    def _refuse_if_corrupt(self) -> None:
        if self._state is StoreState.CORRUPT:
            raise store_corrupt(f"{self._path} failed a check; restore it from a backup")

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        self._refuse_if_corrupt()
        try:
            yield
        except (sqlite3.Error, *_REFUSALS) as exc:
            raise self._failed(exc) from exc

    async def check(self) -> StoreState:
        if self._state is StoreState.CORRUPT:
            return self._state
        try:
            try:
                self._write([], self._owed, probe=True)
                self._owed = []
            except _REFUSALS:  # an owed end SQLite refuses: dropped, then the probe alone
                self._one_by_one([])
                self._write([], [], probe=True)
        except Exception as exc:
            self._failed(exc)
        return self._state

    # -- appends ---------------------------------------------------------------------------------

    async def append(self, record: Record) -> Record:
        return await self.submit(record)

    def submit(self, record: Record) -> asyncio.Future[Record]:
        if (refused := self._unstorable(record)) is not None:
            return refused
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Record] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._flush)  # scheduled now: before any work queued after this
        self._batch.append((record, future))
        return future

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        records = [record for record, _ in batch]
        try:
            self._refuse_if_corrupt()
            stored = self._write(records, self._owed)
        except Exception as exc:
            if isinstance(exc, _REFUSALS):
                self._one_by_one(batch)
                return
            self._fail(batch, exc)
            return
        self._owed = []
        for (_, future), record in zip(batch, stored[len(stored) - len(batch) :], strict=True):
            if not future.done():
                future.set_result(record)

    def _fail(self, batch: Sequence[tuple[Record, asyncio.Future[Record]]], exc: Exception) -> None:
        error = exc if isinstance(exc, CodemodeError) else self._failed(exc)
        for _, future in batch:  # first: nothing below may leave a caller waiting
            if not future.done():
                future.set_exception(error)
        self._owe([record for record, _ in batch])

    def _one_by_one(self, batch: Sequence[tuple[Record, asyncio.Future[Record]]]) -> None:
        """A batch SQLite refused for what one of its records holds: what is owed, then each
        record, in its own transaction, so that only the record at fault fails (an owed end
        that is refused is dropped: its call is closed at the next start)."""
        owed, self._owed = self._owed, []
        for n, record in enumerate(owed):
            try:
                self._write([], [record])
            except _REFUSALS as exc:
                log.error("history: an interrupted end dropped, SQLite refused it: %s", exc)
            except Exception:
                self._owed = [*owed[n:], *self._owed]
                break
        for n, (record, future) in enumerate(batch):
            try:
                [stored] = self._write([record], [])
            except _REFUSALS as exc:
                error = self._failed(exc)
                future.set_exception(error)
                self._refuse(record, error)
            except Exception as exc:
                self._fail(batch[n:], exc)
                return
            else:
                future.set_result(stored)

    def _write(
        self, records: Sequence[Record], owed: Sequence[Record], *, probe: bool = False
    ) -> list[Record]:
        """Writes `owed`, then `records`, in one transaction (all or nothing); returns the
        stored records, the owed ones first, and tells the watchers."""
        db = self._db
        try:
            if db.in_transaction:  # left open by a ROLLBACK that failed
                db.execute("ROLLBACK")
            db.execute("BEGIN")
            stored = [r for r in map(self._insert_owed, owed) if r is not None]
            stored += [self._insert(record) for record in records]
            if probe:
                db.execute("INSERT OR REPLACE INTO probe (id, at) VALUES (1, ?)", (time.time(),))
            db.execute("COMMIT")
        except BaseException:
            # A failed COMMIT (SQLITE_FULL) may already have rolled back: ROLLBACK would raise.
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise
        self._set_state(StoreState.OK)
        for record in stored:
            for queue in self._watchers.get(record.agent_id, ()):
                queue.put_nowait(record)
        return stored

    def _insert_owed(self, record: Record) -> Record | None:
        # Only while its call is open: the failed end may have been written after all.
        if self._db.execute(
            "SELECT 1 FROM open_calls WHERE agent_id = ? AND call_id = ? AND kind = ?",
            (record.agent_id, record.call_id, _START_OF[record.kind]),
        ).fetchone():
            return self._insert(record)
        return None

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
            "INSERT INTO records"
            " (agent, kind, call_id, root_call_id, parent_call_id, time, body, agent_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.agent,
                record.kind,
                record.call_id,
                record.root_call_id,
                record.parent_call_id,
                record.time,
                body,
                record.agent_id,
            ),
        )
        seq = cursor.lastrowid
        assert seq is not None
        if record.kind in END_OF:
            self._db.execute(
                "INSERT INTO open_calls (seq, agent, kind, call_id, root_call_id, agent_id)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    seq,
                    record.agent,
                    record.kind,
                    record.call_id,
                    record.root_call_id,
                    record.agent_id,
                ),
            )
        elif (start := _START_OF.get(record.kind)) is not None:
            self._db.execute(_CLOSE_OPEN_CALL, (record.agent_id, record.call_id, start))
        return dataclasses.replace(record, seq=seq)

    async def close_interrupted(self) -> Sequence[Record]:
        with self._reading():
            rows = self._db.execute(
                "SELECT r.seq, r.agent, r.kind, r.call_id, r.root_call_id, r.parent_call_id,"
                " r.time, r.body, r.agent_id FROM open_calls o JOIN records r ON r.seq = o.seq"
                " ORDER BY o.seq DESC"  # nested starts come after their outer call's
            ).fetchall()
        if not rows:
            return []
        closing = [interrupted(_row(row), CRASHED) for row in rows]
        stored = await asyncio.gather(*map(self.submit, closing))
        log.warning("history: closed %d calls left open by a crash", len(stored))
        return stored

    # -- reads -----------------------------------------------------------------------------------

    async def list(
        self, agent_id: str, *, after_seq: int, limit: int, call_id: str = ""
    ) -> Sequence[Record]:
        if key_problem(agent_id) or key_problem(call_id):
            return []  # no record holds such a key (records.unstorable)
        query = f"SELECT {_COLUMNS} FROM records WHERE agent_id = ? AND seq > ?"
        params: list[object] = [agent_id, after_seq]
        if call_id:
            query += " AND (call_id = ? OR root_call_id = ?)"
            params += [call_id, call_id]
        with self._reading():
            rows = self._db.execute(query + " ORDER BY seq LIMIT ?", [*params, limit]).fetchall()
        return [_row(row) for row in rows]

    async def watch(self, agent_id: str, after_seq: int) -> AsyncIterator[Record]:
        queue: asyncio.Queue[Record | None] = asyncio.Queue()
        self._watchers.setdefault(agent_id, set()).add(queue)
        try:
            last = after_seq
            while True:  # backlog first, in pages, then live records past the last one seen
                page = await self.list(agent_id, after_seq=last, limit=500)
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
            self._watchers[agent_id].discard(queue)

    def end_watches(self) -> None:
        for queues in self._watchers.values():
            for queue in queues:
                queue.put_nowait(None)

    async def read_spill(self, locator: str) -> str | None:
        prefix, _, ident = locator.partition(":")
        if prefix != "spill" or not ident.isdigit():
            return None
        with self._reading():
            row = self._db.execute(
                "SELECT content FROM spills WHERE id = ?", (int(ident),)
            ).fetchone()
        return None if row is None else str(row[0])

    # -- retention -------------------------------------------------------------------------------

    async def prune(self, before: float, *, limit: int = 500) -> int:
        """Deletes whole calls whose newest record is older than `before` (a Unix time): every
        record sharing their root call id, and the content they spilled, so no trajectory is
        left half there. At most `limit` calls at a time; returns how many were deleted."""
        with self._reading():
            roots = self._db.execute(
                "SELECT agent_id, root_call_id FROM records GROUP BY agent_id, root_call_id"
                " HAVING MAX(time) < ? LIMIT ?",
                (before, limit),
            ).fetchall()
        if not roots:
            return 0
        db = self._db
        try:
            db.execute("BEGIN")
            for agent_id, root in roots:
                where = "FROM records WHERE agent_id = ? AND root_call_id = ?"
                db.execute(
                    "DELETE FROM spills WHERE id IN (SELECT CAST(substr("
                    "json_extract(body, '$.spilled'), 7) AS INTEGER) "
                    + where
                    + " AND json_extract(body, '$.spilled') LIKE 'spill:%')",
                    (agent_id, root),
                )
                db.execute("DELETE " + where, (agent_id, root))
                db.execute(
                    "DELETE FROM open_calls WHERE agent_id = ? AND root_call_id = ?",
                    (agent_id, root),
                )
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise self._failed(exc) from exc
        return len(roots)

    async def close(self) -> None:
        if self._batch:
            self._flush()
        self._db.close()


def _is_corrupt(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # raised by this module (quick_check's verdict)
        return "malformed" in str(exc)
    return code & 0xFF in _CORRUPT_CODES


def _row(row: tuple[object, ...]) -> Record:
    seq, agent, kind, call_id, root, parent, time, body, agent_id = row
    fields = json.loads(str(body))
    return Record(
        kind=str(kind),
        agent=str(agent),
        call_id=str(call_id),
        root_call_id=str(root),
        parent_call_id=str(parent),
        time=float(time),  # type: ignore[arg-type]
        seq=int(seq),  # type: ignore[call-overload]
        agent_id=str(agent_id),
        **fields,
    )
