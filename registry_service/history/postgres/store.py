"""PostgreSQL history store (`history_store: postgres`, `history_dsn`), psycopg 3 async.

Same contract as the SQLite store (history.store): records submitted in one event-loop turn
are written in one transaction by a single writer task (a batch submitted while one is being
written waits for the next transaction, so order is kept); large content is spilled into its
own table; `open_calls` holds the calls still in flight.

Unlike SQLite's file, one database may be shared by several registries:
- seq comes from the agent id's counter row, updated in the writing transaction; its row lock,
  held to the commit, makes per-agent seqs strictly increasing and committed in order.
- Each registry process is a writer with a lease row (`history_writers`) it renews; an open
  call belongs to its writer. Calls left open are closed as interrupted only when their writer
  is gone (lease expired, or closed), in the transaction that removes the writer's row, so two
  registries never close the same call twice. `close_interrupted` at start also closes this
  process's own (there are none in flight before the first call).

The catalog (presets, agents, restrictions) lives in the same database (`catalog`), and so
do the Cordis records (`cordis`: plugins, packages, grants, id counters) and the approval
records (`approvals`). The schema is
migrated at open (`migrations`); an unreachable server or a bad DSN at open stops the start, a
server lost later makes the store UNAVAILABLE until a write or probe works again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import select
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from codemode_wire.errors import CodemodeError
from registry_service.domain.approval_records import ApprovalFollower
from registry_service.domain.cordis.activation_records import ActivationFollower
from registry_service.domain.cordis.state import CordisFollower
from registry_service.domain.records import Record, key_problem
from registry_service.history.catalog_store import CatalogFollower
from registry_service.history.postgres import batch
from registry_service.history.postgres.activations import ACTIVATIONS_CHANNEL, PostgresActivations
from registry_service.history.postgres.approvals import APPROVALS_CHANNEL, PostgresApprovals
from registry_service.history.postgres.batch import NOTIFY_CHANNEL, SELECT_COLUMNS, record_of
from registry_service.history.postgres.catalog import CATALOG_CHANNEL, PostgresCatalog, read_note
from registry_service.history.postgres.connect import (
    connect_async,
    connect_sync,
    redact,
)
from registry_service.history.postgres.cordis import CORDIS_CHANNEL, PostgresCordis
from registry_service.history.postgres.defaults import DEFAULT_LEASE_S, DEFAULT_STATEMENT_TIMEOUT_S
from registry_service.history.postgres.host_leases import PostgresHostLeases
from registry_service.history.postgres.migrations import SchemaTooNew, migrate
from registry_service.history.store import (
    StoreHealth,
    StoreOpenError,
    StoreState,
    record_invalid,
    store_corrupt,
    store_unavailable,
)

log = logging.getLogger(__name__)

_CORRUPT = (pg_errors.DataCorrupted, pg_errors.IndexCorrupted)
# Read at open: damage is found now, not by the first call that happens to read it. Bounded
# (unlike SQLite's whole-file check, a server database may be large): the newest records,
# through the primary key's index and their heap pages, are what the next calls touch.
_CHECK = (
    "SELECT count(length(content_json)) FROM (SELECT content_json FROM history_records"
    " ORDER BY agent_id DESC, seq DESC LIMIT 1000) newest"
)
_ATTEMPTS = 3  # of a transaction PostgreSQL rolls back to break a deadlock
_PAGE = 500  # records per read of a watch's backlog
_LISTEN_RETRY_S = 1.0


@dataclass
class _Job:
    """One queued piece of the next transaction."""

    record: Record | None = None
    future: asyncio.Future[Any] | None = None
    sweep: bool = False  # close the calls of writers that are gone
    own: bool = False  # ... and this process's own (at start)
    renew: bool = False  # renew this writer's lease (a heartbeat, a probe)


# In a watch's queue: a record this process wrote; the newest seq another registry committed
# for the agent (read the database up to it); None: the watch ends.
_Live = Record | int | None


class PostgresHistory(StoreHealth):
    def __init__(
        self,
        dsn: str,
        *,
        max_inline_bytes: int = 64 * 1024,
        lease_s: float = DEFAULT_LEASE_S,
        statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S,
    ) -> None:
        self._dsn = dsn
        self._statement_timeout_s = statement_timeout_s
        super().__init__(redact(dsn))
        self._max_inline = max_inline_bytes
        self._lease_s = lease_s
        self.writer_id = uuid.uuid4().hex  # this process, as a writer with a lease
        self._jobs: list[_Job] = []
        self._writing: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._catalog_listener: asyncio.Task[None] | None = None
        self._cordis_listener: asyncio.Task[None] | None = None
        self._approvals_listener: asyncio.Task[None] | None = None
        self._activations_listener: asyncio.Task[None] | None = None
        self._closing = False
        self._watchers: dict[str, set[asyncio.Queue[_Live]]] = {}
        self._catalog_followers: list[CatalogFollower] = []
        self._cordis_followers: list[CordisFollower] = []
        self._approval_followers: list[ApprovalFollower] = []
        self._activation_followers: list[ActivationFollower] = []
        self._writer: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        self._reader: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        self._read_lock = asyncio.Lock()
        try:
            with connect_sync(dsn, statement_timeout_s) as conn:
                migrate(conn)
                conn.execute(_CHECK)
                self._register_sync(conn)
        except SchemaTooNew as exc:
            raise StoreOpenError(f"history database {self._where}: {exc}") from exc
        except psycopg.Error as exc:
            if isinstance(exc, _CORRUPT):
                self._failed(exc)  # served, reporting the damage, rather than not started
                return
            raise StoreOpenError(f"cannot open history database {self._where}: {exc}") from exc

    def _register_sync(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        conn.execute(
            "INSERT INTO history_writers (id, expires_at)"
            " VALUES (%s, now() + make_interval(secs => %s))",
            (self.writer_id, self._lease_s),
        )

    def catalog(self) -> PostgresCatalog:
        """The catalog store on this database (through this store's reads: see catalog)."""
        return PostgresCatalog(self._reading, self.writer_id, self._follow_catalog)

    def cordis(self) -> PostgresCordis:
        """The Cordis store on this database (through this store's reads, like the catalog)."""
        return PostgresCordis(self._reading, self.writer_id, self._follow_cordis)

    def approvals(self) -> PostgresApprovals:
        """The approval store on this database (through this store's reads, like the catalog);
        this process asks as its history writer, so its lease says whether it still waits."""
        return PostgresApprovals(self._reading, self.writer_id, self._follow_approvals)

    def activations(self) -> PostgresActivations:
        """The Cordis run request store on this database (through this store's reads, like
        the approvals); this process asks as its history writer."""
        return PostgresActivations(self._reading, self.writer_id, self._follow_activations)

    def host_leases(self) -> PostgresHostLeases:
        """The Cordis host leases on this database (through this store's reads)."""
        return PostgresHostLeases(self._reading, self.writer_id)

    # -- health ----------------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> CodemodeError:
        """The error to report for a failed database operation; moves the state accordingly."""
        if isinstance(exc, _CORRUPT):
            log.error("history database %s is damaged: %s", self._where, exc)
            self._set_state(StoreState.CORRUPT)
            return store_corrupt(f"{exc}; restore the database from a backup")
        if _refusal(exc):
            return record_invalid(f"PostgreSQL refused it: {str(exc).strip()}")
        if isinstance(exc, pg_errors.QueryCanceled):
            self._set_state(StoreState.UNAVAILABLE)
            limit = f"history_statement_timeout_s ({self._statement_timeout_s:g} s)"
            log.error("history store %s: a statement ran over %s", self._where, limit)
            return store_unavailable(
                f"a statement of the history database ran over {limit}: a lock another session "
                f"holds, or an overloaded server ({str(exc).strip()})"
            )
        if not isinstance(exc, psycopg.OperationalError):
            log.error("history store %s: unexpected failure", self._where, exc_info=exc)
        self._set_state(StoreState.UNAVAILABLE)
        return store_unavailable(str(exc).strip() or type(exc).__name__)

    def _refuse_if_corrupt(self) -> None:
        if self._state is StoreState.CORRUPT:
            raise store_corrupt(f"{self._where} failed a check; restore it from a backup")

    async def check(self) -> StoreState:
        if self._state is not StoreState.CORRUPT:
            with contextlib.suppress(CodemodeError):
                await self._queue(_Job(renew=True))  # renewing the lease is a small write
        return self._state

    # -- connections -----------------------------------------------------------------------------

    async def _connect(self) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        return await connect_async(self._dsn, self._statement_timeout_s)

    async def _writer_conn(self) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        if not _usable(self._writer):
            await _close_quietly(self._writer)
            self._writer = None
            self._writer = await self._connect()
        assert self._writer is not None
        return self._writer

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[psycopg.AsyncConnection[tuple[Any, ...]]]:
        self._refuse_if_corrupt()
        self._start_heartbeat()
        async with self._read_lock:
            try:
                reader = self._reader
                if reader is None or not _usable(reader):
                    await _close_quietly(reader)
                    self._reader = None
                    self._reader = reader = await self._connect()
                yield reader
            except (psycopg.Error, UnicodeError) as exc:
                raise self._failed(exc) from exc

    # -- the writer ------------------------------------------------------------------------------

    async def append(self, record: Record) -> Record:
        return await self.submit(record)

    def submit(self, record: Record) -> asyncio.Future[Record]:
        if (refused := self._unstorable(record)) is not None:
            return refused
        future: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
        self._enqueue(_Job(record=record, future=future))
        return future

    def _queue(self, job: _Job) -> asyncio.Future[Any]:
        job.future = asyncio.get_running_loop().create_future()
        self._enqueue(job)
        return job.future

    def _enqueue(self, job: _Job) -> None:
        self._jobs.append(job)
        self._start_heartbeat()
        if self._writing is None or self._writing.done():
            # Runs once this turn's submits are in: they share one transaction.
            self._writing = asyncio.ensure_future(self._write_loop())

    async def _write_loop(self) -> None:
        while self._jobs:
            jobs, self._jobs = self._jobs, []
            try:
                self._refuse_if_corrupt()
                written = await self._transaction(
                    jobs, [j.record for j in jobs if j.record is not None], self._owed
                )
            except Exception as exc:
                if _refusal(exc):
                    await self._one_by_one(jobs)
                else:
                    self._fail(jobs, exc)
                continue
            self._owed = []
            self._done(jobs, written)

    def _done(self, jobs: Sequence[_Job], written: batch.Written) -> None:
        self._set_state(StoreState.OK)
        for row in written.all:
            self._tell_watchers(row.agent_id, row)
        stored = iter(written.records)
        for job in jobs:
            result: Any = next(stored) if job.record is not None else written.swept
            if job.future is not None and not job.future.done():
                job.future.set_result(result)

    def _fail(self, jobs: Sequence[_Job], exc: Exception) -> None:
        error = exc if isinstance(exc, CodemodeError) else self._failed(exc)
        for job in jobs:  # first: nothing below may leave a caller waiting
            if job.future is not None and not job.future.done():
                job.future.set_exception(error)
        # In doubt: a connection lost around the COMMIT may have committed it after all.
        self._owe([job.record for job in jobs if job.record is not None], in_doubt=True)

    async def _one_by_one(self, jobs: Sequence[_Job]) -> None:
        """A batch PostgreSQL refused for what one of its records holds: the batch's other
        work, then what is owed, then each record, each in its own transaction, so that only
        the record at fault fails (an owed end that is refused is dropped: its call is closed
        when this writer is gone)."""
        try:
            self._done([j for j in jobs if j.record is None], await self._transaction(jobs, [], []))
        except Exception as exc:
            self._fail(jobs, exc)
            return
        owed, self._owed = self._owed, []
        for n, end in enumerate(owed):
            try:
                self._done([], await self._transaction([], [], [end]))
            except Exception as exc:
                if not _refusal(exc):
                    self._owed = [*owed[n:], *self._owed]
                    break
                log.error("history: an interrupted end dropped, PostgreSQL refused it: %s", exc)
        writes = [job for job in jobs if job.record is not None]
        for n, job in enumerate(writes):
            assert job.record is not None and job.future is not None
            try:
                written = await self._transaction([], [job.record], [])
            except Exception as exc:
                if not _refusal(exc):
                    self._fail(writes[n:], exc)
                    return
                error = self._failed(exc)
                if not job.future.done():
                    job.future.set_exception(error)
                self._refuse(job.record, error)
            else:
                self._done([job], written)

    async def _transaction(
        self, jobs: Sequence[_Job], records: list[Record], owed: Sequence[Record]
    ) -> batch.Written:
        """The batch in one transaction (`jobs` say what else it does: a sweep, a lease
        renewal); again when PostgreSQL rolled it back to break a deadlock with another
        registry (nothing of it was written)."""
        for attempt in itertools.count(1):
            conn = await self._writer_conn()
            try:
                return await batch.write(
                    conn,
                    self.writer_id,
                    records=records,
                    owed=owed,
                    sweep=any(job.sweep for job in jobs),
                    own=any(job.own for job in jobs),
                    renew_s=self._lease_s if any(job.renew for job in jobs) else None,
                    max_inline=self._max_inline,
                )
            except pg_errors.TransactionRollback:
                if attempt == _ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    # -- leases ----------------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None and not self._closing:
            self._heartbeat = asyncio.ensure_future(self._keep_lease())

    async def _keep_lease(self) -> None:
        """Renews this writer's lease a few times per lease period, and closes the calls of
        writers whose lease expired (any live registry may: the sweep is exactly-once)."""
        while True:
            await asyncio.sleep(self._lease_s / 3)
            if self._state is StoreState.CORRUPT:
                continue
            with contextlib.suppress(CodemodeError):
                closed = await self._queue(_Job(sweep=True, renew=True))
                if closed:
                    log.warning("history: closed %d calls of registries that are gone", len(closed))

    async def close_interrupted(self) -> Sequence[Record]:
        self._refuse_if_corrupt()
        closed: list[Record] = await self._queue(_Job(sweep=True, own=True, renew=True))
        if closed:
            log.warning("history: closed %d calls left open by a crash", len(closed))
        return closed

    # -- reads -----------------------------------------------------------------------------------

    async def list(
        self, agent_id: str, *, after_seq: int, limit: int, call_id: str = ""
    ) -> Sequence[Record]:
        if key_problem(agent_id) or key_problem(call_id):
            return []  # no record holds such a key (records.unstorable)
        params: list[object] = [agent_id, after_seq]
        where = ""
        if call_id:
            where = " AND (call_id = %s OR root_call_id = %s)"
            params += [call_id, call_id]
        async with self._reading() as conn:
            cursor = await conn.execute(
                f"SELECT {SELECT_COLUMNS} FROM history_records WHERE agent_id = %s AND seq > %s"
                + where
                + " ORDER BY seq LIMIT %s",
                [*params, limit],
            )
            rows = await cursor.fetchall()
        return [record_of(row) for row in rows]

    async def watch(self, agent_id: str, after_seq: int) -> AsyncIterator[Record]:
        """Per agent, seqs are committed in order and without gaps, so a live record is yielded
        as it comes when it is the next seq; past a gap (records another registry wrote, told
        by a notification) the database is read up to it."""
        self._start_listening()
        queue: asyncio.Queue[_Live] = asyncio.Queue()
        self._watchers.setdefault(agent_id, set()).add(queue)
        try:
            last = after_seq
            caught_up = False
            while True:
                if not caught_up:  # the backlog, or what others wrote: read in pages
                    page = await self.list(agent_id, after_seq=last, limit=_PAGE)
                    for record in page:
                        last = record.seq
                        yield record
                    caught_up = len(page) < _PAGE
                    continue
                live = await queue.get()
                if live is None:
                    return
                if isinstance(live, int):
                    caught_up = live <= last
                elif live.seq == last + 1:
                    last = live.seq
                    yield live
                else:
                    caught_up = live.seq <= last
        finally:
            self._watchers[agent_id].discard(queue)

    def _tell_watchers(self, agent_id: str, live: _Live) -> None:
        for queue in self._watchers.get(agent_id, ()):
            queue.put_nowait(live)

    def end_watches(self) -> None:
        for queues in self._watchers.values():
            for queue in queues:
                queue.put_nowait(None)

    def _start_listening(self) -> None:
        if self._listener is None and not self._closing:
            self._listener = asyncio.ensure_future(
                self._listen(NOTIFY_CHANNEL, self._watches_missed, self._notified)
            )

    def _follow_catalog(self, changed: CatalogFollower) -> None:
        """`changed` hears what other registries change in the catalog, from now on: it is
        told "anything" first (and after every lost connection), for what it may have missed
        before the LISTEN took effect."""
        self._catalog_followers.append(changed)
        if self._catalog_listener is None and not self._closing:
            self._catalog_listener = asyncio.ensure_future(
                self._listen(CATALOG_CHANNEL, self._catalog_missed, self._catalog_notified)
            )

    def _follow_cordis(self, changed: CordisFollower) -> None:
        """Like `_follow_catalog`, for the Cordis records (a connection of its own)."""
        self._cordis_followers.append(changed)
        if self._cordis_listener is None and not self._closing:
            self._cordis_listener = asyncio.ensure_future(
                self._listen(CORDIS_CHANNEL, self._cordis_missed, self._cordis_notified)
            )

    def _follow_approvals(self, changed: ApprovalFollower) -> None:
        """Like `_follow_catalog`, for the approval records (a connection of its own)."""
        self._approval_followers.append(changed)
        if self._approvals_listener is None and not self._closing:
            self._approvals_listener = asyncio.ensure_future(
                self._listen(APPROVALS_CHANNEL, self._approvals_changed, self._approvals_notified)
            )

    def _follow_activations(self, changed: ActivationFollower) -> None:
        """Like `_follow_approvals`, for the Cordis run request records."""
        self._activation_followers.append(changed)
        if self._activations_listener is None and not self._closing:
            self._activations_listener = asyncio.ensure_future(
                self._listen(
                    ACTIVATIONS_CHANNEL, self._activations_changed, self._activations_notified
                )
            )

    async def _listen(
        self, channel: str, missed: Callable[[], None], notified: Callable[[str], None]
    ) -> None:
        """Follows what other registries commit on `channel` (LISTEN), each notification to
        `notified`; `missed` runs once the LISTEN holds, at first and after a lost connection,
        for what may have been missed meanwhile. History and catalog listen on connections of
        their own: a registry follows the catalog always, but the history's notifications
        (one per agent per batch of every other registry) only while it has watches."""
        while True:
            try:
                async with await self._connect() as conn:
                    await conn.execute(f"LISTEN {channel}")
                    missed()
                    async for note in conn.notifies():
                        notified(note.payload)
            except psycopg.Error as exc:
                log.debug("history: listening on %s for other registries: %s", channel, exc)
            await asyncio.sleep(_LISTEN_RETRY_S)

    def _watches_missed(self) -> None:
        """Every watch reads the database once: another registry may have written meanwhile."""
        for agent in list(self._watchers):
            self._tell_watchers(agent, 2**63 - 1)

    def _catalog_missed(self) -> None:
        for follower in self._catalog_followers:
            follower(None)

    def _catalog_notified(self, payload: str) -> None:
        others, names = read_note(payload, self.writer_id)
        if others:
            for follower in self._catalog_followers:
                follower(names)

    def _cordis_missed(self) -> None:
        for follower in self._cordis_followers:
            follower(None)

    def _cordis_notified(self, payload: str) -> None:
        others, plugin_ids = read_note(payload, self.writer_id)
        if others:
            for follower in self._cordis_followers:
                follower(plugin_ids)

    def _approvals_changed(self) -> None:
        for follower in self._approval_followers:
            follower()

    def _approvals_notified(self, payload: str) -> None:
        others, _ids = read_note(payload, self.writer_id)
        if others:
            self._approvals_changed()

    def _activations_changed(self) -> None:
        for follower in self._activation_followers:
            follower()

    def _activations_notified(self, payload: str) -> None:
        others, _ids = read_note(payload, self.writer_id)
        if others:
            self._activations_changed()

    def _notified(self, payload: str) -> None:
        try:
            note = json.loads(payload)
            writer, agent, seq = str(note["w"]), str(note["a"]), int(note["s"])
        except (ValueError, KeyError, TypeError):
            return
        if writer != self.writer_id:  # this process's own records reach its watches directly
            self._tell_watchers(agent, seq)

    async def read_spill(self, locator: str) -> str | None:
        prefix, _, ident = locator.partition(":")
        if prefix != "spill" or not ident.isdigit() or int(ident) >= 2**63:
            self._refuse_if_corrupt()
            return None
        async with self._reading() as conn:
            cursor = await conn.execute(
                "SELECT content FROM history_spills WHERE id = %s", (int(ident),)
            )
            row = await cursor.fetchone()
        return None if row is None else str(row[0])

    # -- retention -------------------------------------------------------------------------------

    async def prune(self, before: float, *, limit: int = 500) -> int:
        """Deletes whole calls whose newest record is older than `before` (a Unix time), with
        what they spilled and their open calls, in one statement (one transaction)."""
        async with self._reading() as conn:
            cursor = await conn.execute(
                """
WITH old AS (
  SELECT agent_id, root_call_id FROM history_records GROUP BY agent_id, root_call_id
  HAVING MAX(time) < %s LIMIT %s
), gone AS (
  DELETE FROM history_records r USING old
  WHERE r.agent_id = old.agent_id AND r.root_call_id = old.root_call_id
  RETURNING r.spill_id
), spills AS (
  DELETE FROM history_spills WHERE id IN (SELECT spill_id FROM gone)
), opened AS (
  DELETE FROM history_open_calls o USING old
  WHERE o.agent_id = old.agent_id AND o.root_call_id = old.root_call_id
)
SELECT count(*) FROM old
""",
                (before, limit),
            )
            row = await cursor.fetchone()
        return 0 if row is None else int(row[0])

    async def close(self) -> None:
        self._closing = True
        for task in (
            self._heartbeat,
            self._listener,
            self._catalog_listener,
            self._cordis_listener,
            self._approvals_listener,
            self._activations_listener,
        ):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        while self._writing is not None and not self._writing.done():
            await asyncio.shield(self._writing)
        if self._state is not StoreState.CORRUPT:
            # Gone: whatever this process left open is closed by the next sweep, anywhere.
            with contextlib.suppress(psycopg.Error, CodemodeError, OSError):
                conn = await self._writer_conn()
                await conn.execute("DELETE FROM history_writers WHERE id = %s", (self.writer_id,))
        await _close_quietly(self._writer)
        await _close_quietly(self._reader)


def _refusal(exc: BaseException) -> bool:
    """Whether PostgreSQL (or psycopg, before sending) refused a statement for what it was
    given (SQLSTATE classes 22 data exception, 23 integrity constraint, 54 program limit: a
    value too large to index), not for a failure of the server or the connection: it fails
    only the record at fault (history.store)."""
    if isinstance(exc, UnicodeError):
        return True  # a text psycopg cannot encode
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate:
        return exc.sqlstate[:2] in ("22", "23", "54")
    return isinstance(exc, psycopg.DataError)  # refused by psycopg (a NUL in a text)


def _usable(conn: psycopg.AsyncConnection[tuple[Any, ...]] | None) -> bool:
    """Whether an idle connection can take the next statement. A server that restarted (or
    ended the session) has sent its goodbye and closed the socket: an idle connection with
    something to read is such a one, found before a caller's write fails on it. (Neither
    connection listens, so nothing else arrives unasked.)"""
    if conn is None or conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


async def _close_quietly(conn: psycopg.AsyncConnection[tuple[Any, ...]] | None) -> None:
    if conn is not None:
        with contextlib.suppress(psycopg.Error, OSError):
            await conn.close()
