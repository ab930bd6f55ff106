"""Connecting to the history database: the DSN's password never reaches a log line."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from registry_service.history.postgres.defaults import DEFAULT_STATEMENT_TIMEOUT_S

CONNECT_TIMEOUT_S = 5
# libpq connection parameters of every connection: a server that vanished without closing the
# connection (a partition, a dead host) fails the statement in about ten seconds instead of
# leaving a batch, and every caller waiting on it, pending for TCP's default of many minutes.
CONNECT_PARAMS: dict[str, int] = {
    "connect_timeout": CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # ms unacknowledged before the connection is dropped
}


def redact(dsn: str) -> str:
    """The DSN as it may be logged: host, port and database, never the password."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(an unreadable DSN)"
    host, port, name = (params.get(k, "") for k in ("host", "port", "dbname"))
    return f"postgresql://{host}{':' if port else ''}{port}/{name}"


def check_dsn(dsn: str) -> str:
    """A one-line reason when `dsn` is not a connection string psycopg can read, else ""."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        return str(exc).strip().splitlines()[0]
    return ""


# A commit that returns before its WAL is flushed (`synchronous_commit = off`, a server's or a
# role's setting) is lost when the server crashes a moment later, while the caller was already
# told its call succeeded. The store's sessions wait for the local flush at least; a stronger
# setting (`on` with standbys, `remote_apply`) is kept.
_COMMIT_SETTING = "SELECT current_setting('synchronous_commit')"
_DURABLE_COMMITS = "SET synchronous_commit = local"


def connect_sync(
    dsn: str, statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S
) -> psycopg.Connection[tuple[Any, ...]]:
    """A blocking autocommit connection, for what runs once at start (migrations, leases,
    loading the Cordis state) before the event loop serves."""
    conn = psycopg.connect(_with_defaults(dsn, statement_timeout_s), autocommit=True)
    try:
        row = conn.execute(_COMMIT_SETTING).fetchone()
        if row is not None and row[0] == "off":
            conn.execute(_DURABLE_COMMITS)
    except BaseException:
        conn.close()
        raise
    return conn


async def connect_async(
    dsn: str, statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S
) -> psycopg.AsyncConnection[tuple[Any, ...]]:
    """An autocommit connection for the event loop."""
    conn = await psycopg.AsyncConnection.connect(
        _with_defaults(dsn, statement_timeout_s), autocommit=True
    )
    try:
        row = await (await conn.execute(_COMMIT_SETTING)).fetchone()
        if row is not None and row[0] == "off":
            await conn.execute(_DURABLE_COMMITS)
    except BaseException:
        await conn.close()
        raise
    return conn


def _with_defaults(dsn: str, statement_timeout_s: float) -> str:
    """The DSN with `CONNECT_PARAMS` where it does not set them itself (its own win), and the
    statement timeout as a session setting (before the DSN's own `options`: a
    `-c statement_timeout` there comes later, and wins)."""
    params = {**CONNECT_PARAMS, **conninfo_to_dict(dsn)}
    timeout = f"-c statement_timeout={max(1, round(statement_timeout_s * 1000))}"
    params["options"] = f"{timeout} {params.get('options', '')}".strip()
    return make_conninfo("", **params)
