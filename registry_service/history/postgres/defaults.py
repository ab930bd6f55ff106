"""The PostgreSQL store's defaults, importable without psycopg: the settings and the store
registry name them on every registry, and psycopg (~12 MiB) is imported only by one that opens
a PostgreSQL store."""

from __future__ import annotations

# The server ends a statement that runs (or waits for a lock) longer than this: a lock another
# session holds, or a runaway query, fails the call with an error instead of leaving it, and
# the batch or change behind it, waiting for good. Generous: a batch takes milliseconds.
DEFAULT_STATEMENT_TIMEOUT_S = 30.0
DEFAULT_LEASE_S = 15.0
"""How long a registry's writer lease lasts without renewal (history_writer_lease_s)."""
