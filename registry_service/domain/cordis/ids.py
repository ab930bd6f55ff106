"""Cordis identities: `<prefix>-<n>` plugin ids with one counter shared by all
prefixes, `pkg-<n>`, `run-<n>`, `approval-<n>`, `inspect-<n>`. The counters live in the Cordis
store (the registry's database, or its memory without one) and never hand out an id twice."""

from __future__ import annotations

import re
from collections.abc import Container

from registry_service.domain.cordis.refusals import CordisError
from registry_service.domain.cordis.state import CordisStore

_PREFIX_RE = re.compile(r"[a-z]{3,6}")
PLUGIN_ID_RE = re.compile(r"[a-z]{3,6}-[0-9]+")


def check_prefix(raw: str) -> str:
    """The model's semantic prefix, trimmed; refused unless it is 3-6 lowercase ASCII letters."""
    prefix = raw.strip()
    if not _PREFIX_RE.fullmatch(prefix):
        raise CordisError(
            "cordis_define `plugin.idPrefix` must contain 3–6 lowercase English letters",
            "invalid-prefix",
        )
    return prefix


class Ids:
    """Mints ids from the Cordis store's counters (domain/cordis/state.py): a number comes from
    the store, never from this process, so registries sharing the store never hand out the
    same id, and a restart goes on where the counters were."""

    def __init__(self, store: CordisStore) -> None:
        self._store = store

    async def plugin(self, prefix: str, taken: Container[str]) -> str:
        while True:  # `taken`: a plugin a legacy snapshot named with a number counted elsewhere
            candidate = f"{prefix}-{await self._store.next_id('plugins')}"
            if candidate not in taken:
                return candidate

    async def package(self) -> str:
        return f"pkg-{await self._store.next_id('packages')}"

    async def run(self) -> str:
        return f"run-{await self._store.next_id('runs')}"

    async def approval(self) -> str:
        return f"approval-{await self._store.next_id('approvals')}"

    async def inspect(self) -> str:
        return f"inspect-{await self._store.next_id('inspects')}"
