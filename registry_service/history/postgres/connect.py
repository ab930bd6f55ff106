"""Connecting to the history database: the DSN's password never reaches a log line."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

CONNECT_TIMEOUT_S = 5


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


def connect_sync(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A blocking autocommit connection, for what runs once at start (migrations, leases,
    loading the Cordis state) before the event loop serves."""
    return psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
