"""An output folder a command creates, taken back when the command ends with nothing in it
(interrupted, or failed before writing), so a Ctrl-C leaves no empty folders behind."""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["create", "remove_if_empty"]


def create(path: Path) -> list[Path]:
    """`mkdir -p path`; returns the folders it created, deepest first (OSError as mkdir's)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    path.mkdir(parents=True, exist_ok=True)
    return missing


def remove_if_empty(created: list[Path]) -> None:
    """Removes each created folder that is (now) empty, deepest first."""
    for folder in created:
        with contextlib.suppress(OSError):  # not empty, or gone already
            folder.rmdir()
