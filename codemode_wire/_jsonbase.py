"""Shared pieces of the lossless JSON codec: the value type, its error, exact big-integer text.

Private: import these names from `codemode_wire.jsonvalue`.
"""

from __future__ import annotations

import decimal
import json
import re
from typing import TypeAlias

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None


class JsonValueError(ValueError):
    """A value or text that cannot cross the API as lossless JSON.

    `offset` is the character offset into the text (parsing), `path` the JSON path of the offending
    value (serializing, e.g. `$.a[3].b`); whichever does not apply is None.
    """

    def __init__(self, message: str, *, offset: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.offset = offset
        self.path = path


class JsonTooDeep(JsonValueError):
    """A text with a container inside more than the caller's `max_depth` others (an admission
    bound, not a property of JSON: the codec itself has no depth limit). `offset` is where the
    first such container opens."""

    def __init__(self, max_depth: int, offset: int) -> None:
        super().__init__(
            f"JSON nested deeper than {max_depth} levels (the limit is reached at offset {offset})",
            offset=offset,
        )
        self.max_depth = max_depth


SURROGATE = re.compile(r"[\ud800-\udfff]")
_encode_basestring = json.encoder.encode_basestring  # C, escapes like ensure_ascii=False


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def quote(text: str) -> str:
    """JSON string literal for `text`: non-ASCII kept as is, surrogate code points escaped (so the
    result is valid Unicode and a lone surrogate round-trips)."""
    encoded = _encode_basestring(text)
    if encoded.isascii():
        return encoded
    return SURROGATE.sub(_escape_surrogate, encoded)


# Decimal <-> int conversion in CPython 3.11 is quadratic, and `int(str)` / `str(int)` refuse more
# than sys.get_int_max_str_digits() digits (never below 640). We convert 600-digit chunks (always
# allowed) and combine them pairwise, so the cost follows fast multiplication: about 0.4 s / 0.2 s
# for a one-million-digit integer instead of tens of seconds.
_CHUNK_DIGITS = 600
_CHUNK_BYTES = 200  # 1600 bits, about 482 digits
_SMALL_LIMIT = 10**_CHUNK_DIGITS


def digits_to_int(digits: str) -> int:
    """The non-negative integer spelled by an ASCII digit string of any length."""
    if len(digits) <= _CHUNK_DIGITS:
        return int(digits)
    head = len(digits) % _CHUNK_DIGITS or _CHUNK_DIGITS
    parts = [int(digits[:head])]
    parts += [int(digits[i : i + _CHUNK_DIGITS]) for i in range(head, len(digits), _CHUNK_DIGITS)]
    # Most significant first; every part but the first is exactly `width` digits wide.
    scale = 10**_CHUNK_DIGITS
    while True:
        if len(parts) % 2:
            parts.insert(0, 0)
        parts = [hi * scale + lo for hi, lo in zip(parts[::2], parts[1::2], strict=True)]
        if len(parts) == 1:
            return parts[0]
        scale *= scale


def int_to_digits(value: int) -> str:
    """Exact decimal text of an int of any magnitude (sign included)."""
    if -_SMALL_LIMIT < value < _SMALL_LIMIT:
        return int.__repr__(value)
    sign, value = ("-", -value) if value < 0 else ("", value)
    raw = value.to_bytes((value.bit_length() + 7) // 8, "little")
    dec = decimal.Decimal
    # Least significant first; libmpdec multiplies big decimals in quasi-linear time.
    parts = [
        dec(int.from_bytes(raw[i : i + _CHUNK_BYTES], "little"))
        for i in range(0, len(raw), _CHUNK_BYTES)
    ]
    with decimal.localcontext() as ctx:
        ctx.prec = decimal.MAX_PREC
        ctx.Emax = decimal.MAX_EMAX
        ctx.Emin = decimal.MIN_EMIN
        ctx.traps[decimal.Inexact] = True
        scale = dec(2) ** (8 * _CHUNK_BYTES)
        while len(parts) > 1:
            if len(parts) % 2:
                parts.append(dec(0))
            parts = [lo + hi * scale for lo, hi in zip(parts[::2], parts[1::2], strict=True)]
            if len(parts) > 1:
                scale *= scale
    return sign + str(parts[0])
