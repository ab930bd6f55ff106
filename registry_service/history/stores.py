"""Opens the configured store (`history_store` setting) by name: a backend provides the history,
the catalog, the Cordis records and the approval records on one database."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from registry_service.domain.approval_records import ApprovalStore
from registry_service.domain.cordis.activation_records import ActivationStore
from registry_service.domain.cordis.host_leases import HostLeases
from registry_service.domain.cordis.state import CordisStore
from registry_service.history.catalog_store import CatalogStore
from registry_service.history.postgres.defaults import DEFAULT_LEASE_S, DEFAULT_STATEMENT_TIMEOUT_S
from registry_service.history.sqlite import SqliteHistory
from registry_service.history.store import HistoryStore, StoreOpenError


@dataclass(frozen=True, slots=True)
class Stores:
    """What one backend provides, on the same database."""

    history: HistoryStore
    catalog: CatalogStore
    cordis: CordisStore
    approvals: ApprovalStore
    host_leases: HostLeases
    activations: ActivationStore


@dataclass(frozen=True)
class StoreOptions:
    path: str = ":memory:"  # sqlite: history_path
    dsn: str = ""  # postgres: history_dsn
    max_inline_bytes: int = 64 * 1024
    lease_s: float = DEFAULT_LEASE_S  # postgres: history_writer_lease_s
    statement_timeout_s: float = DEFAULT_STATEMENT_TIMEOUT_S  # postgres: every connection's


def _sqlite(options: StoreOptions) -> Stores:
    path = options.path
    if path != ":memory:":
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            message = f"cannot create the directory of history_path {path}: {exc}"
            raise StoreOpenError(message) from exc
    history = SqliteHistory(path, max_inline_bytes=options.max_inline_bytes)
    return Stores(
        history,
        history.catalog(),
        history.cordis(),
        history.approvals(),
        history.host_leases(),
        history.activations(),
    )


# The PostgreSQL modules are imported by the openers: psycopg is ~12 MiB that a registry on
# SQLite would hold for nothing.


def _postgres(options: StoreOptions) -> Stores:
    from registry_service.history.postgres.store import PostgresHistory

    history = PostgresHistory(
        options.dsn,
        max_inline_bytes=options.max_inline_bytes,
        lease_s=options.lease_s,
        statement_timeout_s=options.statement_timeout_s,
    )
    return Stores(
        history,
        history.catalog(),
        history.cordis(),
        history.approvals(),
        history.host_leases(),
        history.activations(),
    )


# Store name -> the opener of its history, catalog and Cordis records.
STORES: dict[str, Callable[[StoreOptions], Stores]] = {"sqlite": _sqlite, "postgres": _postgres}


def check_name(name: str) -> None:
    """StoreOpenError unless `name` is a known store."""
    if name not in STORES:
        known = ", ".join(sorted(STORES))
        raise StoreOpenError(f"history_store {name!r} is not a known store (known: {known})")


def check_options(name: str, dsn: str) -> None:
    """StoreOpenError when the store's own settings are missing or unreadable."""
    check_name(name)
    if name != "postgres":
        return
    if not dsn:
        raise StoreOpenError(
            "history_store 'postgres' needs history_dsn (or CODEMODE_REGISTRY_HISTORY_DSN), "
            "e.g. postgresql://user@host:5432/codemode"
        )
    from registry_service.history.postgres.connect import check_dsn

    if reason := check_dsn(dsn):
        raise StoreOpenError(f"history_dsn is not a PostgreSQL connection string: {reason}")


def open_store(name: str, options: StoreOptions) -> Stores:
    """The stores of backend `name`; StoreOpenError when it is unknown or cannot be opened."""
    check_options(name, options.dsn)
    return STORES[name](options)
