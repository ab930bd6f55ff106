"""Worker messages decoded whole -- parsed, their flat-wire value rebuilt, measured and spelled
as JSON -- for small frames on the event loop, for large ones on a decoding thread.

A 60 MB completion costs seconds of codec work (parse, rebuild, ledger size, JSON text for the
terminal message); on the event loop that froze every other run for as long. Frames over
``LARGE_FRAME_BYTES`` go to a small dedicated thread pool instead; each run hands them over one
at a time, in channel order (``Run``), so a later small frame never overtakes an earlier large
one.

A thread alone is not enough: the stdlib's C codecs hold the interpreter lock for a whole call
(0.6 s to parse 66 MB of short strings, 0.9 s to spell them, several times that on a busy
host), and the loop cannot run meanwhile. So a large frame's token list is parsed, and a large
value spelled, in pieces of about ``_PIECE_BYTES`` / ``_PIECE_ITEMS``: the lock changes hands
between pieces. The result is the same as one call's (``_parse_pieces`` falls back to it for
any frame not spelled as ``framing.pack`` spells one).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from codemode_wire import jsonvalue
from runtime_service.protocol import (
    CallMessage,
    DoneMessage,
    WorkerMessage,
    build_worker_message,
    parse_worker_message,
)
from runtime_service.worker import flatwire
from runtime_service.worker.ledger import json_value_size

__all__ = ["LARGE_FRAME_BYTES", "Decoded", "decode", "decode_frame", "decoding_pool"]

LARGE_FRAME_BYTES = 1 << 20
"""Frames over this size are decoded off the event loop."""
_THREADS = 2  # one per core here: decoding is CPU work, more threads only contend
_PIECE_BYTES = 256 << 10  # of token-list text per parse call: a millisecond or two
_PIECE_ITEMS = 2048  # members per spelling call
_SPELL_DEPTH = 8  # how deep spelling looks for large containers inside small ones
# Where the token list starts in a large frame as ``framing.pack`` writes it (it ends ``]}``).
_TOKENS_START = re.compile(
    rb'\{"t":"done","value":|\{"t":"call","id":\d{1,18},"name":"(?:[^"\\]|\\.)*","args":'
)

_JSON_TOKEN = b'[{"kind":"json","text":"'  # a value as one json token (``flatwire``)

# Its threads start on the first large frame (an executor starts them on demand).
_POOL = ThreadPoolExecutor(_THREADS, thread_name_prefix="codemode-frame-decode")


def decoding_pool() -> ThreadPoolExecutor:
    """The process's frame-decoding threads."""
    return _POOL


@dataclass(frozen=True, slots=True)
class Decoded:
    """A worker message with the value it carries (call arguments, a completion) rebuilt."""

    message: WorkerMessage | None
    value: object = None
    problem: str | None = None
    """The value is not lossless JSON: why ("" when there is nothing to add to the base text),
    or None."""
    value_size: int = 0
    """A completion's output-ledger size, capped at the budget plus one."""
    value_json: str | None = None
    """The value's JSON text, when it was made here (large frames: off the loop)."""


def decode(message: WorkerMessage | None, max_output_bytes: int, *, spell: bool) -> Decoded:
    """Rebuild the value ``message`` carries; ``spell``: also make its JSON text (and, for a
    completion, its ledger size), the costly parts of a large value."""
    if isinstance(message, CallMessage):
        tokens: object = message.args
        problem = message.problem
    elif isinstance(message, DoneMessage) and message.has_value and message.error is None:
        tokens = message.value
        problem = message.problem
    else:
        return Decoded(message)
    if problem is not None:
        return Decoded(message, problem=problem)
    try:
        value = flatwire.decode(tokens)
    except flatwire.WireError:
        return Decoded(message, problem="")
    text = _token_text(tokens)
    if not spell:
        return Decoded(message, value, value_json=text)
    size = 0
    if isinstance(message, DoneMessage):
        size = json_value_size(value, max_output_bytes)
        if size > max_output_bytes:
            return Decoded(message, value, value_size=size)  # output-limit: no text needed
    if text is None:
        try:
            text = _spell(value)
        except jsonvalue.JsonValueError:
            return Decoded(message, problem="")
    return Decoded(message, value, value_size=size, value_json=text)


def _token_text(tokens: object) -> str | None:
    """The text of a value that travelled as a lone json token, when it can stand for the
    value as it is: ``flatwire.decode`` has just read it as that lossless value, so only a
    surrogate (which no JSON text may hold raw, nor a gRPC string carry) rules it out. Then the
    value needs no spelling here: the registry reads the text as the value (and spells it
    canonically itself), and its size is still measured on the value (``json_value_size``)."""
    token = tokens[0] if type(tokens) is list and len(tokens) == 1 else None
    if type(token) is not dict or token.get("kind") != "json":
        return None
    text: str = token["text"]
    if not text.isascii():
        try:
            text.encode("utf-8")  # fails on a surrogate
        except UnicodeEncodeError:
            return None
    return text


def decode_frame(payload: bytes, max_output_bytes: int) -> Decoded:
    """Parse and decode one large frame (runs on a decoding thread)."""
    raw = _parse_pieces(payload)
    message = parse_worker_message(payload) if raw is None else build_worker_message(raw)
    return decode(message, max_output_bytes, spell=True)


def _parse_pieces(payload: bytes) -> dict[str, Any] | None:
    """``flatwire.loads_strict(payload)`` for a frame spelled as ``framing.pack`` spells it,
    its token list parsed a piece at a time; None for any other (or unreadable) frame."""
    start = _TOKENS_START.match(payload)
    if start is None or not payload.endswith(b"]}") or not payload.isascii():
        return None
    at = start.end()
    if payload.startswith(_JSON_TOKEN, at):
        # One string: cut into pieces, every piece would fail until the last. Reading its
        # text is far less work than what reading the value in it costs anyway.
        return None
    try:
        outer = flatwire.loads_strict(payload[:at] + b"[]}")
        tokens = _parse_token_list(payload, at, len(payload) - 1)
    except flatwire.WireError:
        return None
    if type(outer) is not dict or tokens is None:
        return None
    outer["value" if outer.get("t") == "done" else "args"] = tokens
    return outer


def _parse_token_list(payload: bytes, begin: int, end: int) -> list[Any] | None:
    """The JSON array ``payload[begin:end]``, parsed in pieces cut at commas.

    A cut inside a string or a marker leaves that piece unparseable (its string or object is
    never closed), so a piece that parses holds whole tokens: the pieces' tokens, joined, are
    the array's. A piece that does not parse is retried twice as long (so a long string costs
    a few tries, never one per comma in it).
    """
    if payload[begin : begin + 1] != b"[" or payload[end - 1 : end] != b"]":
        return None
    tokens: list[Any] = []
    pos = begin + 1
    close = end - 1
    if pos == close:
        return tokens
    span = _PIECE_BYTES
    while pos < close:
        cut = payload.find(b",", pos + span, close) if pos + span < close else -1
        if cut < 0:
            cut = close
        try:
            piece = flatwire.loads_strict(b"[" + payload[pos:cut] + b"]")
        except flatwire.IntegerTooLong:
            return None  # the whole-frame parse says so, naming the limit
        except flatwire.WireError:
            if cut == close:
                return None
            span *= 2
            continue
        tokens.extend(piece)
        pos = cut + 1
        span = _PIECE_BYTES
    return tokens


def _spell(value: object, depth: int = 0) -> str:
    """``jsonvalue.dumps(value)``, large containers a slice of members per call."""
    kind = type(value)
    if depth < _SPELL_DEPTH and kind is list:
        items: list[object] = value  # type: ignore[assignment]
        if len(items) > _PIECE_ITEMS:
            pieces = [
                jsonvalue.dumps(items[i : i + _PIECE_ITEMS])[1:-1]
                for i in range(0, len(items), _PIECE_ITEMS)
            ]
            return _joined("[", pieces, "]")
        if 0 < len(items) <= 16:
            return _joined("[", [_spell(item, depth + 1) for item in items], "]")
    elif depth < _SPELL_DEPTH and kind is dict:
        mapping: dict[str, object] = value  # type: ignore[assignment]
        if len(mapping) > _PIECE_ITEMS:
            pairs = list(mapping.items())
            pieces = [
                jsonvalue.dumps(dict(pairs[i : i + _PIECE_ITEMS]))[1:-1]
                for i in range(0, len(pairs), _PIECE_ITEMS)
            ]
            return _joined("{", pieces, "}")
        if 0 < len(mapping) <= 16:
            members = [
                jsonvalue.dumps(key) + ":" + _spell(member, depth + 1)
                for key, member in mapping.items()
            ]
            return _joined("{", members, "}")
    return jsonvalue.dumps(value)


def _joined(opening: str, pieces: list[str], closing: str) -> str:
    """``opening + ",".join(pieces) + closing`` in one allocation: each copy of a large text
    is time the interpreter lock is held."""
    parts = [opening]
    for piece in pieces:
        parts.append(piece)
        parts.append(",")
    parts[-1] = closing if pieces else parts[-1] + closing
    return "".join(parts)
