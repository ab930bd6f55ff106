"""Process facts from Linux /proc, for tests that check which processes exist."""

from __future__ import annotations

import os

from codemode_common import procfs


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first, then the parent)."""
    found = procfs.stat(pid)
    return None if found is None else [field.decode() for field in found.fields]


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def parent(pid: int) -> int:
    fields = _stat(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    return int(fields[1])


def _children_by_parent(*, live_only: bool) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (fields := _stat(entry)) is None:
            continue
        if live_only and fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def children(pid: int) -> set[int]:
    """The direct children of `pid`, zombies included."""
    return set(_children_by_parent(live_only=False).get(pid, []))


def descendants(pid: int, *, live_only: bool = False) -> set[int]:
    """Every process below `pid` (`live_only`: zombies left out, and what is below them)."""
    by_parent = _children_by_parent(live_only=live_only)
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in by_parent.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found
