"""Schema `pattern`s, matched with RE2 so that no pattern can cost more than linear time.

Python's `re` backtracks: `^(a+)+$` against 27 `a`s and a `!` took seconds, on the event loop
every tenant's RPCs share. RE2 matches in time linear in the text, whatever the pattern, and
refuses what it cannot do that way.

JSON Schema patterns are ECMA-262 regular expressions; RE2 reads a large common subset the same
way. Differences, all decided at registration (a pattern RE2 cannot compile is refused there,
with RE2's message), never silently at call time:

- refused: lookahead and lookbehind (`(?=`, `(?!`, `(?<=`, `(?<!`), backreferences (`\\1`,
  `\\k<name>`), `\\cX`, `[^]`, `\\u{...}`;
- translated: `\\uXXXX` (and a `\\uD83D\\uDE00` surrogate-pair escape) becomes RE2's `\\x{...}`;
- as in ECMA-262 (and unlike Python's `re`): `\\d`, `\\w` and `\\b` are ASCII, and `$` matches
  only at the very end (not before a final newline).

A pattern is searched anywhere in the string, as JSON Schema specifies. Compiled patterns are
cached by their text, so a schema's patterns compile once (at registration), not per call.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

__all__ = ["PatternError", "compile_pattern", "pattern_matches"]


class PatternError(ValueError):
    """A pattern RE2 cannot compile; the message is RE2's (or names the unsupported escape)."""


def _options() -> Any:
    options = re2.Options()
    options.never_capture = True  # only "is there a match" is asked: groups cost work
    options.log_errors = False  # a refused pattern is reported to the registrant, not stderr
    return options


_OPTIONS = _options()
_HEX = frozenset("0123456789abcdefABCDEF")


def _hex4(pattern: str, at: int) -> int | None:
    """The code point of `\\uXXXX` whose `u` is at `at - 1`, else None."""
    digits = pattern[at : at + 4]
    if len(digits) == 4 and all(c in _HEX for c in digits):
        return int(digits, 16)
    return None


def to_re2(pattern: str) -> str:
    """`pattern` with the ECMA-262 escapes RE2 spells differently rewritten (see module doc)."""
    if "\\u" not in pattern:
        return pattern
    out: list[str] = []
    i, end = 0, len(pattern)
    while i < end:
        char = pattern[i]
        if char != "\\" or i + 1 == end:
            out.append(char)
            i += 1
            continue
        if pattern[i + 1] != "u" or (point := _hex4(pattern, i + 2)) is None:
            out.append(pattern[i : i + 2])  # any other escape, kept whole (`\\\\u` stays)
            i += 2
            continue
        i += 6
        if 0xD800 <= point < 0xDC00 and pattern.startswith("\\u", i):
            low = _hex4(pattern, i + 2)
            if low is not None and 0xDC00 <= low < 0xE000:
                point = 0x10000 + ((point - 0xD800) << 10) + (low - 0xDC00)
                i += 6
        out.append(f"\\x{{{point:04X}}}")
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Any:
    """The compiled RE2 program of a schema pattern; raises PatternError if RE2 refuses it."""
    # Bytes in, bytes matched: a JSON string may hold a lone surrogate, which `str.encode`
    # (as the wrapper would call it) refuses; `surrogatepass` keeps it, as a byte sequence
    # that is not UTF-8 and so matches nothing but itself.
    try:
        return re2.compile(to_re2(pattern).encode("utf-8", "surrogatepass"), _OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise PatternError(str(detail)) from None


def pattern_matches(pattern: str, text: str) -> bool:
    """Whether `pattern` (already accepted by `compile_pattern`) occurs anywhere in `text`."""
    return compile_pattern(pattern).search(text.encode("utf-8", "surrogatepass")) is not None
