"""Durable Cordis state in the PostgreSQL history database (`cordis_durable` with
`history_store: postgres`): the newest snapshot (see `domain.cordis.durable`) in the one-row
`cordis_state` table, through a connection of its own, so the history's batching and health are
left alone. The table comes with the history schema (migrations).

Cordis state is per registry process: plugins, their runs and host halves live in the registry
that defined them, and calls on another replica do not see them. The stored snapshot is one
per database, each save the whole state of the registry that saved it, so with several
registries on one database the last to save wins; a registry that starts beside live others
says so in its log. Run `cordis_durable` with one registry per database."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from registry_service.history.postgres.connect import (
    connect_async,
    connect_sync,
    redact,
)
from registry_service.history.postgres.defaults import DEFAULT_STATEMENT_TIMEOUT_S
from registry_service.history.postgres.migrations import migrate
from registry_service.history.store import StoreOpenError, store_unavailable

log = logging.getLogger(__name__)

_LIVE_WRITERS = "SELECT count(*) FROM history_writers WHERE expires_at > now()"
_SAVE = (
    "INSERT INTO cordis_state (id, body) VALUES (1, %s)"
    " ON CONFLICT (id) DO UPDATE SET body = excluded.body"
)


class PostgresCordisState:
    def __init__(self, dsn: str, statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S) -> None:
        self._dsn = dsn
        self._statement_timeout_s = statement_timeout_s
        self._conn: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        self._lock = asyncio.Lock()
        try:
            with connect_sync(dsn, statement_timeout_s) as conn:
                migrate(conn)  # at its version already when the history store opened first
                row = conn.execute("SELECT body FROM cordis_state WHERE id = 1").fetchone()
                others = conn.execute(_LIVE_WRITERS).fetchone()
        except psycopg.Error as exc:
            where = redact(dsn)
            raise StoreOpenError(f"cannot open the Cordis state in {where}: {exc}") from exc
        self._loaded = None if row is None else str(row[0])
        if others is not None and int(others[0]) > 1:  # this registry's own writer, and more
            log.warning(
                "cordis_durable: %d registries write to %s; the Cordis state is per registry "
                "and its one stored snapshot is the last saver's (run one registry per database "
                "with cordis_durable)",
                int(others[0]),
                redact(dsn),
            )

    def load(self) -> str | None:
        return self._loaded

    async def save(self, body: str) -> None:
        async with self._lock:  # one write at a time, in the order they were asked for
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = await connect_async(self._dsn, self._statement_timeout_s)
                await self._conn.execute(_SAVE, (body,))
            except psycopg.Error as exc:
                raise store_unavailable(f"cannot save the Cordis state: {exc}") from exc

    async def close(self) -> None:
        async with self._lock:
            if self._conn is not None:
                with contextlib.suppress(psycopg.Error, OSError):
                    await self._conn.close()
