"""The tests' real PostgreSQL: one throwaway cluster per test session, started and stopped by
`scripts/postgres`, and a fresh database for each test that asks for one.

A missing PostgreSQL fails the tests that need it; only a developer's CODEMODE_SKIP_POSTGRES=1
turns that into a skip."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "postgres"
SKIP_VARIABLE = "CODEMODE_SKIP_POSTGRES"


@dataclass
class PostgresServer:
    dir: Path
    dsn: str  # the `postgres` database, as its superuser

    @classmethod
    def start(cls) -> PostgresServer:
        if os.environ.get(SKIP_VARIABLE) == "1":
            pytest.skip(f"{SKIP_VARIABLE}=1: the PostgreSQL store's tests are skipped")
        with _not_a_subreaper():
            done = subprocess.run(
                [str(SCRIPT), "start"], capture_output=True, text=True, timeout=600, check=False
            )
        if done.returncode != 0:
            pytest.fail(f"scripts/postgres start failed ({done.returncode}):\n{done.stderr}")
        values = dict(line.split("=", 1) for line in done.stdout.split() if "=" in line)
        return cls(Path(values["CODEMODE_PG_DIR"]), values["CODEMODE_PG_DSN"])

    def stop(self) -> None:
        subprocess.run([str(SCRIPT), "stop", str(self.dir)], timeout=120, check=False)

    def halt(self) -> None:
        """Stops the server (a fast shutdown: connections are cut), keeping its data."""
        subprocess.run([str(SCRIPT), "halt", str(self.dir)], timeout=120, check=True)

    def crash(self) -> None:
        """Stops the server as a crash would (an immediate shutdown: no checkpoint, and what
        its WAL buffers held is lost), keeping its data; `resume` recovers it."""
        subprocess.run([str(SCRIPT), "crash", str(self.dir)], timeout=120, check=True)

    def resume(self) -> None:
        """Starts a halted server again, on the same port."""
        with _not_a_subreaper():
            subprocess.run([str(SCRIPT), "resume", str(self.dir)], timeout=120, check=True)

    def admin(self, sql: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cursor = conn.execute(sql.encode())
            return cursor.fetchall() if cursor.description else []

    def dsn_of(self, database: str) -> str:
        return self.dsn.rsplit("/", 1)[0] + "/" + database

    def create_database(self, tablespace: str = "") -> str:
        """A new empty database (in `tablespace` when given); returns its name."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        where = f" TABLESPACE {tablespace}" if tablespace else ""
        self.admin(f"CREATE DATABASE {name} TEMPLATE template0{where}")
        return name

    def drop_database(self, name: str) -> None:
        self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def owner(self) -> str:
        """The system user the cluster runs as (who must own a tablespace's directory)."""
        return (self.dir / "data").owner()


@contextlib.contextmanager
def _not_a_subreaper() -> Iterator[None]:
    """While the server starts, this process is no child subreaper: the postmaster, orphaned
    when `pg_ctl` exits, goes to init, not to the test process, whose children the runtime
    tests count (tests/runtime/conftest.py makes it a subreaper for their workers' orphans)."""
    libc = ctypes.CDLL(None, use_errno=True)
    flag = ctypes.c_int(0)
    libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, flag.value, 0, 0, 0)


_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The session's PostgreSQL cluster (started on first use)."""
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_database(postgres: PostgresServer) -> Iterator[str]:
    """A fresh database of the session's cluster for this test; yields its DSN."""
    name = postgres.create_database()
    try:
        yield postgres.dsn_of(name)
    finally:
        postgres.drop_database(name)
