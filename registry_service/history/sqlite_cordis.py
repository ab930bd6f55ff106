"""The SQLite Cordis store (domain/cordis/state.py): plugins, packages, grants and the id
counters as records in the history database.

Like the catalog it shares the history's connection and the event-loop thread its writes run
on: a write is a handful of rows committed between two history batches, never inside one. One
registry owns a SQLite file, so no other registry's change is ever followed."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Collection, Mapping

from codemode_wire.errors import CodemodeError
from registry_service.domain.cordis.model import Package
from registry_service.domain.cordis.state import (
    CordisFollower,
    CordisSnapshot,
    PackageImmutable,
    PackageRow,
    PluginRow,
    StaleWrite,
)
from registry_service.history import cordis_rows as rows
from registry_service.history.sqlite_writes import synced_transaction


class SqliteCordis:
    def __init__(
        self,
        db: sqlite3.Connection,
        failed: Callable[[BaseException], CodemodeError],
        refuse_if_corrupt: Callable[[], None],
    ) -> None:
        self._db = db
        self._failed = failed  # the history's: one database, one health
        self._refuse_if_corrupt = refuse_if_corrupt

    def follow(self, changed: CordisFollower) -> None:
        """Never called: a SQLite file has one registry, whose own changes it already has."""

    def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return synced_transaction(self._db, self._failed, self._refuse_if_corrupt)

    async def next_id(self, kind: str) -> int:
        with self._transaction() as db:
            [(last,)] = db.execute(
                "INSERT INTO cordis_ids (kind, last) VALUES (?, 1) ON CONFLICT (kind)"
                " DO UPDATE SET last = last + 1 RETURNING last",
                (kind,),
            ).fetchall()
        return int(last)

    async def raise_ids(self, counters: Mapping[str, int]) -> None:
        with self._transaction() as db:
            for kind, last in sorted(counters.items()):
                db.execute(
                    "INSERT INTO cordis_ids (kind, last) VALUES (?, ?) ON CONFLICT (kind)"
                    " DO UPDATE SET last = max(last, excluded.last)",
                    (kind, int(last)),
                )

    async def load(self, plugin_ids: Collection[str] | None = None) -> CordisSnapshot:
        self._refuse_if_corrupt()
        wanted = None if plugin_ids is None else set(plugin_ids)
        try:  # one connection, one thread: the three reads see one state
            plugins = self._db.execute(
                f"SELECT {rows.PLUGIN_COLUMNS} FROM cordis_plugins ORDER BY plugin_id"
            ).fetchall()
            packages = self._db.execute(
                f"SELECT {rows.PACKAGE_COLUMNS} FROM cordis_packages ORDER BY position"
            ).fetchall()
            grants = self._db.execute(
                "SELECT plugin_id, package_id FROM cordis_grants ORDER BY plugin_id, package_id"
            ).fetchall()
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc

        def keep(plugin_id: object) -> bool:
            return wanted is None or str(plugin_id) in wanted

        return CordisSnapshot(
            [rows.plugin_of(row) for row in plugins if keep(row[0])],
            [rows.package_of(row) for row in packages if keep(row[0])],
            [(str(p), str(k)) for p, k in grants if keep(p)],
        )

    async def create_plugin(self, row: PluginRow, first: Package) -> None:
        with self._transaction() as db:
            cursor = db.execute(
                f"INSERT INTO cordis_plugins ({rows.PLUGIN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (plugin_id) DO NOTHING",
                (
                    row.plugin_id,
                    row.owner,
                    row.owner_id,
                    row.current,
                    row.next,
                    int(row.any_version_approved),
                    row.revision,
                ),
            )
            if cursor.rowcount != 1:
                raise StaleWrite(row.plugin_id)
            _insert_package(db, row.plugin_id, first)

    async def add_package(self, plugin_id: str, package: Package) -> None:
        with self._transaction() as db:
            if not _exists(db, plugin_id):
                raise StaleWrite(plugin_id)
            _insert_package(db, plugin_id, package)

    async def set_pointers(
        self, plugin_id: str, current: str | None, next_: str | None, *, revision: int
    ) -> int:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE cordis_plugins SET current_package = ?, next_package = ?,"
                " revision = revision + 1 WHERE plugin_id = ? AND revision = ?",
                (current, next_, plugin_id, revision),
            )
            if cursor.rowcount != 1:
                raise StaleWrite(plugin_id)
        return revision + 1

    async def grant(self, plugin_id: str, package_id: str, *, any_version: bool) -> None:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE cordis_plugins SET any_version_approved = any_version_approved OR ?"
                " WHERE plugin_id = ?",
                (int(any_version), plugin_id),
            )
            if cursor.rowcount != 1:
                raise StaleWrite(plugin_id)
            db.execute(
                "INSERT INTO cordis_grants (plugin_id, package_id) VALUES (?, ?)"
                " ON CONFLICT DO NOTHING",
                (plugin_id, package_id),
            )

    async def delete_plugin(self, plugin_id: str) -> None:
        with self._transaction() as db:
            for table in ("cordis_plugins", "cordis_packages", "cordis_grants"):
                db.execute(f"DELETE FROM {table} WHERE plugin_id = ?", (plugin_id,))

    async def take_legacy(self) -> str | None:
        with self._transaction() as db:
            taken = db.execute("DELETE FROM cordis_state RETURNING body").fetchall()
        return str(taken[0][0]) if taken else None


def _exists(db: sqlite3.Connection, plugin_id: str) -> bool:
    row = db.execute("SELECT 1 FROM cordis_plugins WHERE plugin_id = ?", (plugin_id,)).fetchone()
    return row is not None


def _insert_package(db: sqlite3.Connection, plugin_id: str, package: Package) -> None:
    """Inserts the package; nothing when it is stored already with this content (a write
    repeated), `PackageImmutable` when with other content."""
    cursor = db.execute(
        f"INSERT INTO cordis_packages ({rows.PACKAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (package_id) DO NOTHING",
        rows.package_values(plugin_id, package),
    )
    if cursor.rowcount == 1:
        return
    stored = db.execute(
        f"SELECT {rows.PACKAGE_COLUMNS} FROM cordis_packages WHERE package_id = ?",
        (package.package_id,),
    ).fetchone()
    if stored is None or rows.package_of(stored) != PackageRow(plugin_id, package):
        raise PackageImmutable(package.package_id)
