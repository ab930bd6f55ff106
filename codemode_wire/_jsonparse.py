"""The reference JSON parser: strict RFC 8259, iterative (explicit stack), pure Python.

It defines what `loads` accepts and every parse error message; the C fast path in
`codemode_wire.jsonvalue` is only trusted when it succeeds. Private module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from codemode_wire._jsonbase import (
    JsonTooDeep,
    JsonValue,
    JsonValueError,
    digits_to_int,
    quote,
)

_WS = re.compile(r"[ \t\n\r]*")


def _skip(text: str, pos: int) -> int:
    """Offset of the first non-whitespace character at or after `pos`."""
    match = _WS.match(text, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


# [0-9], not \d: \d would also match non-ASCII digits.
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_INF = float("inf")
_LITERALS: dict[str, JsonValue] = {"true": True, "false": False, "null": None}
_NON_FINITE = ("NaN", "Infinity", "-Infinity")
# The C string scanner: no recursion, refuses raw control characters, combines escaped pairs.
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def parse_error(text: str, offset: int, problem: str) -> JsonValueError:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return JsonValueError(
        f"invalid JSON at offset {offset} (line {line}, column {column}): {problem}",
        offset=offset,
    )


def _excerpt(token: str) -> str:
    return token if len(token) <= 40 else token[:37] + "..."


def _string(text: str, pos: int) -> tuple[str, int]:
    """Scan the string literal whose opening quote is at `pos`."""
    try:
        return _scanstring(text, pos + 1, True)
    except json.JSONDecodeError as exc:
        problem = exc.msg.removesuffix(" starting at").removesuffix(" at")
        raise parse_error(text, exc.pos, problem[0].lower() + problem[1:]) from None


def _number(text: str, pos: int) -> tuple[int | float, int] | None:
    match = _NUMBER.match(text, pos)
    if match is None:
        return None
    token = match.group()
    if match.group(1) is None and match.group(2) is None:
        if token == "-0":
            raise parse_error(text, pos, "negative zero (-0) cannot be represented losslessly")
        if token[0] == "-":
            return -digits_to_int(token[1:]), match.end()
        return digits_to_int(token), match.end()
    number = float(token)
    if number in (_INF, -_INF):
        raise parse_error(text, pos, f"number {_excerpt(token)} overflows a 64-bit float")
    if number == 0.0 and token[0] == "-":
        raise parse_error(
            text, pos, f"number {_excerpt(token)} is negative zero, which cannot round-trip"
        )
    return number, match.end()


def _scalar(text: str, pos: int) -> tuple[JsonValue, int]:
    """Parse the non-container value at `pos`."""
    if text.startswith('"', pos):
        return _string(text, pos)
    number = _number(text, pos)
    if number is not None:
        return number
    for word, literal in _LITERALS.items():
        if text.startswith(word, pos):
            return literal, pos + len(word)
    for word in _NON_FINITE:
        if text.startswith(word, pos):
            raise parse_error(text, pos, f"{word} is not valid JSON (only finite numbers are)")
    if pos >= len(text):
        raise parse_error(text, pos, "unexpected end of text, expected a value")
    raise parse_error(text, pos, f"unexpected character {text[pos]!r}, expected a value")


def parse(text: str, max_depth: int | None = None) -> JsonValue:
    """Parse one JSON text; raises JsonValueError with the offset of the first problem, and
    JsonTooDeep at the first container nested deeper than `max_depth` (a container's depth is
    the number of containers around it: the root's is 0), having read no further."""
    end = len(text)
    # The open containers are the ancestors of the one about to open: past `max_depth`, refuse.
    deepest = end if max_depth is None else max_depth + 1
    # One frame per open container; `keys[i]` is the pending key of frame i (unused for arrays).
    stack: list[list[JsonValue] | dict[str, JsonValue]] = []
    keys: list[str] = []
    pos = _skip(text, 0)
    while True:
        char = text[pos : pos + 1]
        value: JsonValue
        if len(stack) >= deepest and char in ("[", "{"):
            assert max_depth is not None
            raise JsonTooDeep(max_depth, pos)
        if char == "[":
            pos = _skip(text, pos + 1)
            if not text.startswith("]", pos):
                stack.append([])
                keys.append("")
                continue
            value, pos = [], pos + 1
        elif char == "{":
            pos = _skip(text, pos + 1)
            if not text.startswith("}", pos):
                obj: dict[str, JsonValue] = {}
                stack.append(obj)
                key, pos = _key(text, pos, obj)
                keys.append(key)
                continue
            value, pos = {}, pos + 1
        else:
            value, pos = _scalar(text, pos)
        # A value is complete: attach it, closing every container that ends right after it.
        while True:
            pos = _skip(text, pos)
            if not stack:
                if pos != end:
                    raise parse_error(text, pos, "unexpected data after the JSON value")
                return value
            top = stack[-1]
            char = text[pos : pos + 1]
            if type(top) is list:
                top.append(value)
                closer = "]"
            else:
                assert type(top) is dict
                top[keys[-1]] = value
                closer = "}"
            if char == ",":
                pos = _skip(text, pos + 1)
                if closer == "}":
                    assert type(top) is dict
                    keys[-1], pos = _key(text, pos, top)
                break
            if char != closer:
                raise parse_error(text, pos, f"expected ',' or '{closer}'")
            value = stack.pop()
            keys.pop()
            pos += 1


def _key(text: str, pos: int, obj: dict[str, JsonValue]) -> tuple[str, int]:
    """Parse `"key" :` at `pos` (leading whitespace already skipped); return the key and the
    offset of its value."""
    if not text.startswith('"', pos):
        raise parse_error(text, pos, "expected a string key")
    key, after = _string(text, pos)
    if key in obj:
        # Keeping either value would silently drop the other.
        raise parse_error(text, pos, f"duplicate object key {_excerpt(quote(key))}")
    after = _skip(text, after)
    if not text.startswith(":", after):
        raise parse_error(text, after, "expected ':' after the object key")
    return key, _skip(text, after + 1)
