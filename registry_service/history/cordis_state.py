"""Durable Cordis state in the registry's SQLite database (the `cordis_durable` setting).

One row holds the newest snapshot (see `domain.cordis.durable`) in its own table of the history
database (`history_path`), through its own connection: the history's batching and health are
left alone, and WAL lets both connections work side by side."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from registry_service.history.store import StoreOpenError, store_unavailable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cordis_state (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  body TEXT NOT NULL
);
"""


class SqliteCordisState:
    def __init__(self, path: str | Path) -> None:
        self._path = str(path)
        if self._path == ":memory:":
            raise StoreOpenError(
                "cordis_durable keeps Cordis state in the history database: set history_path "
                "to a file (it is :memory:)"
            )
        try:
            self._db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout = 5000")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreOpenError(f"cannot open the Cordis state in {self._path}: {exc}") from exc
        self._lock = asyncio.Lock()

    def load(self) -> str | None:
        row = self._db.execute("SELECT body FROM cordis_state WHERE id = 1").fetchone()
        return None if row is None else str(row[0])

    async def save(self, body: str) -> None:
        async with self._lock:  # one write at a time, in the order they were asked for
            try:
                await asyncio.to_thread(self._save, body)
            except sqlite3.Error as exc:
                raise store_unavailable(f"cannot save the Cordis state: {exc}") from exc

    def _save(self, body: str) -> None:
        self._db.execute(
            "INSERT INTO cordis_state (id, body) VALUES (1, ?)"
            " ON CONFLICT (id) DO UPDATE SET body = excluded.body",
            (body,),
        )

    async def close(self) -> None:
        async with self._lock:
            self._db.close()
