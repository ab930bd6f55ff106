"""A rare write beside the history on its SQLite connection (a Cordis change, an approval):
one transaction, all or nothing, synced to the disk, since it is answered as done."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator

from codemode_wire.errors import CodemodeError


@contextlib.contextmanager
def synced_transaction(
    db: sqlite3.Connection,
    failed: Callable[[BaseException], CodemodeError],
    refuse_if_corrupt: Callable[[], None],
) -> Iterator[sqlite3.Connection]:
    """The history commits without a sync (it survives a crash of the process, not of the
    machine); this commit syncs the log as well. The caller's own refusals roll back too, and
    a database error is reported through the history's `failed` (one database, one health)."""
    refuse_if_corrupt()
    try:
        if db.in_transaction:  # left open by a ROLLBACK that failed
            db.execute("ROLLBACK")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("BEGIN IMMEDIATE")
        yield db
        db.execute("COMMIT")
    except BaseException as exc:
        if db.in_transaction:  # a failed COMMIT (SQLITE_FULL) may have rolled back
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise failed(exc) from exc
        raise
    finally:
        with contextlib.suppress(sqlite3.Error):
            db.execute("PRAGMA synchronous=NORMAL")
