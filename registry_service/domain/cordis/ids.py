"""Cordis identities: `<prefix>-<n>` plugin ids with one counter shared by all
prefixes, `pkg-<n>`, `run-<n>`, `approval-<n>`, `inspect-<n>`. Counters live as long as the
registry process (or its store, when Cordis state is durable) and never hand out an id twice."""

from __future__ import annotations

import re
from collections.abc import Container

from registry_service.domain.cordis.refusals import CordisError

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
    """The counters (the last number handed out of each kind); `counters()` and `restore()`
    carry them across a restart when Cordis state is durable, so no id is handed out twice."""

    _KINDS = ("plugins", "packages", "runs", "approvals", "inspects")

    def __init__(self) -> None:
        self._last = dict.fromkeys(self._KINDS, 0)  # plugins: shared by every prefix

    def _next(self, kind: str) -> int:
        self._last[kind] += 1
        return self._last[kind]

    def counters(self) -> dict[str, int]:
        return dict(self._last)

    def restore(self, counters: dict[str, int]) -> None:
        for kind in self._KINDS:
            self._last[kind] = max(self._last[kind], int(counters.get(kind, 0)))

    def plugin(self, prefix: str, taken: Container[str]) -> str:
        while True:
            candidate = f"{prefix}-{self._next('plugins')}"
            if candidate not in taken:
                return candidate

    def package(self) -> str:
        return f"pkg-{self._next('packages')}"

    def run(self) -> str:
        return f"run-{self._next('runs')}"

    def approval(self) -> str:
        return f"approval-{self._next('approvals')}"

    def inspect(self) -> str:
        return f"inspect-{self._next('inspects')}"
