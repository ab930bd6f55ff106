"""Exact byte accounting of a run's outer output.

The ledger charges the variable payload of the serialized outer result: the JSON encoding of
the ``logs`` array (``[]`` is 2 bytes, each entry its JSON-string size, plus one comma between
entries) plus either the JSON size of the completion value or the JSON-string size of the
failure message. Sizes are computed without serializing, and value measurement stops as soon as
the cap is crossed.

Each log entry also costs ``LOG_LINE_OVERHEAD``: what holding one more line costs the runtime
and the registry whatever its text (a string object, a queued stream message, a terminal
entry, each a few dozen bytes). Without it a flood of one-byte lines cost them some 100 times
the budget; with it what a run's logs hold is O(its budget).

Log lines and failure messages are plain text, carried in protobuf string fields that must be
valid UTF-8: the runtime passes each through ``valid_text`` where it enters the host, before it
is charged, so the bytes charged are the bytes sent. (Completion values are lossless JSON
instead: a lone surrogate there stays, written as a ``\\uXXXX`` escape.)

Stdlib only: the worker imports this module to pre-check before anything crosses the channel;
the runtime re-checks everything it receives.
"""

from __future__ import annotations

import re
from typing import Any

from runtime_service.worker.flatwire_fast import plain_text

__all__ = [
    "LOG_LINE_OVERHEAD",
    "MIN_OUTPUT_BYTES",
    "OutputLedger",
    "fit_prefix",
    "json_string_size",
    "json_value_size",
    "log_entry_cost",
    "overflow_message",
    "valid_text",
]

MIN_OUTPUT_BYTES = 4  # "[]" for the logs plus '""' for the shortest message
LOG_LINE_OVERHEAD = 32
"""Ledger bytes each log entry costs besides its JSON text (the TypeScript ledger's too)."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with each surrogate code point replaced by U+FFFD, as a UTF-8 decoder does
    with bytes it cannot decode (a ``surrogateescape`` file name, ``print('\\ud800')``).

    The rule for all worker text that leaves the host as text: a lone surrogate cannot be
    encoded as UTF-8, so protobuf would refuse the whole message. JSON decoding merges every
    escaped pair into one character, so only lone surrogates reach this point.
    """
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


_NOT_CONTROL = bytes(range(0x20, 0x100))
_SHORT_ESCAPES = b"\b\t\n\f\r"  # written as two bytes; the other controls as \\u00XX (six)
_SURROGATE_UTF8 = re.compile(rb"\xed[\xa0-\xbf]")  # a lone surrogate's first two bytes


def json_string_size(text: str) -> int:
    """Bytes of ``text`` as a JSON string literal: quotes, escapes, UTF-8 for the rest.

    At C speed whatever the text (a string method per kind of character, no Python loop over
    characters): a 16 MiB log line is measured in milliseconds, not seconds.
    """
    if text.isascii():
        # Fast path: one byte per char except the escaped ones.
        size = len(text) + 2 + text.count('"') + text.count("\\")
        if not text.isprintable():
            controls = text.encode("ascii").translate(None, _NOT_CONTROL)
            size += 5 * len(controls) - 4 * sum(map(controls.count, _SHORT_ESCAPES))
        return size
    raw = text.encode("utf-8", "surrogatepass")
    size = len(raw) + 2 + raw.count(b'"') + raw.count(b"\\")
    controls = raw.translate(None, _NOT_CONTROL)
    if controls:
        size += 5 * len(controls) - 4 * sum(map(controls.count, _SHORT_ESCAPES))
    if _SURROGATE.search(text) is not None:
        size += 3 * len(_SURROGATE_UTF8.findall(raw))  # 3 bytes of UTF-8, 6 as an escape
    return size


def fit_prefix(text: str, budget: int) -> str:
    """Longest code-point prefix of ``text`` whose JSON-string size is at most ``budget``."""
    if json_string_size(text) <= budget:
        return text
    if text.isascii() and text.isprintable():
        # One byte per character but two for '"' and '\\': a binary search over counts
        # (no copies), not a Python loop over what may be a budget's worth of characters.
        low, high = 0, len(text)
        while low < high:
            cut = (low + high + 1) // 2
            size = cut + 2 + text.count('"', 0, cut) + text.count("\\", 0, cut)
            low, high = (cut, high) if size <= budget else (low, cut - 1)
        return text[:low]
    # A character costs 1 to 6 bytes: the cut is between these bounds, found by measuring
    # prefixes (each at C speed).
    low = min(max(budget - 2, 0) // 6, len(text))
    high = min(max(budget - 2, 0), len(text))
    while low < high:
        cut = (low + high + 1) // 2
        low, high = (cut, high) if json_string_size(text[:cut]) <= budget else (low, cut - 1)
    return text[:low]


def _scalar_size(value: object) -> int:
    kind = type(value)
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if kind is str:
        return json_string_size(value)  # type: ignore[arg-type]
    if kind is int:
        return len(str(value))
    if kind is float:
        return len(repr(value))
    raise TypeError(f"{kind.__name__} is not a JSON scalar")


def json_value_size(value: object, limit: int) -> int:
    """JSON size of a lossless JSON value, or ``limit + 1`` if it exceeds ``limit``.

    ``value`` must already be lossless JSON (a snapshot or a decoded wire value). A plain
    shallow value is measured by the length of its C-encoded text, which spells every
    character and number as ``_walk_size`` counts them, twice as fast as the walk.
    """
    text = plain_text(value)
    if text is None:
        return _walk_size(value, limit)
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    return size if size <= limit else limit + 1


def _walk_size(value: object, limit: int) -> int:
    """``json_value_size`` by an iterative walk that stops as soon as ``limit`` is crossed:
    arrays and objects cost 2 plus commas, object members their key size plus one colon."""
    total = 0
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is list:
            total += 2 + max(len(item) - 1, 0)
            stack.extend(item)
        elif kind is dict:
            total += 2 + max(len(item) - 1, 0)
            for key, member in item.items():
                total += json_string_size(key) + 1
                stack.append(member)
        else:
            total += _scalar_size(item)
        if total > limit:
            return limit + 1
    return total


def log_entry_cost(text: str, *, first: bool) -> int:
    """What one more log entry costs the ledger: its JSON text, the comma before it (unless it
    is the first) and ``LOG_LINE_OVERHEAD``."""
    return json_string_size(text) + (0 if first else 1) + LOG_LINE_OVERHEAD


def overflow_message(max_bytes: int) -> str:
    return f"outer output exceeded {max_bytes} bytes"


class OutputLedger:
    """Running count of the logs admitted so far against ``max_bytes``."""

    __slots__ = ("_logs_size", "logs", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        if type(max_bytes) is not int or max_bytes < MIN_OUTPUT_BYTES:
            raise ValueError(f"max output bytes must be an integer >= {MIN_OUTPUT_BYTES}")
        self.max_bytes = max_bytes
        self.logs: list[str] = []
        self._logs_size = 2

    @property
    def used(self) -> int:
        """Bytes charged so far (the logs array only)."""
        return self._logs_size

    def entry_cost(self, text: str) -> int:
        return log_entry_cost(text, first=not self.logs)

    def remaining_for_entry(self) -> int:
        """Largest JSON-string size the next log entry may have without overflowing."""
        return self.max_bytes - self._logs_size - log_entry_cost("", first=not self.logs) + 2

    def admit_log(self, text: str) -> bool:
        """Append ``text`` if the logs still fit under the cap; False means overflow.

        On overflow the entry is kept (the fitting prefix is chosen later by
        ``overflow_logs``) so that nothing admitted-but-truncated is lost.
        """
        cost = self.entry_cost(text)
        self.logs.append(text)
        self._logs_size += cost
        return self._logs_size <= self.max_bytes

    def fits_value(self, value: object) -> bool:
        """Whether the logs plus the completion value stay within the cap."""
        room = self.max_bytes - self._logs_size
        return room >= 0 and json_value_size(value, room) <= room

    def fits_size(self, size: int) -> bool:
        """``fits_value`` for a value whose ``json_value_size`` is already known."""
        return self._logs_size + size <= self.max_bytes

    def fits_message(self, message: str) -> bool:
        return self._logs_size + json_string_size(message) <= self.max_bytes

    def overflow_logs(self) -> tuple[list[str], str]:
        """Logs and message for an ``output-limit`` result, together at most ``max_bytes``.

        Logs are kept in order while they fit within ``max - size(message)``; the first
        that does not fit is cut to its longest fitting code-point prefix (dropped if empty);
        the message itself is cut when even it does not fit beside ``[]``.
        """
        message = overflow_message(self.max_bytes)
        message = fit_prefix(message, self.max_bytes - 2)
        budget = self.max_bytes - json_string_size(message)
        kept: list[str] = []
        used = 2
        for text in self.logs:
            extra = log_entry_cost("", first=not kept) - 2  # its comma and overhead
            cost = json_string_size(text) + extra
            if used + cost <= budget:
                kept.append(text)
                used += cost
                continue
            prefix = fit_prefix(text, budget - used - extra)
            if prefix:
                kept.append(prefix)
            break
        return kept, message
