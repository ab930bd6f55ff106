"""Flat lossless-JSON token wire shared by the runtime and its workers.

A JSON value travels as one flat list of tokens in pre-order:

* scalars are the leaf itself (``None``, ``bool``, ``int``, finite ``float``, ``str``);
* ``{"kind": "array", "length": n}`` is followed by the ``n`` element encodings;
* ``{"kind": "object", "keys": [k1, ..., kn]}`` is followed by the ``n`` member encodings.

The token list is at most three levels deep (list -> marker -> keys), so the JSON text that
carries it can be parsed by the stdlib ``json`` module however deep the value itself is.
Both directions are iterative: depth is bounded only by memory.

A plain value of at most ``FAST_DEPTH`` levels (and not tiny) travels instead as one token,
``{"kind": "json", "text": <its compact JSON text>}``, which the C ``json`` module writes and
reads (``flatwire_fast``). It is accepted only as the sole token, its text must be at most
``FAST_DEPTH`` levels deep, and it obeys the same rules: whatever the fast path declines is
redone on the token path, so both accept the same values and raise the same errors.

This module is imported by the worker under ``python -I -S``: stdlib only, nothing heavy.
"""

from __future__ import annotations

import gc
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

from runtime_service.worker import flatwire_fast
from runtime_service.worker.flatwire_fast import FAST_DEPTH, MIN_FAST_TEXT, text_depth

__all__ = [
    "FAST_DEPTH",
    "MAX_INT_DIGITS",
    "IntegerTooLong",
    "WireError",
    "decode",
    "decode_text",
    "encode",
    "encode_text",
    "json_token",
    "loads_strict",
    "snapshot",
]

_SCALARS = (type(None), bool, int, str)
_NON_STR_SCALARS = (type(None), bool, int)
# A high surrogate followed by a low one is read back from JSON as one astral character.
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


class WireError(ValueError):
    """A value is not lossless JSON, or a token list is not a valid encoding."""


# The longest integer the wire carries: the stdlib's default ``int_max_str_digits``. Longer
# int<->str conversions are quadratic, so the runtime never lifts the limit; a program that
# lifts it in its own worker still cannot send more (``framing.pack`` applies it there).
MAX_INT_DIGITS = 4300


# Digits to "0", every other byte to " ": a run of digits longer than the limit becomes a run
# of zeros that one substring search finds.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_TOO_MANY_DIGITS = b"0" * (MAX_INT_DIGITS + 1)


class IntegerTooLong(WireError):
    """JSON text holds an integer of more than ``MAX_INT_DIGITS`` digits."""

    def __init__(self) -> None:
        super().__init__(
            f"an integer has more than {MAX_INT_DIGITS} digits, the most the runtime's "
            "channel carries (send it as a string)"
        )


def _check_float(value: float) -> None:
    if not math.isfinite(value):
        raise WireError(f"{value!r} is not a finite number")
    if value == 0.0 and math.copysign(1.0, value) < 0:
        raise WireError("-0.0 cannot round-trip through JSON")


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _gc_paused(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` with the cyclic GC paused.

    Building or walking a deeply nested value triggers young-generation collections whose cost
    grows with the depth already built, which makes deep values quadratic (measured: 40,000
    levels 10x slower than 10,000). The codec creates no reference cycles, so pausing is safe.
    """

    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _check_str(text: str) -> None:
    if not text.isascii() and _SURROGATE_PAIR.search(text):
        raise WireError("string holds a surrogate pair that JSON would merge into one character")


def encode(value: object) -> list[Any]:
    """Validate ``value`` as lossless JSON and return its flat token list.

    Accepts exactly ``None``, ``bool``, ``int``, finite ``float`` other than ``-0.0``, ``str``,
    ``list`` and ``dict`` with ``str`` keys (see ``_encode_tree``).
    """
    kind = type(value)
    # Scalars (most binding arguments and results) skip the tree walk and the GC pause.
    if kind in _NON_STR_SCALARS:
        return [value]
    if kind is str:
        _check_str(value)  # type: ignore[arg-type]
        return [value]
    if kind is float:
        _check_float(value)  # type: ignore[arg-type]
        return [value]
    return _encode_container(value)


@_gc_paused
def _encode_container(value: object) -> list[Any]:
    text = flatwire_fast.encode_text(value)
    if text is not None:
        return [{"kind": "json", "text": text}]
    return _encode_tree(value)


@_gc_paused
def _encode_tree(value: object) -> list[Any]:
    """Validate ``value`` as lossless JSON and return its flat token list.

    Accepts exactly ``None``, ``bool``, ``int``, finite ``float`` other than ``-0.0``, ``str``,
    ``list`` and ``dict`` with ``str`` keys (exact types: subclasses, tuples, sets and other
    objects are rejected rather than coerced). A container that is its own ancestor is a
    cycle; a container reached twice through different paths is copied twice.
    """
    tokens: list[Any] = []
    # Each frame is an iterator over a container's children plus the container's id, which
    # stays in ``on_path`` until the iterator is exhausted.
    stack: list[tuple[Iterator[object], int]] = []
    on_path: set[int] = set()
    pending: object = value
    have_pending = True
    while True:
        if have_pending:
            have_pending = False
            item = pending
            kind = type(item)
            if kind in _NON_STR_SCALARS:
                tokens.append(item)
            elif kind is str:
                _check_str(item)  # type: ignore[arg-type]
                tokens.append(item)
            elif kind is float:
                _check_float(item)  # type: ignore[arg-type]
                tokens.append(item)
            elif kind is list:
                ident = id(item)
                if ident in on_path:
                    raise WireError("value contains a cycle")
                items: list[object] = item  # type: ignore[assignment]
                tokens.append({"kind": "array", "length": len(items)})
                if items:
                    on_path.add(ident)
                    stack.append((iter(list(items)), ident))
            elif kind is dict:
                ident = id(item)
                if ident in on_path:
                    raise WireError("value contains a cycle")
                mapping: dict[object, object] = item  # type: ignore[assignment]
                pairs = list(mapping.items())
                keys: list[str] = []
                for key, _ in pairs:
                    if type(key) is not str:
                        raise WireError(f"object key {key!r} is not a string")
                    _check_str(key)
                    keys.append(key)
                tokens.append({"kind": "object", "keys": keys})
                if pairs:
                    on_path.add(ident)
                    stack.append((iter([member for _, member in pairs]), ident))
            else:
                raise WireError(f"{kind.__name__} is not a JSON value")
        if not stack:
            return tokens
        children, ident = stack[-1]
        for child in children:
            pending = child
            have_pending = True
            break
        else:
            stack.pop()
            on_path.discard(ident)


_NEG_ZERO_MESSAGE = "negative zero (-0) cannot round-trip through JSON"


def _is_valid_scalar(token: object) -> bool:
    kind = type(token)
    if kind in _SCALARS:
        return True
    if kind is float:
        value: float = token  # type: ignore[assignment]
        return math.isfinite(value) and not (value == 0.0 and math.copysign(1.0, value) < 0)
    return False


def decode(tokens: object) -> object:
    """Rebuild the value encoded by ``tokens``; raise ``WireError`` for any invalid encoding
    (see ``_decode_tree`` and ``_decode_json_token``)."""
    if type(tokens) is list and len(tokens) == 1:
        token = tokens[0]
        if _is_valid_scalar(token):
            return token  # a lone scalar: nothing to walk
        if type(token) is dict and token.get("kind") == "json":
            return _decode_json_token(token)
    return _decode_tree(tokens)


def _with_headroom(fn: Callable[[str], _R], text: str) -> _R:
    """``fn(text)`` for a text proven at most ``FAST_DEPTH`` deep, given the recursion room
    that needs if the limit is lower (a program may lower it in its worker)."""
    try:
        return fn(text)
    except RecursionError:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + FAST_DEPTH + 50)
        try:
            return fn(text)
        finally:
            sys.setrecursionlimit(limit)


@_gc_paused
def _decode_json_token(marker: dict[object, object]) -> object:
    """The value of a ``{"kind": "json", "text": ...}`` token.

    Declined texts are parsed again as ``loads_strict`` does (its errors for invalid JSON, NaN
    and duplicate keys) and the result checked as tokens, so ``-0`` and overflowing numbers get
    the token path's errors too.
    """
    text = marker.get("text")
    if len(marker) != 2 or type(text) is not str:
        raise WireError("invalid marker token")
    try:
        return _with_headroom(flatwire_fast.decode_text, text)
    except flatwire_fast.TooDeep:
        raise WireError(f"json token text is nested deeper than {FAST_DEPTH} levels") from None
    except ValueError:
        pass  # declined: its depth is proven, so the C parser below is safe too
    return _decode_tree(_tokens_of(_with_headroom(loads_strict, text)))


def _tokens_of(value: object) -> list[Any]:
    """The token list of a parsed JSON value, unchecked (``_decode_tree`` checks it)."""
    tokens: list[Any] = []
    stack: list[Iterator[object]] = [iter((value,))]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                tokens.append({"kind": "array", "length": len(item)})
                stack.append(iter(item))
                break
            if type(item) is dict:
                tokens.append({"kind": "object", "keys": list(item)})
                stack.append(iter(item.values()))
                break
            tokens.append(item)
        else:
            stack.pop()
    return tokens


@_gc_paused
def _decode_tree(tokens: object) -> object:
    """Rebuild the value encoded by ``tokens``; raise ``WireError`` for any invalid encoding.

    Rejected: a non-list or empty input, tokens that are neither valid scalars nor markers,
    markers with any key set other than exactly ``{kind, length}`` / ``{kind, keys}``, unknown
    kinds, a length or key count larger than the tokens left, non-string or duplicate keys,
    a second root, and incomplete input.
    """
    if type(tokens) is not list or not tokens:
        raise WireError("wire value must be a non-empty token list")
    seq: list[object] = tokens
    total = len(seq)
    # Open containers: [container, keys (None for arrays), children attached, children wanted].
    stack: list[list[Any]] = []
    root: object = None
    have_root = False
    index = 0
    while index < total:
        token = seq[index]
        index += 1
        remaining = total - index
        value: object
        opened: list[Any] | None = None
        if _is_valid_scalar(token):
            value = token
        elif type(token) is dict:
            marker: dict[object, object] = token
            kind = marker.get("kind")
            if len(marker) != 2 or type(kind) is not str:
                raise WireError("invalid marker token")
            if kind == "array" and "length" in marker:
                length = marker["length"]
                if type(length) is not int or length < 0 or length > remaining:
                    raise WireError("array marker has an invalid length")
                value = []
                if length:
                    opened = [value, None, 0, length]
            elif kind == "object" and "keys" in marker:
                keys = marker["keys"]
                if type(keys) is not list or len(keys) > remaining:
                    raise WireError("object marker has invalid keys")
                for key in keys:
                    if type(key) is not str:
                        raise WireError("object marker has a non-string key")
                if len(set(keys)) != len(keys):
                    raise WireError("object marker has duplicate keys")
                value = {}
                if keys:
                    opened = [value, keys, 0, len(keys)]
            else:
                raise WireError("invalid marker token")
        elif type(token) is float and token == 0.0:
            raise WireError(_NEG_ZERO_MESSAGE)  # the only zero _is_valid_scalar refuses
        else:
            raise WireError(f"invalid token of type {type(token).__name__}")

        if stack:
            frame = stack[-1]
            slot = frame[2]
            if frame[1] is None:
                frame[0].append(value)
            else:
                frame[0][frame[1][slot]] = value
            frame[2] = slot + 1
        elif have_root:
            raise WireError("extra tokens after the root value")
        else:
            root = value
            have_root = True

        if opened is not None:
            stack.append(opened)
        else:
            # A leaf completes every enclosing frame whose children are now all attached.
            while stack and stack[-1][2] == stack[-1][3]:
                stack.pop()
    if stack:
        raise WireError("incomplete token list")
    return root


def _reject_constant(name: str) -> object:
    raise WireError(f"{name} is not valid JSON")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise WireError("duplicate key in JSON object")
    return result


def _parse_int(token: str) -> int | float:
    # JSON's "-0" is negative zero (JavaScript reads it so), which Python's int would turn
    # into 0: keep it a -0.0 float, which ``decode`` then refuses like any other -0.
    return -0.0 if token == "-0" else int(token)


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique_pairs)
_DECODER_NEG_ZERO = json.JSONDecoder(
    parse_constant=_reject_constant, object_pairs_hook=_unique_pairs, parse_int=_parse_int
)


@_gc_paused
def loads_strict(text: str | bytes) -> Any:
    """Parse JSON text (bytes must be UTF-8), rejecting NaN/Infinity literals and duplicate
    object keys.

    A ``-0`` integer token becomes ``-0.0`` (see ``_parse_int``), so it is never read as 0.
    """
    try:
        if not isinstance(text, str):
            # Strict: frames are ASCII. json.loads would pass raw surrogates through, and a
            # raw high+low pair stays two code points, a string no JSON text can carry.
            text = text.decode("utf-8")
        # An integer hook costs a call per integer: used only when a "-0" could be one.
        decoder = _DECODER_NEG_ZERO if "-0" in text else _DECODER
        return decoder.decode(text)
    except WireError:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
            raise IntegerTooLong from None
        raise WireError(f"invalid JSON text: {exc}") from None


def json_token(text: str) -> list[Any] | None:
    """The token list that carries a peer's JSON text to a worker unread, or None where the
    text should be read here first (``loads`` and ``encode``).

    Unread, it is the worker that refuses a text which is not lossless JSON -- invalid, NaN or
    ±Infinity, ``-0``, an overflowing number, a duplicate key -- with the same error as the
    runtime would (``decode``; the TypeScript worker's ``flatwire.js`` likewise), and reads the
    same value from whatever spelling it has (spaces, escapes, exponents). That holds where the
    worker reads it with the C parser, which needs two proofs, both linear and C-speed: the
    text is at most ``FAST_DEPTH`` deep (``text_depth``; deeper ones go on the token path) and
    holds no integer longer than ``MAX_INT_DIGITS`` (refused by the runtime, but read by a
    worker whose program lifted its digit limit). A run of digits inside a string counts too:
    such a text is merely read here. Short texts keep the token spelling (``MIN_FAST_TEXT``).
    """
    if len(text) < MIN_FAST_TEXT or text_depth(text) > FAST_DEPTH:
        return None
    if len(text) > MAX_INT_DIGITS:
        digits = text.encode("utf-8", "surrogatepass").translate(_DIGITS_ONLY)
        if _TOO_MANY_DIGITS in digits:
            return None
    return [{"kind": "json", "text": text}]


def encode_text(value: object) -> str:
    """Encode ``value`` as the JSON text of its token list (ASCII, compact)."""
    try:
        return json.dumps(encode(value), separators=(",", ":"), allow_nan=False)
    except ValueError as exc:  # e.g. an int with more digits than int->str allows
        if isinstance(exc, WireError):
            raise
        raise WireError(str(exc)) from None


def decode_text(text: str | bytes) -> object:
    """Decode the JSON text of a token list back into a value."""
    return decode(loads_strict(text))


def snapshot(value: object) -> object:
    """Return an independent lossless-JSON copy of ``value`` (raises ``WireError``)."""
    return decode(encode(value))
