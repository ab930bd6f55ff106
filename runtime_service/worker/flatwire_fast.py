"""The flat wire's C-speed path: a plain, shallow value travels as one JSON text.

The token codec in ``flatwire`` walks every value in Python (about 4 MB/s). Most values are
plain documents a few levels deep, which the stdlib's C ``json`` can write and read a hundred
times faster -- but only where it is safe and lossless:

* the C codec recurses once per nesting level. Writing, it runs only under a modest recursion
  limit, whose guard stops it long before the C stack is at risk, and its result is used only
  if the value is at most ``FAST_DEPTH`` levels deep (``plain_depth``). Reading, a linear
  pre-scan (``text_depth``) first proves the text at most ``FAST_DEPTH`` deep;
* it coerces what the wire refuses (tuples, ``str``/``int`` subclasses, non-``str`` keys,
  ``-0.0``), so ``plain_depth`` admits exact JSON types only and the text is checked;
* reading, its hooks decline (``Declined``) every token the wire refuses (NaN, ±Infinity,
  ``-0``, duplicate keys).

Nothing here raises the wire's errors: whatever this path declines, ``flatwire`` redoes on the
token path, which words the error, so both paths accept and refuse exactly the same values.

Stdlib only (imported by the worker under ``python -I -S``).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from gc import get_referents
from itertools import chain, compress, repeat
from operator import is_
from typing import Any, NoReturn, cast

from codemode_wire import json_shape

__all__ = [
    "FAST_DEPTH",
    "MIN_FAST_TEXT",
    "Declined",
    "TooDeep",
    "decode_text",
    "encode_text",
    "plain_depth",
    "plain_text",
    "text_depth",
]

# Containers nested deeper than this take the token path. Real documents are far shallower;
# the bound keeps the C codec's recursion (a few hundred bytes of C stack per level) small
# whatever the recursion limit, and within the default limit's headroom.
FAST_DEPTH = 100
# Shorter texts keep the token encoding: it costs no more there, and it is the spelling that
# hand-written frames and older peers use for the replies and arguments of everyday calls.
MIN_FAST_TEXT = 256
# Where int<->str conversion is unbounded (``sys.set_int_max_str_digits(0)``) or loosely
# bounded, the C codec's quadratic conversion and the peer's own digit limit decide; the token
# path keeps today's behaviour there.
_SAFE_INT_DIGITS = 5000
# Under this recursion limit the C encoder's recursion guard trips long before its C stack
# (a few hundred bytes per level) is at risk, whatever the value's depth.
_SAFE_RECURSION_LIMIT = 4000

_NoneType = type(None)
_JSON_TYPES = frozenset({dict, list, str, int, float, bool, _NoneType})
_STR_ONLY = frozenset({str})
_FEW_NODES = 24
_flat = chain.from_iterable


class Declined(ValueError):
    """The fast path cannot vouch for this input: redo it on the token path."""


class TooDeep(Declined):
    """A text nested deeper than ``FAST_DEPTH``: no C parser may read it."""


def _ints_bounded() -> bool:
    return 0 < sys.get_int_max_str_digits() <= _SAFE_INT_DIGITS


def plain_depth(value: object) -> int | None:
    """The nesting depth of a value the C encoder has just written, if it is plain.

    Plain: only exact JSON types, ``str`` keys, at most ``FAST_DEPTH`` levels of containers.
    Walks one level at a time with C-level passes over the level's values (``get_referents``
    yields the items of lists and the values of dicts, and the keys of dicts whose keys are not
    all ``str``, which are checked apart): a fraction of the C encoder's time. Run only on a
    value the encoder accepted (to which a cycle is endless recursion), so it is acyclic and
    the walk visits no more values than the text holds. NaN/±inf are left to the encoder,
    ``-0.0`` and surrogates to checks of its text.
    """
    level: list[object] = [value]
    for depth in range(FAST_DEPTH + 1):
        present = set(map(type, level))
        if not present <= _JSON_TYPES:
            return None
        if dict in present:
            dicts = cast(
                "Iterable[dict[object, object]]",
                compress(level, map(is_, map(type, level), repeat(dict))),
            )
            if not set(map(type, _flat(dicts))) <= _STR_ONLY:
                return None
        elif list not in present:
            return depth
        level = get_referents(*level)
    return None


# No ``check_circular``: it runs only under a bounded recursion limit (``_recursion_bounded``),
# where a cycle, endless nesting to the encoder, ends in RecursionError as a deep value does;
# the check's bookkeeping per container is an eighth of the encoder's time.
_ENCODER = json.JSONEncoder(
    ensure_ascii=False, check_circular=False, allow_nan=False, separators=(",", ":")
)
# ``-0.0`` is the only float whose repr starts so and ends there (``-0.05`` goes on).
_NEG_ZERO_FLOAT = re.compile(r"-0\.0(?![0-9e])")


def _recursion_bounded() -> bool:
    """Whether the interpreter's recursion guard stops the C encoder before the C stack is at
    risk (each nesting level takes it once): true under any modest limit. A raised limit (a
    program may raise it in its worker) removes that guarantee."""
    return sys.getrecursionlimit() <= _SAFE_RECURSION_LIMIT


def plain_text(value: object, min_length: int = 0) -> str | None:
    """Compact JSON text of a plain value, or None (also for a text under ``min_length``).

    Non-ASCII characters stay themselves, so the text's UTF-8 length is the value's JSON size
    as the output ledger counts it; a text holding any surrogate is declined: a lone one must
    be escaped and a pair refused, which the token path does.
    """
    if not (_ints_bounded() and _recursion_bounded()):
        return None
    try:
        # Cycles, NaN/±inf, integers beyond int_max_str_digits, deep values and non-JSON
        # objects fail here at C speed; what the encoder coerces is caught below.
        text: str = _ENCODER.encode(value)
    except (ValueError, TypeError, RecursionError):
        return None
    if len(text) < min_length:
        return None
    if not text.isascii():
        try:
            text.encode("utf-8")  # fails on a surrogate
        except UnicodeEncodeError:
            return None
    if "-0.0" in text and _NEG_ZERO_FLOAT.search(text):
        return None
    if plain_depth(value) is None:
        return None
    return text


def _few_nodes(value: object) -> bool:
    """Whether ``value`` holds fewer than ``_FEW_NODES`` values (it need not be valid JSON:
    the walk stops once it has seen that many, cycles included)."""
    level: list[object] = [value]
    seen = 0
    while level:
        seen += len(level)
        if seen >= _FEW_NODES:
            return False
        level = get_referents(*level)
    return True


def encode_text(value: object) -> str | None:
    """The text of a json token for ``value`` (``plain_text`` of at least ``MIN_FAST_TEXT``).

    The frame that carries it escapes its non-ASCII characters once. Small values (most
    binding arguments and results) cost the token path no more: they skip the C encoder's
    attempt, whose text would mostly be declined as too short anyway.
    """
    if _few_nodes(value):
        return None
    return plain_text(value, MIN_FAST_TEXT)


# -- reading ---------------------------------------------------------------------------------


def text_depth(text: str) -> int:
    """An upper bound of the nesting depth the JSON scanner reaches on ``text``.

    Brackets inside strings do not count (``json_shape.structure``). On a text the scanner
    rejects, it still bounds the depth reached before the rejection: up to there the text is
    valid JSON, tokenized the same way.
    """
    if text.count("[") + text.count("{") <= 1:
        return 1
    return json_shape.depth(json_shape.structure(text, members=False))


def _decline(*_args: object) -> NoReturn:
    raise Declined


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise Declined
    return obj


def _float(token: str) -> float:
    number = float(token)
    if number - number != 0.0 or (number == 0.0 and token[0] == "-"):  # ±inf, or -0.0
        raise Declined
    return number


def _int(token: str) -> int:
    if token == "-0":
        raise Declined
    return int(token)


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_float=_float, parse_constant=_decline)
# An integer hook costs a Python call per integer: used only when a ``-0`` token may be there.
_DECODER_NEG_ZERO = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_float=_float, parse_int=_int, parse_constant=_decline
)
_INT_NEG_ZERO = re.compile(r"-0(?![.eE0-9])")


def _may_hold_int_neg_zero(text: str) -> bool:
    """False only if no ``-0`` integer token can be in the text (cheap: a literal search)."""
    return _may_hold(_INT_NEG_ZERO, text)


# A ``-0`` integer or a zero float without exponent written with a sign (``-0.0``, ``-0.00``).
_NEG_ZERO = re.compile(r"-0(?:\.0+)?(?![.0-9])")


def _may_hold(pattern: re.Pattern[str], text: str) -> bool:
    if "-0" not in text:
        return False
    for match in pattern.finditer(text):
        start = match.start()
        if start == 0 or text[start - 1] in "[:, \t\n\r":  # "item-0" in a string is fine
            return True
    return False


# Digits to "0", ``e``/``E`` to "e", every other byte to " ".
_NUMERALS = bytes(0x30 if 0x30 <= c <= 0x39 else 0x65 if c in b"eE" else 0x20 for c in range(256))
# A float needs an exponent or this many digits before its point to overflow to infinity.
_OVERFLOW_DIGITS = b"0" * 309

_PLAIN_DECODER = json.JSONDecoder(parse_constant=_decline)


def _hooks_needless(text: str) -> bool:
    """Whether the C decoder without hooks reads ``text`` as the hooked one does, duplicate
    keys aside (``json_shape.values_in`` finds those): no number token that could read as ``-0`` (an
    integer hook's refusal, a float's sign) or overflow to infinity. Conservative: a string
    spelling one ("1e5", "x -0") only costs the hooks."""
    if _may_hold(_NEG_ZERO, text):
        return False
    numerals = text.encode("utf-8", "surrogatepass").translate(_NUMERALS)
    return b"0e" not in numerals and _OVERFLOW_DIGITS not in numerals


def decode_text(text: str) -> object:
    """Parse a JSON text of at most ``FAST_DEPTH`` levels (else ``TooDeep``).

    Raises ``Declined`` or another ValueError for anything the wire refuses or the scanner
    rejects, and ``RecursionError`` where the recursion limit leaves no room for the text's
    depth; the depth is proven first, so the C stack is never at risk.

    The hooks that refuse ``-0``, infinities and duplicate keys cost a Python call per object
    and per float, most of the parse: where the text cannot hold the numbers (``_hooks_needless``)
    the C decoder runs without them, and a count of the values it built against the values the
    text spells (``json_shape.values_in``) finds a duplicate key."""
    shape = json_shape.structure(text)
    if json_shape.depth(shape) > FAST_DEPTH:
        raise TooDeep
    if not _ints_bounded():
        raise Declined
    if _hooks_needless(text):
        value = _PLAIN_DECODER.decode(text)
        if json_shape.values_of(value) == json_shape.values_in(shape):
            return value
        # A duplicate key, or a spaced empty array (``[ ]``) counted as full: the hooks tell.
    decoder = _DECODER_NEG_ZERO if _may_hold_int_neg_zero(text) else _DECODER
    return decoder.decode(text)
