"""The reference JSON writer: iterative, path-aware, strict about what round-trips.

It defines what `dumps` accepts and every refusal message; the C fast path in
`codemode_wire.jsonvalue` is only used where a walk has proved it gives the same text.
Private module.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import NoReturn

from codemode_wire._jsonbase import JsonValueError, int_to_digits, quote

_SURROGATE_PAIR = re.compile(r"[\ud800-\udbff][\udc00-\udfff]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_KEEP = 12  # path segments kept at each end of a very deep path in messages


class Refused(Exception):
    """A problem with the value being written; the caller adds its path."""


def atom(value: object) -> str | None:
    """JSON text of a scalar, None for a list or dict; raises Refused for anything else."""
    kind = type(value)
    if kind is str:
        assert isinstance(value, str)
        if not value.isascii() and _SURROGATE_PAIR.search(value):
            raise Refused(
                "string holds a surrogate pair as two code points; JSON would read it back as "
                "one character"
            )
        return quote(value)
    if kind is int:
        assert isinstance(value, int)
        return int_to_digits(value)
    if kind is float:
        assert isinstance(value, float)
        if not math.isfinite(value):
            spelled = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
            raise Refused(f"{spelled} is not valid JSON (only finite numbers are)")
        if value == 0.0 and math.copysign(1.0, value) < 0:
            raise Refused("negative zero (-0.0) cannot round-trip through JSON")
        return float.__repr__(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if kind is list or kind is dict:
        return None
    name = kind.__qualname__
    for base in (dict, list, str, int, float):
        if isinstance(value, base):
            raise Refused(f"{name} is a subclass of {base.__name__}; pass a plain {base.__name__}")
    raise Refused(
        f"{name} is not a JSON value (only dict, list, str, int, float, bool and None are)"
    )


END = object()


class Cursor:
    """The open containers of a walk, innermost last, as parallel stacks.

    A deep walk opens one level per container, so it allocates no per-level object for
    arrays (an index does): allocation per level is what makes deep walks slow under the GC.
    """

    __slots__ = ("containers", "keys", "open_ids", "positions")

    def __init__(self) -> None:
        self.containers: list[list[object] | dict[object, object]] = []
        # Per container: the next index of an array, or the items iterator of an object.
        self.positions: list[int | Iterator[tuple[object, object]]] = []
        self.keys: list[object] = []  # the key or index of the child being written
        self.open_ids: set[int] = set()  # the ancestor path, for cycle detection

    def open(self, container: list[object] | dict[object, object]) -> None:
        self.containers.append(container)
        self.positions.append(iter(container.items()) if type(container) is dict else 0)
        self.keys.append(None)
        self.open_ids.add(id(container))

    def advance(self) -> object:
        """Step the innermost container to its next child and return it, or END when it is
        exhausted (the caller then closes it)."""
        container, position = self.containers[-1], self.positions[-1]
        if isinstance(position, int):
            assert type(container) is list
            if position == len(container):
                return END
            self.positions[-1] = position + 1
            self.keys[-1] = position
            return container[position]
        entry = next(position, None)
        if entry is None:
            return END
        self.keys[-1], child = entry
        return child

    def close(self) -> str:
        container = self.containers.pop()
        self.positions.pop()
        self.keys.pop()
        self.open_ids.discard(id(container))
        return "}" if type(container) is dict else "]"

    def path(self, root: str, *, with_current: bool = True) -> str:
        """JSON path such as `$.a[3]["b c"]`; very deep paths keep both ends."""
        keys = self.keys if with_current else self.keys[:-1]
        parts = [
            f"[{key}]"
            if type(key) is int
            else f".{key}"
            if _IDENTIFIER.fullmatch(str(key))
            else f"[{quote(str(key))[:60]}]"
            for key in keys
        ]
        if len(parts) > 2 * _PATH_KEEP:
            hidden = len(parts) - 2 * _PATH_KEEP
            parts[_PATH_KEEP:-_PATH_KEEP] = [f"…({hidden} levels)…"]
        return root + "".join(parts)

    def refuse(self, root: str, problem: str, *, with_current: bool = True) -> NoReturn:
        path = self.path(root, with_current=with_current)
        raise JsonValueError(f"not lossless JSON at {path}: {problem}", path=path) from None

    def key_text(self, root: str) -> str:
        """The quoted key of the current member of the innermost object."""
        key = self.keys[-1]
        if type(key) is not str:
            problem = f"object key of type {type(key).__qualname__} is not a str"
            self.refuse(root, problem, with_current=False)
        assert isinstance(key, str)
        return quote(key)


def encode(value: object, root: str) -> str:
    out: list[str] = []
    walk = Cursor()
    while True:
        try:
            text = atom(value)
        except Refused as exc:
            walk.refuse(root, str(exc))
        if text is not None:
            out.append(text)
        elif not value:
            out.append("{}" if type(value) is dict else "[]")
        else:
            assert isinstance(value, list | dict)
            if id(value) in walk.open_ids:
                walk.refuse(root, f"cycle: this {type(value).__name__} contains itself")
            walk.open(value)
            out.append("{" if type(value) is dict else "[")
        # Move to the next value to write, closing finished containers.
        while walk.containers:
            value = walk.advance()
            if value is END:
                out.append(walk.close())
                continue
            if out[-1] not in ("[", "{"):  # not the first member
                out.append(",")
            if type(walk.containers[-1]) is dict:
                out.append(walk.key_text(root))
                out.append(":")
            break
        else:
            return "".join(out)
