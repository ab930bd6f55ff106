"""Following the catalog changes of other registries that share the store: the store tells
(`CatalogStore.follow`) which scopes another registry changed, or that anything may have
changed, and they are reloaded into this registry's catalog (`Catalog.refresh`), merged and
retried as `change_follow` does."""

from __future__ import annotations

from registry_service.domain.catalog import Catalog
from registry_service.domain.change_follow import RETRY_S, ChangeFollower


class CatalogFollower(ChangeFollower):
    def __init__(self, catalog: Catalog, *, retry_s: float = RETRY_S) -> None:
        super().__init__(catalog.refresh, "catalog", retry_s=retry_s)
