"""The PostgreSQL Cordis store (domain/cordis/state.py): plugins, packages, grants and the id
counters as records in the history database, shared by every registry on it.

Like the catalog it reads and writes through the history store's read connection (one write =
one transaction, a failure reported through the history's health). Each write notifies
(`CORDIS_CHANNEL`, in its transaction, so only once committed) the plugin it touched, and the
history store's LISTEN connection hands what other registries changed to this process's
followers. A counter is a row updated in place: its row lock, held to the commit, serializes
the registries that draw from it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

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
from registry_service.history.postgres.catalog import write_note

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

CORDIS_CHANNEL = "codemode_cordis"

_NEXT_ID = (
    "INSERT INTO cordis_ids (kind, last) VALUES (%s, 1)"
    " ON CONFLICT (kind) DO UPDATE SET last = cordis_ids.last + 1 RETURNING last"
)
_RAISE_ID = (
    "INSERT INTO cordis_ids (kind, last) VALUES (%s, %s)"
    " ON CONFLICT (kind) DO UPDATE SET last = greatest(cordis_ids.last, excluded.last)"
)


class PostgresCordis:
    def __init__(
        self,
        connection: Callable[[], AbstractAsyncContextManager[Conn]],
        writer_id: str,
        follow: Callable[[CordisFollower], None],
    ) -> None:
        self._connection = connection  # the history's reads: its lock, errors and health
        self._writer_id = writer_id
        self._follow = follow

    def follow(self, changed: CordisFollower) -> None:
        self._follow(changed)

    async def _notify(self, conn: Conn, plugin_id: str) -> None:
        await conn.execute(
            "SELECT pg_notify(%s, %s)", (CORDIS_CHANNEL, write_note(self._writer_id, [plugin_id]))
        )

    async def next_id(self, kind: str) -> int:
        async with self._connection() as conn, conn.transaction():
            row = await (await conn.execute(_NEXT_ID, (kind,))).fetchone()
        assert row is not None
        return int(row[0])

    async def raise_ids(self, counters: Mapping[str, int]) -> None:
        async with self._connection() as conn, conn.transaction():
            for kind, last in sorted(counters.items()):
                await conn.execute(_RAISE_ID, (kind, int(last)))

    async def load(self, plugin_ids: Collection[str] | None = None) -> CordisSnapshot:
        """Read in one snapshot: a write committed meanwhile is seen whole or not at all."""
        where, params = (
            ("", ())
            if plugin_ids is None
            else (
                " WHERE plugin_id = ANY(%s)",
                (sorted(plugin_ids),),
            )
        )
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            plugins = await (
                await conn.execute(
                    f"SELECT {rows.PLUGIN_COLUMNS} FROM cordis_plugins{where} ORDER BY plugin_id",
                    params,
                )
            ).fetchall()
            packages = await (
                await conn.execute(
                    f"SELECT {rows.PACKAGE_COLUMNS} FROM cordis_packages{where} ORDER BY position",
                    params,
                )
            ).fetchall()
            grants = await (
                await conn.execute(
                    f"SELECT plugin_id, package_id FROM cordis_grants{where}"
                    " ORDER BY plugin_id, package_id",
                    params,
                )
            ).fetchall()
        return CordisSnapshot(
            [rows.plugin_of(row) for row in plugins],
            [rows.package_of(row) for row in packages],
            [(str(p), str(k)) for p, k in grants],
        )

    async def create_plugin(self, row: PluginRow, first: Package) -> None:
        async with self._connection() as conn, conn.transaction():
            cursor = await conn.execute(
                f"INSERT INTO cordis_plugins ({rows.PLUGIN_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (plugin_id) DO NOTHING",
                (
                    row.plugin_id,
                    row.owner,
                    row.owner_id,
                    row.current,
                    row.next,
                    row.any_version_approved,
                    row.revision,
                ),
            )
            if cursor.rowcount != 1:
                raise StaleWrite(row.plugin_id)
            await _insert_package(conn, row.plugin_id, first)
            await self._notify(conn, row.plugin_id)

    async def add_package(self, plugin_id: str, package: Package) -> None:
        async with self._connection() as conn, conn.transaction():
            # Held against a concurrent delete of the plugin until this commits.
            held = await conn.execute(
                "SELECT 1 FROM cordis_plugins WHERE plugin_id = %s FOR SHARE", (plugin_id,)
            )
            if await held.fetchone() is None:
                raise StaleWrite(plugin_id)
            if await _insert_package(conn, plugin_id, package):
                await self._notify(conn, plugin_id)

    async def set_pointers(
        self, plugin_id: str, current: str | None, next_: str | None, *, revision: int
    ) -> int:
        async with self._connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "UPDATE cordis_plugins SET current_package = %s, next_package = %s,"
                " revision = revision + 1 WHERE plugin_id = %s AND revision = %s",
                (current, next_, plugin_id, revision),
            )
            if cursor.rowcount != 1:
                raise StaleWrite(plugin_id)
            await self._notify(conn, plugin_id)
        return revision + 1

    async def grant(self, plugin_id: str, package_id: str, *, any_version: bool) -> None:
        async with self._connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "UPDATE cordis_plugins SET any_version_approved = any_version_approved OR %s"
                " WHERE plugin_id = %s",
                (any_version, plugin_id),
            )
            if cursor.rowcount != 1:
                raise StaleWrite(plugin_id)
            await conn.execute(
                "INSERT INTO cordis_grants (plugin_id, package_id) VALUES (%s, %s)"
                " ON CONFLICT DO NOTHING",
                (plugin_id, package_id),
            )
            await self._notify(conn, plugin_id)

    async def delete_plugin(self, plugin_id: str) -> None:
        async with self._connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "DELETE FROM cordis_plugins WHERE plugin_id = %s", (plugin_id,)
            )
            await conn.execute("DELETE FROM cordis_packages WHERE plugin_id = %s", (plugin_id,))
            await conn.execute("DELETE FROM cordis_grants WHERE plugin_id = %s", (plugin_id,))
            if cursor.rowcount:
                await self._notify(conn, plugin_id)

    async def take_legacy(self) -> str | None:
        async with self._connection() as conn, conn.transaction():
            row = await (await conn.execute("DELETE FROM cordis_state RETURNING body")).fetchone()
        return None if row is None else str(row[0])


async def _insert_package(conn: Conn, plugin_id: str, package: Package) -> bool:
    """Inserts the package; False when it is stored already with this content (a write
    repeated), `PackageImmutable` when with other content."""
    values = rows.package_values(plugin_id, package)
    cursor = await conn.execute(
        f"INSERT INTO cordis_packages ({rows.PACKAGE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (package_id) DO NOTHING",
        values,
    )
    if cursor.rowcount == 1:
        return True
    stored = await (
        await conn.execute(
            f"SELECT {rows.PACKAGE_COLUMNS} FROM cordis_packages WHERE package_id = %s",
            (package.package_id,),
        )
    ).fetchone()
    if stored is None or rows.package_of(stored) != PackageRow(plugin_id, package):
        raise PackageImmutable(package.package_id)
    return False
