"""Store kits for the conformance suites (history and catalog): one per store implementation
(today SQLite).
A kit opens the store on a backing of its own and can break it for real: fill its disk, free
it again, damage its data."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from registry_service.history.sqlite import SqliteHistory
from registry_service.history.store import HistoryStore
from registry_service.history.stores import Stores, open_store
from tests.registry.history.disk import SmallDisk, require, small_disk


@dataclass
class StoreKit:
    name: str
    open: Callable[..., HistoryStore]
    """`open(max_inline_bytes=...)`: the store on the kit's backing (again after a close)."""
    open_stores: Callable[[], Stores]
    """The history and catalog stores on the kit's backing, as the registry opens them."""
    corrupt: Callable[[], None]
    """Damages the stored data past its header (call it with the store closed)."""
    where: Path
    _disk: SmallDisk | str

    @property
    def disk(self) -> SmallDisk:
        """The kit's own small disk (skips the test when none could be mounted)."""
        return require(self._disk)


def corrupt_sqlite_file(path: Path) -> None:
    """Overwrites every page after the first (the header and schema stay intact), the way a
    failing disk or a stray write would."""
    page = 4096
    size = path.stat().st_size
    assert size > page, "the database has no page past its first to damage"
    with path.open("r+b") as out:
        out.seek(page)
        out.write(bytes((n * 37 + 11) % 251 for n in range(size - page)))
        out.flush()
        os.fsync(out.fileno())


@pytest.fixture(params=["sqlite"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKit]:
    where = tmp_path / "disk"
    with small_disk(where) as disk:
        path = where / "history.sqlite3"

        def open_sqlite(max_inline_bytes: int = 64 * 1024) -> HistoryStore:
            return SqliteHistory(path, max_inline_bytes=max_inline_bytes)

        def open_stores() -> Stores:
            return open_store("sqlite", path=str(path), max_inline_bytes=64 * 1024)

        corrupt = lambda: corrupt_sqlite_file(path)  # noqa: E731
        yield StoreKit("sqlite", open_sqlite, open_stores, corrupt, where, disk)
