"""The SQLite Cordis host leases (domain/cordis/host_leases.py). One registry owns a SQLite
file, so its leases only ever name that registry; they are kept for the one contract, and so a
restarted registry finds no lease of its former self alive (expired by the wall clock)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator

from codemode_wire.errors import CodemodeError
from registry_service.domain.cordis.host_leases import (
    ANONYMOUS,
    HostLease,
    Principal,
    principal_of,
)

_COLUMNS = "plugin_id, owner, address, epoch, expires_at, principal_kind, principal_name"


class SqliteHostLeases:
    def __init__(
        self,
        db: sqlite3.Connection,
        failed: Callable[[BaseException], CodemodeError],
        refuse_if_corrupt: Callable[[], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db = db
        self._failed = failed  # the history's: one database, one health
        self._refuse_if_corrupt = refuse_if_corrupt
        self._clock = clock

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._refuse_if_corrupt()
        db = self._db
        try:
            if db.in_transaction:
                db.execute("ROLLBACK")
            db.execute("BEGIN IMMEDIATE")
            yield db
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._failed(exc) from exc
            raise

    def _lease(self, row: tuple[object, ...], now: float) -> HostLease:
        plugin_id, owner, address, epoch, expires_at, kind, name = row
        return HostLease(
            str(plugin_id),
            str(owner),
            str(address),
            int(str(epoch)),
            float(str(expires_at)) - now,
            principal_of(str(kind), str(name)),
        )

    async def acquire(
        self,
        plugin_id: str,
        owner: str,
        address: str,
        ttl_s: float,
        *,
        principal: Principal = ANONYMOUS,
    ) -> HostLease | None:
        with self._transaction() as db:
            now = self._clock()
            row = db.execute(
                f"SELECT {_COLUMNS} FROM cordis_host_leases WHERE plugin_id = ?", (plugin_id,)
            ).fetchone()
            epoch = 1
            if row is not None:
                held = self._lease(row, now)
                if held.owner == owner and not held.expired:
                    epoch = held.epoch
                elif not held.expired:
                    return None
                else:
                    epoch = held.epoch + 1
            db.execute(
                f"INSERT INTO cordis_host_leases ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (plugin_id) DO UPDATE SET owner = excluded.owner,"
                " address = excluded.address, epoch = excluded.epoch,"
                " expires_at = excluded.expires_at, principal_kind = excluded.principal_kind,"
                " principal_name = excluded.principal_name",
                (plugin_id, owner, address, epoch, now + ttl_s, principal.kind, principal.name),
            )
        return HostLease(plugin_id, owner, address, epoch, ttl_s, principal)

    async def renew(self, lease: HostLease, ttl_s: float) -> HostLease | None:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE cordis_host_leases SET expires_at = ?"
                " WHERE plugin_id = ? AND owner = ? AND epoch = ?",
                (self._clock() + ttl_s, lease.plugin_id, lease.owner, lease.epoch),
            )
        if cursor.rowcount != 1:
            return None
        return HostLease(
            lease.plugin_id, lease.owner, lease.address, lease.epoch, ttl_s, lease.principal
        )

    async def release(self, lease: HostLease) -> None:
        with self._transaction() as db:
            db.execute(
                "DELETE FROM cordis_host_leases WHERE plugin_id = ? AND owner = ? AND epoch = ?",
                (lease.plugin_id, lease.owner, lease.epoch),
            )

    async def expire(self, owner: str) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE cordis_host_leases SET expires_at = min(expires_at, ?) WHERE owner = ?",
                (self._clock(), owner),
            )

    async def load(self, plugin_ids: Collection[str] | None = None) -> list[HostLease]:
        self._refuse_if_corrupt()
        try:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM cordis_host_leases ORDER BY plugin_id"
            ).fetchall()
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        now = self._clock()
        return [self._lease(row, now) for row in rows if plugin_ids is None or row[0] in plugin_ids]
