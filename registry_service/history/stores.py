"""Opens the configured store (`history_store` setting) by name: a backend provides the history
and the catalog on one database."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from registry_service.history.catalog_store import CatalogStore
from registry_service.history.sqlite import SqliteHistory
from registry_service.history.store import HistoryStore, StoreOpenError


@dataclass(frozen=True, slots=True)
class Stores:
    """What one backend provides, on the same database."""

    history: HistoryStore
    catalog: CatalogStore


def _sqlite(path: str, max_inline_bytes: int) -> Stores:
    if path != ":memory:":
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            message = f"cannot create the directory of history_path {path}: {exc}"
            raise StoreOpenError(message) from exc
    history = SqliteHistory(path, max_inline_bytes=max_inline_bytes)
    return Stores(history, history.catalog())


# Store name -> opener(history_path, max_inline_bytes). A server database adds its entry here.
STORES: dict[str, Callable[[str, int], Stores]] = {"sqlite": _sqlite}


def check_name(name: str) -> None:
    """StoreOpenError unless `name` is a known store."""
    if name not in STORES:
        known = ", ".join(sorted(STORES))
        raise StoreOpenError(f"history_store {name!r} is not a known store (known: {known})")


def open_store(name: str, *, path: str, max_inline_bytes: int) -> Stores:
    """The store `name`; StoreOpenError when it is unknown or cannot be opened."""
    check_name(name)
    return STORES[name](path, max_inline_bytes)
