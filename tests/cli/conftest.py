"""The real PostgreSQL fixtures, for the CLI tests that run registries on a shared store."""

from __future__ import annotations

from tests.postgres_server import pg_database, postgres

__all__ = ["pg_database", "postgres"]
