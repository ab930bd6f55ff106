"""The Cordis records' rows (domain/cordis/state.py), shared by the SQLite and the PostgreSQL
store: the columns and the mapping from a row to a record."""

from __future__ import annotations

from collections.abc import Sequence

from registry_service.domain.cordis.model import Package
from registry_service.domain.cordis.state import PackageRow, PluginRow

PLUGIN_COLUMNS = (
    "plugin_id, owner, owner_id, current_package, next_package, any_version_approved, revision"
)
PACKAGE_COLUMNS = "plugin_id, package_id, name, purpose, host, client"


def package_values(plugin_id: str, package: Package) -> tuple[object, ...]:
    """A package's row, in `PACKAGE_COLUMNS` order."""
    return (
        plugin_id,
        package.package_id,
        package.name,
        package.purpose,
        package.host,
        package.client,
    )


def plugin_of(row: Sequence[object]) -> PluginRow:
    plugin_id, owner, owner_id, current, next_, any_version, revision = row
    return PluginRow(
        str(plugin_id),
        str(owner),
        str(owner_id),
        None if current is None else str(current),
        None if next_ is None else str(next_),
        bool(any_version),
        int(str(revision)),
    )


def package_of(row: Sequence[object]) -> PackageRow:
    plugin_id, package_id, name, purpose, host, client = row
    return PackageRow(
        str(plugin_id),
        Package(
            str(package_id),
            str(name),
            str(purpose),
            None if host is None else str(host),
            None if client is None else str(client),
        ),
    )
