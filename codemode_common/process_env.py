"""What every Codemode process reads from its environment at start, outside its settings: the
log level (`CODEMODE_LOG_LEVEL`) and the check that each `CODEMODE_*` variable is one we know.

A misspelt variable (`CODEMODE_REGISTRY_HISTORY_PTH`) would otherwise be ignored silently and
the default used; the warning names the closest known name. The check runs once per process
tree: the first process that checks marks the environment, and the children it starts
(`codemode up`'s services) inherit the mark instead of warning again.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

from pydantic import BaseModel

__all__ = [
    "LOG_LEVELS",
    "LOG_LEVEL_VARIABLE",
    "SERVICE_PREFIXES",
    "configure_logging",
    "known_variables",
    "log_level",
    "needs_check",
    "unknown_variables",
    "warn_unknown_variables",
]

LOG_LEVEL_VARIABLE = "CODEMODE_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_CHECKED_VARIABLE = "CODEMODE_ENV_CHECKED"
_PREFIX = "CODEMODE_"
SERVICE_PREFIXES = ("CODEMODE_REGISTRY_", "CODEMODE_RUNTIME_")
_TOOLING = (
    # Read by the repo's scripts and tests, not by the services.
    "CODEMODE_PYTHON",
    "CODEMODE_IMAGE",
    "CODEMODE_CHROMIUM",
    "CODEMODE_TEST_SECRET",
    "CODEMODE_SKIP_POSTGRES",
    "CODEMODE_PG_DIR",
    "CODEMODE_PG_DSN",
)


def known_variables(settings: Mapping[str, type[BaseModel]]) -> set[str]:
    """Every `CODEMODE_*` name something here reads: each field of each settings class under
    its environment prefix, the log level, and the repo's tooling variables."""
    names = {LOG_LEVEL_VARIABLE, _CHECKED_VARIABLE, *_TOOLING}
    for prefix, model in settings.items():
        names.update(prefix + field.upper() for field in model.model_fields)
    return names


def unknown_variables(
    environ: Mapping[str, str], settings: Mapping[str, type[BaseModel]]
) -> list[tuple[str, str | None]]:
    """Each `CODEMODE_*` name of `environ` that is not known, with the closest known name.
    A name under another service's prefix (not in `settings`) is that service's to check."""
    known = sorted(known_variables(settings))
    elsewhere = tuple(p for p in SERVICE_PREFIXES if p not in settings)
    unknown = sorted(
        name
        for name in environ
        if name.startswith(_PREFIX) and name not in known and not name.startswith(elsewhere)
    )
    return [(name, _closest(name, known)) for name in unknown]


def _closest(name: str, known: list[str]) -> str | None:
    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return matches[0] if matches else None


def needs_check() -> bool:
    """Whether this process should check its `CODEMODE_*` variables (it has some, and no
    parent checked them)."""
    return not os.environ.get(_CHECKED_VARIABLE) and any(n.startswith(_PREFIX) for n in os.environ)


def warn_unknown_variables(
    prog: str, settings: Mapping[str, type[BaseModel]], stream: TextIO | None = None
) -> None:
    """One line on stderr per unknown `CODEMODE_*` variable, once per process tree."""
    if not needs_check():
        return
    os.environ[_CHECKED_VARIABLE] = "1"
    out = stream or sys.stderr
    for name, closest in unknown_variables(os.environ, settings):
        hint = f"; did you mean {closest}?" if closest else ""
        print(f"{prog}: warning: unknown environment variable {name} is ignored{hint}", file=out)


def log_level(override: str | None = None, default: str = "info") -> int:
    """`override` (a `--log-level`), else `CODEMODE_LOG_LEVEL`, else `default`. A value that
    names no level raises ValueError naming the accepted ones."""
    raw = override or os.environ.get(LOG_LEVEL_VARIABLE) or default
    if raw.lower() not in LOG_LEVELS:
        source = "--log-level" if override else LOG_LEVEL_VARIABLE
        raise ValueError(f"{source}: expected one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return int(getattr(logging, raw.upper()))


def configure_logging(level: int) -> None:
    """The root logger at `level` with the services' line format (a handler is added once)."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger().setLevel(level)
