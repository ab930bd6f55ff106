"""The PostgreSQL Cordis host leases (domain/cordis/host_leases.py), shared by every registry
on the database. Expiry is judged by the database's `now()`; each change of a lease notifies
the plugin on the Cordis channel (in its transaction, so once committed), so the other
registries re-read where the plugin's host runs."""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from registry_service.domain.cordis.host_leases import (
    ANONYMOUS,
    HostLease,
    Principal,
    principal_of,
)
from registry_service.history.postgres.catalog import write_note
from registry_service.history.postgres.cordis import CORDIS_CHANNEL

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

_READ = (
    "plugin_id, owner, address, epoch, extract(epoch FROM expires_at - now())::double precision,"
    " principal_kind, principal_name"
)
# Taken when absent, expired, or already the caller's; the epoch rises on a change of hands.
_ACQUIRE = (
    "INSERT INTO cordis_host_leases AS l"
    " (plugin_id, owner, address, epoch, expires_at, principal_kind, principal_name)"
    " VALUES (%(p)s, %(o)s, %(a)s, 1, now() + make_interval(secs => %(t)s), %(k)s, %(n)s)"
    " ON CONFLICT (plugin_id) DO UPDATE SET owner = excluded.owner, address = excluded.address,"
    " principal_kind = excluded.principal_kind, principal_name = excluded.principal_name,"
    " epoch = CASE WHEN l.owner = excluded.owner AND l.expires_at > now() THEN l.epoch"
    " ELSE l.epoch + 1 END, expires_at = excluded.expires_at"
    " WHERE l.owner = excluded.owner OR l.expires_at <= now()"
    f" RETURNING {_READ.replace('plugin_id', 'l.plugin_id')}"
)


class PostgresHostLeases:
    def __init__(
        self, connection: Callable[[], AbstractAsyncContextManager[Conn]], writer_id: str
    ) -> None:
        self._connection = connection  # the history's reads: its lock, errors and health
        self._writer_id = writer_id

    async def _notify(self, conn: Conn, plugin_ids: Collection[str]) -> None:
        if plugin_ids:
            await conn.execute(
                "SELECT pg_notify(%s, %s)",
                (CORDIS_CHANNEL, write_note(self._writer_id, plugin_ids)),
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
        values = {
            "p": plugin_id,
            "o": owner,
            "a": address,
            "t": ttl_s,
            "k": principal.kind,
            "n": principal.name,
        }
        async with self._connection() as conn, conn.transaction():
            row = await (await conn.execute(_ACQUIRE, values)).fetchone()
            if row is None:
                return None
            await self._notify(conn, [plugin_id])
        return _lease(row)

    async def renew(self, lease: HostLease, ttl_s: float) -> HostLease | None:
        async with self._connection() as conn, conn.transaction():
            row = await (
                await conn.execute(
                    "UPDATE cordis_host_leases SET expires_at = now() + make_interval(secs => %s)"
                    f" WHERE plugin_id = %s AND owner = %s AND epoch = %s RETURNING {_READ}",
                    (ttl_s, lease.plugin_id, lease.owner, lease.epoch),
                )
            ).fetchone()
        return None if row is None else _lease(row)

    async def release(self, lease: HostLease) -> None:
        async with self._connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "DELETE FROM cordis_host_leases WHERE plugin_id = %s AND owner = %s AND epoch = %s",
                (lease.plugin_id, lease.owner, lease.epoch),
            )
            if cursor.rowcount:
                await self._notify(conn, [lease.plugin_id])

    async def expire(self, owner: str) -> None:
        async with self._connection() as conn, conn.transaction():
            rows = await (
                await conn.execute(
                    "UPDATE cordis_host_leases SET expires_at = least(expires_at, now())"
                    " WHERE owner = %s RETURNING plugin_id",
                    (owner,),
                )
            ).fetchall()
            await self._notify(conn, [str(p) for (p,) in rows])

    async def load(self, plugin_ids: Collection[str] | None = None) -> list[HostLease]:
        where, params = (
            ("", ())
            if plugin_ids is None
            else (" WHERE plugin_id = ANY(%s)", (sorted(plugin_ids),))
        )
        async with self._connection() as conn, conn.transaction():
            rows = await (
                await conn.execute(
                    f"SELECT {_READ} FROM cordis_host_leases{where} ORDER BY plugin_id", params
                )
            ).fetchall()
        return [_lease(row) for row in rows]


def _lease(row: Any) -> HostLease:
    plugin_id, owner, address, epoch, remaining, kind, name = row
    return HostLease(
        str(plugin_id),
        str(owner),
        str(address),
        int(epoch),
        float(remaining),
        principal_of(str(kind), str(name)),
    )
