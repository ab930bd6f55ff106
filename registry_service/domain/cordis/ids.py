"""Cordis identities (reference §9.1): `<prefix>-<n>` plugin ids with one counter shared by all
prefixes, `pkg-<n>`, `run-<n>`, `approval-<n>`, `inspect-<n>`. Counters live as long as the
registry process and never hand out an id twice."""

from __future__ import annotations

import itertools
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
    def __init__(self) -> None:
        self._plugins = itertools.count(1)  # shared by every prefix: `clock-1`, then `panel-2`
        self._packages = itertools.count(1)
        self._runs = itertools.count(1)
        self._approvals = itertools.count(1)
        self._inspects = itertools.count(1)

    def plugin(self, prefix: str, taken: Container[str]) -> str:
        while True:
            candidate = f"{prefix}-{next(self._plugins)}"
            if candidate not in taken:
                return candidate

    def package(self) -> str:
        return f"pkg-{next(self._packages)}"

    def run(self) -> str:
        return f"run-{next(self._runs)}"

    def approval(self) -> str:
        return f"approval-{next(self._approvals)}"

    def inspect(self) -> str:
        return f"inspect-{next(self._inspects)}"
