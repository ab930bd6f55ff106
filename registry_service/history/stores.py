"""Opens the configured history store (`history_store` setting) by name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from registry_service.history.sqlite import SqliteHistory
from registry_service.history.store import HistoryStore, StoreOpenError


def _sqlite(path: str, max_inline_bytes: int) -> HistoryStore:
    if path != ":memory:":
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            message = f"cannot create the directory of history_path {path}: {exc}"
            raise StoreOpenError(message) from exc
    return SqliteHistory(path, max_inline_bytes=max_inline_bytes)


# Store name -> opener(history_path, max_inline_bytes). A server database adds its entry here.
STORES: dict[str, Callable[[str, int], HistoryStore]] = {"sqlite": _sqlite}


def check_name(name: str) -> None:
    """StoreOpenError unless `name` is a known store."""
    if name not in STORES:
        known = ", ".join(sorted(STORES))
        raise StoreOpenError(f"history_store {name!r} is not a known store (known: {known})")


def open_store(name: str, *, path: str, max_inline_bytes: int) -> HistoryStore:
    """The store `name`; StoreOpenError when it is unknown or cannot be opened."""
    check_name(name)
    return STORES[name](path, max_inline_bytes)
