"""The shape of a JSON text, read at C speed without parsing it: its brackets, commas and
colons outside strings (``structure``), a bound of its nesting depth (``depth``), and how many
values it spells (``values_in``) to hold against how many a parser built (``values_of``).

The C ``json`` scanner recurses once per level and its duplicate-key check costs a Python hook
per object; these let both codecs (``codemode_wire.jsonvalue`` and the worker channel's
``runtime_service.worker.flatwire_fast``) prove a text shallow before the scanner reads it and
find a repeated key after it read without the hook.

Stdlib only: the sandboxed worker imports it.
"""

from __future__ import annotations

from gc import get_referents
from itertools import accumulate

__all__ = ["depth", "structure", "values_in", "values_of"]

# An empty array as ``structure`` writes it: a byte no valid JSON text holds raw (a control
# character), so that ``[]`` there is an array of one scalar, whose bytes are gone.
_EMPTY_ARRAY = b"\x01"
# Every byte that is not a bracket, a quote, a comma, a colon or an empty array, deleted by
# ``bytes.translate``.
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}",:\x01')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b'[]{}"')
# Opening brackets to +1 and closing ones to -1 (as signed bytes).
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def structure(text: str, *, members: bool = True) -> bytes:
    """The brackets, commas and colons of ``text`` outside its strings, in order, an empty
    array spelled ``[]`` as ``_EMPTY_ARRAY``.

    Linear: escaped backslashes and quotes are removed first, then every other byte but
    quotes and those, then the strings (the stretch between each pair of quotes). UTF-8 keeps
    every non-ASCII character free of ASCII bytes, so the work happens on bytes. A ``[]``
    never straddles a string's quote, so one inside a string goes with the string.

    Without ``members``, only the brackets (the empty arrays too): enough for ``depth``, and
    less to keep on a large text."""
    data = text.encode("utf-8", "surrogatepass")
    if members:
        data = data.replace(b"[]", _EMPTY_ARRAY)
    if b"\\" in data:
        # Left to right, ``\\`` pairs first: what remains of a backslash run escapes the next
        # character, so a ``\"`` left afterwards is a quote inside a string.
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Adjacent quotes either delimit a string whose bytes are all gone or end one such string
    # and start the next: dropping them leaves every other byte on the same side of a string
    # boundary.
    data = data.translate(None, _NOT_STRUCTURE if members else _NOT_BRACKETS)
    data = data.replace(b'""', b"")
    if b'"' in data:
        data = b"".join(data.split(b'"')[::2])
    return data


def depth(shape: bytes) -> int:
    """An upper bound of the nesting depth the JSON scanner reaches on a text of this
    ``structure``; on a text the scanner rejects, of the depth reached before the rejection
    (up to there the text is valid JSON, tokenized the same way)."""
    data = shape.translate(None, b",:")
    if _EMPTY_ARRAY in data:
        data = data.replace(_EMPTY_ARRAY, b"[]")
    # Each pass removes empty containers, which lowers the depth by one at most: a few passes
    # shrink an ordinary document to almost nothing before the exact count.
    removed = 0
    for pair in (b"[]", b"{}", b"[]", b"{}"):
        shorter = data.replace(pair, b"")
        if len(shorter) != len(data):
            data = shorter
            removed += 1
    if not data:
        return removed
    return removed + max(accumulate(memoryview(data.translate(_STEPS)).cast("b"), initial=0))


def values_in(shape: bytes) -> int:
    """How many values a valid JSON text of this ``structure`` holds, the root included.

    Every value but the root is a member of a container, and a non-empty container of ``n``
    members holds ``n - 1`` commas: the values are 1 + the commas + the non-empty containers.
    An object is empty where ``{}`` is left, an array where ``_EMPTY_ARRAY`` is; one spelled
    with spaces inside (``[ ]``) counts as holding one value, so the count is never below the
    true one, while a duplicate key makes the parsed value's (``values_of``) smaller: the
    counts agree only where both are exact and no key repeats."""
    non_empty = shape.count(b"[") + shape.count(b"{") - shape.count(b"{}")
    return 1 + shape.count(b",") + non_empty


def values_of(value: object) -> int:
    """How many values ``value`` holds, the root included (it came from the C decoder, so its
    objects have ``str`` keys only and ``get_referents`` yields their values, not their keys;
    a value held twice counts twice, as the scanner's shared small ints and keys do)."""
    if not _REFERENTS_ARE_VALUES:
        return -1  # matches no text: the callers read with their hooks
    count = 1
    level: list[object] = [value]
    while level := get_referents(*level):
        count += len(level)
    return count


# What ``values_of`` stands on, checked once: the referents of a list are its items, of a
# ``str``-keyed dict its values alone, of a scalar nothing (so far every CPython; another
# interpreter's answer would only turn the count off).
_REFERENTS_ARE_VALUES = (
    sorted(map(str, get_referents([1, "a"]))) == ["1", "a"]
    and get_referents({"k": None}) == [None]
    and get_referents("s", 2, 2.5, None, True) == []
)
