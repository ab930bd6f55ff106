"""Text rules shared by both services and the Python client (stdlib only)."""

from __future__ import annotations

from codemode_wire._jsonbase import SURROGATE

__all__ = ["has_lone_surrogate", "utf8_exceeds", "utf8_len", "without_lone_surrogates"]


def has_lone_surrogate(text: str) -> bool:
    return not text.isascii() and SURROGATE.search(text) is not None


def without_lone_surrogates(text: str) -> str:
    """`text` with each lone surrogate (not encodable as UTF-8, so refused by protobuf string
    fields) replaced by U+FFFD, as a UTF-8 decoder does with bytes it cannot decode."""
    return text if text.isascii() else SURROGATE.sub("\ufffd", text)


def utf8_exceeds(text: str, limit: int) -> bool:
    """Whether `text` is more than `limit` bytes of UTF-8; short texts are not encoded (a code
    point is at most 4 bytes), and lone surrogates count as the 3 bytes of their escape."""
    if len(text) * 4 <= limit:
        return False
    return len(text) > limit or utf8_len(text) > limit


def utf8_len(text: str) -> int:
    """Bytes of `text` in UTF-8 (a lone surrogate counts as the 3 bytes of its escape)."""
    return len(text.encode("utf-8", "surrogatepass"))
