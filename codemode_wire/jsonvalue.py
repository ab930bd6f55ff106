"""Lossless JSON: the one place where JSON text becomes Python values and back.

JSON values cross the API as text in string fields. A `JsonValue` is built only from the exact
types `None`, `bool`, `int`, `float`, `str`, `list` and `dict` with `str` keys. Whatever cannot
round-trip is refused with `JsonValueError` where it appears, never coerced (architecture
invariant 6):

- integers of any magnitude are exact (beyond ±(2**53-1) the TypeScript client reads a bigint);
- floats must be finite and not -0.0 (`-0`, `-0.0`, `-1e-400` and `1e400` are refused on input);
- strings may hold lone surrogates (escaped as `\\udxxx` on output, so they round-trip), but not a
  high+low surrogate pair held as two code points: JSON would read it back as one character, and
  raw surrogates in the input text are refused for the same reason;
- duplicate object keys are refused (keeping either value would drop the other);
- subclasses (`IntEnum`, `StrEnum`, `OrderedDict`, ...) and any other type (tuple, set, bytes) are
  refused: their JSON spelling could differ from what the value means;
- a container that is its own ancestor is a cycle and refused; shared sub-objects are fine and
  are written once per occurrence.

Nothing here recurses on the data: every walk uses an explicit stack, so nesting depth is bounded
by memory only. The C `json` module serves as a fast path only where it cannot recurse deeply
(`_c_decoder_usable`, `_plain_and_shallow`); the pure-Python paths define the behaviour, and
every fast-path failure is redone on the slow path, which words the error.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from functools import partial
from gc import get_referents
from itertools import chain, islice
from typing import NoReturn, cast

from codemode_wire import json_shape
from codemode_wire._jsonbase import JsonTooDeep, JsonValue, JsonValueError
from codemode_wire._jsonencode import END, Cursor, Refused, atom, encode
from codemode_wire._jsonparse import parse, parse_error

__all__ = [
    "JsonTooDeep",
    "JsonValue",
    "JsonValueError",
    "dumps",
    "loads",
    "loads_canonical",
    "render_pretty",
    "snapshot",
    "snapshot_with_text",
]

# ---------------------------------------------------------------------------------------------
# When the C codec may run
# ---------------------------------------------------------------------------------------------

_FAST_DEPTH = 100
# CPython's C json takes the interpreter's recursion guard once per nesting level, so under a
# modest recursion limit a deep text raises RecursionError (and we fall back) long before the C
# stack is at risk; a raised limit (some libraries raise it) removes that guarantee. Proving the
# depth of a 1 MB text exactly costs about as much as parsing it, hence this cheaper proof.
_SAFE_RECURSION_LIMIT = 4000
# Its int<->str conversions are quadratic; they stay cheap only while int_max_str_digits bounds
# them. Longer integers fail there and go through our chunked conversion.
_SAFE_INT_DIGITS = 5000


def _c_ints_bounded() -> bool:
    return 0 < sys.get_int_max_str_digits() <= _SAFE_INT_DIGITS


def _c_decoder_usable(text: str) -> bool:
    """Whether the C decoder may parse `text` without any risk to the C stack."""
    if not _c_ints_bounded():
        return False
    if sys.getrecursionlimit() <= _SAFE_RECURSION_LIMIT:
        return True
    # Opening brackets, even those inside strings, bound the depth.
    return text.count("[") + text.count("{") <= _FAST_DEPTH


# ---------------------------------------------------------------------------------------------
# loads
# ---------------------------------------------------------------------------------------------


class _Declined(ValueError):
    """Raised by fast-path hooks: the slow path re-parses and words the error."""


def _fast_object(pairs: list[tuple[str, JsonValue]]) -> dict[str, JsonValue]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Declined
    return obj


def _fast_float(token: str) -> float:
    number = float(token)
    if number - number != 0.0 or (number == 0.0 and token[0] == "-"):  # ±inf, or -0.0
        raise _Declined
    return number


def _fast_int(token: str) -> int:
    if token == "-0":
        raise _Declined
    return int(token)


def _fast_constant(_token: str) -> NoReturn:
    raise _Declined


_FAST_DECODER = json.JSONDecoder(
    object_pairs_hook=_fast_object, parse_float=_fast_float, parse_constant=_fast_constant
)
# An integer hook costs a Python call per integer; only a text with a `-0` token can need it.
_INT_NEG_ZERO = re.compile(r"-0(?![.eE0-9])")
_FAST_DECODER_NEG = json.JSONDecoder(
    object_pairs_hook=_fast_object,
    parse_float=_fast_float,
    parse_int=_fast_int,
    parse_constant=_fast_constant,
)
_TRUSTED_DECODER = json.JSONDecoder()  # for text that `_encode` produced on its fast path


def _may_hold_int_neg_zero(text: str) -> bool:
    """False only if no `-0` integer token can be in the text (cheap: a literal search)."""
    if "-0" not in text:
        return False
    for match in _INT_NEG_ZERO.finditer(text):
        start = match.start()
        if start == 0 or text[start - 1] in "[:, \t\n\r":  # "item-0" in a string is fine
            return True
    return False


def _decode_fast(text: str) -> JsonValue:
    """Parse with the C scanner; raises ValueError/RecursionError whenever it cannot vouch."""
    decoder = _FAST_DECODER_NEG if _may_hold_int_neg_zero(text) else _FAST_DECODER
    value: JsonValue = decoder.decode(text)
    return value


def _text_of(data: str | bytes) -> str:
    if isinstance(data, str):
        if not data.isascii():
            # A raw surrogate is not Unicode text (and could forge a pair). The UTF-32 encoder
            # refuses it too, and is the cheapest of the codecs that check.
            try:
                data.encode("utf-32-le")
            except UnicodeEncodeError as exc:
                char = f"U+{ord(data[exc.start]):04X}"
                raise parse_error(data, exc.start, f"raw surrogate {char} in the text") from None
        return data
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonValueError(
                f"invalid JSON: not UTF-8 at byte offset {exc.start}", offset=exc.start
            ) from None
    raise TypeError(f"loads() takes str or bytes, not {type(data).__qualname__}")


def loads(text: str | bytes, *, max_depth: int | None = None) -> JsonValue:
    """Parse one strict RFC 8259 JSON text (bytes must be UTF-8, no byte order mark).

    With `max_depth`, a text with a container nested deeper (inside more than `max_depth`
    others: `[[]]` is 1 deep) is refused with JsonTooDeep, found without building the levels
    past the limit."""
    text = _text_of(text)
    if _c_decoder_usable(text):
        try:
            value = _decode_fast(text)
        except (ValueError, RecursionError):
            pass
        else:
            if max_depth is None or _within_depth(text, value, max_depth):
                return value
    return parse(text, max_depth)


def loads_canonical(
    text: str | bytes, *, max_depth: int | None = None, yielding: bool = False
) -> tuple[JsonValue, str]:
    """`loads(text)` and the canonical text `dumps` gives for it, for less than the two calls:
    a value the C decoder has just built needs no proof of its types before the C encoder
    writes it. Same errors as `loads`.

    `yielding` is for a worker thread: the C codec holds the interpreter lock for all of one
    call (a second or more for a few MB of numbers on a loaded machine), stalling every other
    thread, the event loop's included. Yielding, the decoder calls a Python hook per integer
    (where the lock can change hands) and the encoder writes large containers in pieces."""
    text = _text_of(text)
    if _c_decoder_usable(text):
        spelling = _Spelling() if len(text) >= _SPELLING_CHECK_MIN else None
        try:
            value: JsonValue
            if spelling is not None:
                value = spelling.decoder(neg_zero=yielding or _may_hold_int_neg_zero(text))(text)
            elif yielding:
                # The integer hook (it also refuses `-0`) gives the lock a chance per integer.
                value = _FAST_DECODER_NEG.decode(text)
            else:
                value = _decode_fast(text)
        except (ValueError, RecursionError):
            pass
        else:
            if max_depth is None or _within_depth(text, value, max_depth):
                if spelling is not None and spelling.canonical(text):
                    return value, text  # already spelled as `dumps` spells it
                return value, _encode_pieces(value) if yielding else _encode_decoded(value)
    value = parse(text, max_depth)
    return value, dumps(value)


# Below this size writing the canonical text costs less than proving the text already is.
_SPELLING_CHECK_MIN = 2048
# Structural characters to "s", JSON whitespace to "w", every other byte to "x".
_SPACING = bytes(0x73 if c in b"[]{},:" else 0x77 if c in b" \t\n\r" else 0x78 for c in range(256))
# The escapes `dumps` writes (`json.encoder.ESCAPE_DCT`): the short ones, and `\u00XX` for the
# other control characters. Any other escape (`\/`, `\u0041`, a surrogate's) is respelled.
_CANONICAL_ESCAPE = re.compile(r'\\(?:["\\bfnrt]|u00(?:0[0-7bef]|1[0-9a-f]))')


class _Spelling:
    """Whether a text the C decoder reads is the very text `dumps` writes for its value, so
    that `loads_canonical` returns it instead of writing it again (the dominant cost of
    admitting large arguments).

    Sufficient conditions, each checked at C speed and conservatively (a doubt writes the text
    anew, which is always right): every float token is its `repr` (checked as the decoder reads
    it); no JSON whitespace touches a structural character or ends the text (whitespace between
    tokens always does; a string holding, say, ", " is merely written again); and every escape
    is one `dumps` writes. Integer tokens are always canonical (JSON allows no leading zero or
    sign; `-0` is refused), and `true`/`false`/`null` and object key order are kept as read."""

    __slots__ = ("_floats_canonical",)

    def __init__(self) -> None:
        self._floats_canonical = True

    def decoder(self, *, neg_zero: bool) -> Callable[[str], JsonValue]:
        """The C decoder with a float hook that also checks spellings, and no object hook: a
        duplicate key is found by counting the values built against the values the text
        spells (``json_shape``), which costs a fraction of a Python call per object."""

        def parse_float(token: str) -> float:
            number = float(token)
            if float.__repr__(number) == token:
                if token == "-0.0":  # the one canonical spelling of a refused float
                    raise _Declined
                return number
            self._floats_canonical = False
            return _fast_float(token)  # refuses ±inf and every other -0

        decoder = json.JSONDecoder(
            parse_float=parse_float,
            parse_int=_fast_int if neg_zero else None,
            parse_constant=_fast_constant,
        )

        def decode(text: str) -> JsonValue:
            value: JsonValue = decoder.decode(text)
            if json_shape.values_of(value) == json_shape.values_in(json_shape.structure(text)):
                return value
            # A duplicate key, or a spaced empty array (`[ ]`) counted as full: the object hook
            # tells (its refusal sends the text to the slow path, which words the error).
            hooked = _FAST_DECODER_NEG if neg_zero else _FAST_DECODER
            return cast(JsonValue, hooked.decode(text))

        return decode

    def canonical(self, text: str) -> bool:
        if not self._floats_canonical:
            return False
        if "\\" in text and "\\" in _CANONICAL_ESCAPE.sub("", text):
            return False
        marks = text.encode("utf-8").translate(_SPACING)  # `_text_of` refused raw surrogates
        return not (
            marks.startswith(b"w") or marks.endswith(b"w") or b"sw" in marks or b"ws" in marks
        )


_PIECE = 4096  # members per C encoder call when writing in pieces
_PIECE_LEVELS = 4  # containers this deep or deeper are written in one call, whatever their size


def _is_big(value: object) -> bool:
    return (type(value) is list or type(value) is dict) and len(value) > _PIECE


def _encode_pieces(value: JsonValue, levels: int = _PIECE_LEVELS) -> str:
    """`_encode_decoded(value)`, written with no C call over more than `_PIECE` members of a
    container in the top `_PIECE_LEVELS` levels (deeper large containers: one call each)."""
    if levels == 0 or not (type(value) is list or type(value) is dict):
        return _encode_decoded(value)
    if type(value) is list:
        parts: list[str] = []
        for start in range(0, len(value), _PIECE):
            piece = value[start : start + _PIECE]
            if any(map(_is_big, piece)):
                parts.extend(_encode_pieces(item, levels - 1) for item in piece)
            else:
                parts.append(_encode_decoded(piece)[1:-1])
        return "[" + ",".join(parts) + "]"
    assert isinstance(value, dict)
    members = iter(value.items())
    parts = []
    while chunk := dict(islice(members, _PIECE)):
        if any(map(_is_big, chunk.values())):
            parts.extend(
                _encode_decoded(key) + ":" + _encode_pieces(item, levels - 1)
                for key, item in chunk.items()
            )
        else:
            parts.append(_encode_decoded(chunk)[1:-1])
    return "{" + ",".join(parts) + "}"


def _encode_decoded(value: JsonValue) -> str:
    """`dumps(value)` of a value `_decode_fast` returned: exact JSON types, str keys, no -0,
    no non-finite float, and nested no deeper than the C decoder could safely go, which is
    exactly as deep as the C encoder (it takes the same recursion guard per level) can."""
    try:
        text: str = _ENCODER.encode(value)
        if not text.isascii():
            text.encode("utf-8")  # fails on a surrogate: the slow path escapes it
    except (ValueError, RecursionError):
        return encode(value, "$")
    return text


def _within_depth(text: str, value: JsonValue, max_depth: int) -> bool:
    """Whether a value the C decoder produced from `text` nests at most `max_depth` deep."""
    if max_depth >= sys.getrecursionlimit():
        return True  # the C decoder takes the recursion guard per level: it could not be deeper
    if text.count("[") + text.count("{") <= max_depth + 1:
        return True
    level: list[object] = [value]
    for _ in range(max_depth + 1):  # then `level` holds the values `max_depth + 1` deep
        dicts = cast(list[dict[object, object]], list(filter(_is_dict, level)))
        lists = cast(list[list[object]], list(filter(_is_list, level)))
        level = list(chain(_flat(lists), _flat(map(dict.values, dicts))))
        if not level:
            return True
    return not any(map(_is_container, level))


def _loads_slow(text: str | bytes) -> JsonValue:
    """`loads` without the C fast path (for tests and the benchmark)."""
    return parse(_text_of(text))


# ---------------------------------------------------------------------------------------------
# dumps and snapshot
# ---------------------------------------------------------------------------------------------

_NoneType = type(None)
_JSON_TYPES = frozenset({dict, list, str, int, float, bool, _NoneType})
_STR_ONLY = frozenset({str})
# isinstance checks as C callables; exact once the level's types are known to be JSON types.
_is_dict = partial(type.__instancecheck__, dict)
_is_list = partial(type.__instancecheck__, list)


def _is_container(value: object) -> bool:
    return type(value) is list or type(value) is dict


_flat = chain.from_iterable


def _plain_and_shallow(value: object) -> bool:
    """True if `value` has only exact JSON types and str keys, and is at most _FAST_DEPTH
    levels deep (so it is also acyclic: a cycle never bottoms out).

    It walks one level at a time with C-level passes (map/filter/get_referents) over all values
    of the level, so it costs a fraction of the C encoder's time. NaN/±inf are left to the encoder
    (allow_nan=False), surrogates to a check of its output.
    """
    level = [value]
    for _ in range(_FAST_DEPTH + 1):
        present = set(map(type, level))
        if not present <= _JSON_TYPES:
            return False
        if dict in present:
            dicts = cast(list[dict[object, object]], list(filter(_is_dict, level)))
            if not set(map(type, _flat(dicts))) <= _STR_ONLY:
                return False
        elif list not in present:
            return True
        # The next level in one C call: the items of lists and the values of dicts (with
        # their keys, already checked, where a dict's keys are not all exact `str`); scalars
        # refer to nothing.
        level = get_referents(*level)
    return False


_ENCODER = json.JSONEncoder(
    ensure_ascii=False, check_circular=False, allow_nan=False, separators=(",", ":")
)


def _encode_fast(value: object) -> str | None:
    """The C encoder's text, or None where it cannot vouch for the result."""
    # The walk proves the depth, so the C encoder is safe under any recursion limit.
    if not (_c_ints_bounded() and _plain_and_shallow(value)):
        return None
    try:
        text: str = _ENCODER.encode(value)
        if not text.isascii():
            text.encode("utf-8")  # fails on a surrogate: the slow path escapes or refuses it
    except (ValueError, RecursionError):  # also NaN/±inf, integers beyond int_max_str_digits
        return None
    if "-0.0" in text and _NEG_ZERO_FLOAT.search(text):
        return None  # the slow path refuses it, naming its path
    return text


# The encoder writes -0.0 as `-0.0` (the only float whose repr stops there: `-0.05` goes on),
# between the separators of its compact text; the same characters so placed inside a string
# merely send the value to the slow path.
_NEG_ZERO_FLOAT = re.compile(r"(?:^|[\[:,])-0\.0(?=[,\]}]|$)")


def _encode(value: object, root: str = "$") -> tuple[str, bool]:
    """Compact JSON text of `value`, and whether the C fast path produced it."""
    text = _encode_fast(value)
    if text is not None:
        return text, True
    return encode(value, root), False


def dumps(value: object) -> str:
    """Compact JSON text (`,` and `:` separators, non-ASCII kept, lone surrogates escaped).

    Raises JsonValueError naming the JSON path of the first value that is not lossless JSON.
    """
    return _encode(value)[0]


def _dumps_slow(value: object) -> str:
    """`dumps` without the C fast path (for tests and the benchmark)."""
    return encode(value, "$")


def snapshot(value: object) -> JsonValue:
    """A validated deep copy: same acceptance rules as `dumps`, shares no container with `value`."""
    return snapshot_with_text(value)[0]


def snapshot_with_text(value: object) -> tuple[JsonValue, str]:
    """`snapshot(value)` and `dumps(value)` for the price of one encode."""
    text, fast = _encode(value)
    copy: JsonValue = _TRUSTED_DECODER.decode(text) if fast else loads(text)
    return copy, text


# ---------------------------------------------------------------------------------------------
# render_pretty
# ---------------------------------------------------------------------------------------------

_PRETTY_LEVELS = 5  # containers at depth 0-4 are pretty: their children sit at most 10 spaces in


def render_pretty(value: JsonValue) -> str:
    """The `run_code` result text: a string root as is (no quotes, no escaping); any other root
    as JSON indented by two spaces per level, with the total indentation capped at 10 spaces.

    Cap rule: a non-empty container at depth 0-4 (the root is depth 0) is written one child per
    line, children indented `2 * (depth + 1)` spaces, its closing bracket on its own line at the
    container's indentation; object members are `"key": value`. A container at depth 5 or deeper
    (its children would sit at 12+ spaces) is written compact on one line, exactly as `dumps`
    writes it (`{"k":[1,2]}`), on the line where it starts. Empty containers are always `[]`/`{}`.
    Raises JsonValueError like `dumps` for values that are not lossless JSON.
    """
    if type(value) is str:
        return value
    out: list[str] = []
    walk = Cursor()
    current: object = value
    while True:
        try:
            text = atom(current)
        except Refused as exc:
            walk.refuse("$", str(exc))
        if text is not None:
            out.append(text)
        elif not current or len(walk.containers) >= _PRETTY_LEVELS:
            out.append(_encode(current, walk.path("$"))[0])
        else:
            assert isinstance(current, list | dict)
            if id(current) in walk.open_ids:
                walk.refuse("$", f"cycle: this {type(current).__name__} contains itself")
            walk.open(current)
            out.append("{" if type(current) is dict else "[")
        while walk.containers:
            current = walk.advance()
            if current is END:
                closer = walk.close()
                out.append("\n" + "  " * len(walk.containers) + closer)
                continue
            first = out[-1] in ("[", "{")
            out.append(("\n" if first else ",\n") + "  " * len(walk.containers))
            if type(walk.containers[-1]) is dict:
                out.append(walk.key_text("$") + ": ")
            break
        else:
            return "".join(out)
