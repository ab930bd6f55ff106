"""Store kits for the conformance suites (history and catalog): one per store implementation
(SQLite and PostgreSQL). A kit opens the store on a backing of its own and can break it for
real: fill its disk, free it again, damage its data, stop its server."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from registry_service.history.postgres.store import PostgresHistory
from registry_service.history.sqlite import SqliteHistory
from registry_service.history.store import HistoryStore
from registry_service.history.stores import StoreOptions, Stores, open_store
from tests.postgres_server import PostgresServer
from tests.registry.history.disk import SmallDisk, require, small_disk

STORES = ["sqlite", "postgres"]


@dataclass
class StoreKit:
    name: str
    open: Callable[..., HistoryStore]
    """`open(max_inline_bytes=...)`: the store on the kit's backing (again after a close)."""
    open_stores: Callable[[], Stores]
    """The history and catalog stores on the kit's backing, as the registry opens them."""
    corrupt: Callable[[], None]
    """Damages the stored data past its header (call it with the store closed)."""
    refuse_marked: Callable[[], None]
    """Makes the database itself refuse (a constraint of its own) every record whose
    `error_code` is `REFUSE` or whose `arguments_json` holds `refuse`: a record the store's own
    checks let through, refused by the backend for what it holds."""
    where: Path
    _disk: SmallDisk | str
    server: PostgresServer | None = None
    dsn: str = ""

    @property
    def disk(self) -> SmallDisk:
        """The kit's own small disk (skips the test when none could be mounted)."""
        return require(self._disk)

    def break_backend(self) -> None:
        """Makes every write fail for real until `repair_backend`: SQLite's disk is filled to
        its last byte; PostgreSQL's server is stopped (a lost server). A full tablespace is no
        such failure for PostgreSQL: it fails only the writes that need a new page."""
        if self.server is not None:
            self.server.halt()
        else:
            self.disk.fill()

    def repair_backend(self) -> None:
        if self.server is not None:
            self.server.resume()
        else:
            self.disk.free()


def corrupt_sqlite_file(path: Path) -> None:
    """Overwrites every page after the first (the header and schema stay intact), the way a
    failing disk or a stray write would."""
    corrupt_file(path, 4096)


def corrupt_file(path: Path, page: int) -> None:
    size = path.stat().st_size
    assert size > page, f"{path} has no page past its first to damage"
    with path.open("r+b") as out:
        out.seek(page)
        out.write(bytes((n * 37 + 11) % 251 for n in range(size - page)))
        out.flush()
        os.fsync(out.fileno())


def _sqlite_kit(tmp_path: Path) -> Iterator[StoreKit]:
    where = tmp_path / "disk"
    with small_disk(where) as disk:
        path = where / "history.sqlite3"

        def open_sqlite(max_inline_bytes: int = 64 * 1024) -> HistoryStore:
            return SqliteHistory(path, max_inline_bytes=max_inline_bytes)

        def open_stores() -> Stores:
            return open_store("sqlite", StoreOptions(path=str(path)))

        corrupt = lambda: corrupt_sqlite_file(path)  # noqa: E731

        def refuse_marked() -> None:
            with contextlib.closing(sqlite3.connect(path)) as db:
                db.execute(
                    "CREATE TRIGGER refuse_marked BEFORE INSERT ON records"
                    " WHEN json_extract(NEW.body, '$.error_code') = 'REFUSE'"
                    " OR json_extract(NEW.body, '$.arguments_json') LIKE '%refuse%'"
                    " BEGIN SELECT RAISE(ABORT, 'refused by refuse_marked'); END"
                )

        yield StoreKit("sqlite", open_sqlite, open_stores, corrupt, refuse_marked, where, disk)


def _postgres_kit(server: PostgresServer) -> Iterator[StoreKit]:
    """A database of its own whose tables live in a tablespace on the kit's small disk, so
    filling that disk fails PostgreSQL's writes for real (its WAL stays on the cluster's)."""
    tag = uuid.uuid4().hex[:12]
    where = server.dir / "spaces" / tag
    with small_disk(where, size="48m") as disk:
        tablespace = ""
        if isinstance(disk, SmallDisk):
            space = where / "space"
            space.mkdir()
            shutil.chown(space, server.owner())
            tablespace = f"ts_{tag}"
            server.admin(f"CREATE TABLESPACE {tablespace} LOCATION '{space}'")
        name = server.create_database(tablespace)
        dsn = server.dsn_of(name)

        def open_postgres(max_inline_bytes: int = 64 * 1024) -> HistoryStore:
            return PostgresHistory(dsn, max_inline_bytes=max_inline_bytes)

        def open_stores() -> Stores:
            return open_store("postgres", StoreOptions(dsn=dsn))

        def corrupt() -> None:
            corrupt_postgres(server, dsn)

        def refuse_marked() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "ALTER TABLE history_records ADD CONSTRAINT refuse_marked CHECK"
                    " (error_code <> 'REFUSE' AND arguments_json NOT LIKE '%refuse%')"
                )

        try:
            kit = StoreKit(
                "postgres",
                open_postgres,
                open_stores,
                corrupt,
                refuse_marked,
                where,
                disk,
                server,
                dsn,
            )
            yield kit
        finally:
            if isinstance(disk, SmallDisk):
                disk.free()
            server.drop_database(name)
            if tablespace:
                server.admin(f"DROP TABLESPACE IF EXISTS {tablespace}")


def corrupt_postgres(server: PostgresServer, dsn: str) -> None:
    """Overwrites every page after the first of the history's tables and indexes, with the
    server stopped (so no buffer of a good page is written back over the damage)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_relation_filepath(c.oid) FROM pg_class c"
            " WHERE c.relname LIKE 'history_records%' AND c.relkind IN ('r', 'i')"
        ).fetchall()
        data = Path(str(conn.execute("SHOW data_directory").fetchone()[0]))  # type: ignore[index]
    server.halt()
    try:
        for (relative,) in rows:
            corrupt_file(data / str(relative), 8192)
    finally:
        server.resume()


@pytest.fixture(params=STORES)
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKit]:
    if request.param == "sqlite":
        yield from _sqlite_kit(tmp_path)
    else:
        yield from _postgres_kit(request.getfixturevalue("postgres"))
