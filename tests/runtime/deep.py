"""Helpers for values too deep for recursive comparison or repr."""

from __future__ import annotations


def nested_lists(depth: int) -> list[object]:
    """``[[[...]]]`` with ``depth`` levels below the root."""
    root: list[object] = []
    cursor = root
    for _ in range(depth):
        child: list[object] = []
        cursor.append(child)
        cursor = child
    return root


def list_depth(value: object) -> int:
    depth = 0
    while isinstance(value, list) and value:
        value = value[0]
        depth += 1
    return depth
