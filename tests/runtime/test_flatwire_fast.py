"""The flat wire's C-speed path agrees with the token path on every input.

Property-style (seeded random generators; hypothesis is not in the lock): for the same value,
the fast path (one ``{"kind": "json", "text": ...}`` token) and the iterative token path give
the same decoded value (types, key order and float bits included), the same JSON byte count as
the output ledger charges, and the same errors. Texts are checked the same way on the decoding
side: a text in a json token decodes, or fails, exactly as the equivalent token list does.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest

from codemode_wire import json_shape
from runtime_service.outcome import BindingCall, BindingResult, RunFailure
from runtime_service.worker import flatwire, flatwire_fast, ledger
from runtime_service.worker.flatwire import FAST_DEPTH, WireError
from runtime_service.worker.flatwire_fast import MIN_FAST_TEXT
from tests.runtime.conftest import ProgramRunner
from tests.runtime.deep import list_depth, nested_lists
from tests.runtime.test_hostile import PRELUDE

# -- helpers ---------------------------------------------------------------------------------


def same(left: object, right: object) -> bool:
    """Deep equality that also tells 1 / 1.0 / True apart, float bits and key order (iterative)."""
    stack: list[tuple[object, object]] = [(left, right)]
    while stack:
        a, b = stack.pop()
        if type(a) is not type(b):
            return False
        if type(a) is float:
            if a.hex() != b.hex():  # type: ignore[attr-defined]
                return False
        elif type(a) is list:
            assert isinstance(b, list)
            if len(a) != len(b):
                return False
            stack.extend(zip(a, b, strict=True))
        elif type(a) is dict:
            assert isinstance(b, dict)
            if list(a) != list(b):
                return False
            stack.extend((a[k], b[k]) for k in a)
        elif a != b:
            return False
    return True


def outcome(fn: Callable[[], object]) -> tuple[str, object]:
    """("ok", value) or ("error", (exception type, message))."""
    try:
        return "ok", fn()
    except (WireError, ValueError) as exc:
        return "error", (type(exc), str(exc))


def token_path(value: object) -> list[Any]:
    """The value's encoding with the fast path bypassed."""
    return flatwire._encode_tree(value)


def without_fast_path(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with the fast encoder standing aside."""

    def run() -> object:
        with mock.patch.object(flatwire_fast, "encode_text", return_value=None):
            return fn()

    return run


def json_token(text: str) -> list[Any]:
    return [{"kind": "json", "text": text}]


def fast_text(value: object) -> str:
    tokens = flatwire.encode(value)
    assert len(tokens) == 1 and tokens[0]["kind"] == "json", "expected the fast path"
    text: str = tokens[0]["text"]
    return text


def padded(value: object) -> dict[str, object]:
    """``value`` inside a document large enough for the fast path."""
    return {"pad": ["x" * 40] * 24, "value": value}


def keyed(key: object) -> dict[object, object]:
    """A document large enough for the fast path, with one more member under ``key``."""
    document: dict[object, object] = {"pad": ["x" * 40] * 24}
    document[key] = 1
    return document


# -- random values ---------------------------------------------------------------------------

_STRING_PIECES = [
    "a",
    "key",
    "[",
    "]",
    "{",
    "}",
    "[[{{",
    '"',
    '\\"',
    "\\",
    "\\\\",
    '"]}',
    "\n",
    "\t",
    "\x00",
    "\x1f",
    "\x7f",
    "é",
    "日本",
    "\U0001f600",
    "\U0010ffff",
    "-0",
    "-0.0,",
    "NaN",
    "Infinity",
    "\u2028",
]


def random_string(rng: random.Random, surrogates: bool) -> str:
    pieces = rng.choices(_STRING_PIECES, k=rng.randrange(0, 6))
    if surrogates and rng.random() < 0.2:
        pieces.insert(rng.randrange(len(pieces) + 1), rng.choice(["\ud800", "\udfff", "\udc00"]))
    return "".join(pieces)


def random_float(rng: random.Random) -> float:
    choice = rng.randrange(6)
    if choice == 0:
        return rng.uniform(-1e6, 1e6)
    if choice == 1:
        return math.ldexp(rng.random(), rng.randrange(-1074, 1000))  # subnormals to huge
    if choice == 2:
        return -math.ldexp(rng.random() or 0.5, rng.randrange(-1074, 1000))
    if choice == 3:
        return rng.choice([0.0, 0.1, -0.05, 1e16, 5e-324, 1.7976931348623157e308, 2.5])
    if choice == 4:
        return float(rng.randrange(-(10**6), 10**6))
    return rng.random()


def random_scalar(rng: random.Random, surrogates: bool) -> object:
    choice = rng.randrange(7)
    if choice == 0:
        return rng.choice([None, True, False])
    if choice == 1:
        return rng.randrange(-1000, 1000)
    if choice == 2:
        return rng.choice([2**53 + 1, -(2**63), 10**300, -(10**4299), 0])
    if choice == 3:
        return random_float(rng)
    return random_string(rng, surrogates)


def random_value(rng: random.Random, depth: int, surrogates: bool = True) -> object:
    if depth <= 0 or rng.random() < 0.25:
        return random_scalar(rng, surrogates)
    if rng.random() < 0.5:
        return [random_value(rng, depth - 1, surrogates) for _ in range(rng.randrange(0, 6))]
    return {
        random_string(rng, surrogates): random_value(rng, depth - 1, surrogates)
        for _ in range(rng.randrange(0, 6))
    }


def random_values(seed: int, count: int) -> Iterator[object]:
    rng = random.Random(seed)
    for _ in range(count):
        value = random_value(rng, rng.randrange(1, 7), surrogates=rng.random() < 0.3)
        yield padded(value) if rng.random() < 0.8 else value


# -- encoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_fast_and_token_paths_agree_on_random_values(seed: int) -> None:
    fast_seen = 0
    for value in random_values(seed, 150):
        slow = token_path(value)
        tokens = flatwire.encode(value)
        if tokens[0] != slow[0] or len(tokens) != len(slow):
            fast_seen += 1
            assert tokens == json_token(tokens[0]["text"])
            text = tokens[0]["text"]
            # The bytes the ledger's walk charges are those of the fast text.
            assert ledger._walk_size(value, 1 << 40) == len(text.encode("utf-8"))
            assert ledger.json_value_size(value, 1 << 40) == len(text.encode("utf-8"))
        assert same(flatwire.decode(tokens), flatwire.decode(slow))
        assert same(flatwire.decode(tokens), value)
        assert same(flatwire.decode_text(flatwire.encode_text(value)), value)
        assert same(flatwire.snapshot(value), value)
    assert fast_seen > 50, "the generator should mostly produce fast-path values"


def _cycle() -> list[object]:
    value: list[object] = ["x" * 300]
    value.append(value)
    return value


def _fanout_cycle() -> list[object]:
    # Both children are the list itself: a level-by-level walk would double every level.
    value: list[object] = ["x" * 300]
    value.append(value)
    value.append(value)
    return value


class _Str(str):
    pass


class _Int(int):
    pass


class _Float(float):
    pass


class _List(list[object]):
    pass


class _Dict(dict[str, object]):
    pass


@pytest.mark.parametrize(
    "value",
    [
        padded(math.nan),
        padded(math.inf),
        padded(-math.inf),
        padded(-0.0),
        padded([1.5, -0.0, 2.5]),
        padded((1, 2)),
        padded({1, 2}),
        padded(b"bytes"),
        padded(1j),
        padded(object()),
        keyed(1),
        keyed(None),
        keyed(True),
        keyed(1.5),
        keyed(_Str("k")),
        padded(_Str("x")),
        padded(_Int(3)),
        padded(_Float(1.5)),
        padded(_List([1])),
        padded(_Dict(a=1)),
        padded("\ud83d\ude00"),
        keyed("\ud83d\ude00"),
        _cycle(),
        _fanout_cycle(),
        padded(10**5000),
    ],
    ids=lambda value: type(value).__name__,
)
def test_lossy_values_fail_alike_on_both_paths(value: object) -> None:
    assert flatwire_fast.encode_text(value) is None
    assert outcome(lambda: flatwire.encode(value)) == outcome(lambda: token_path(value))
    encode_text = lambda: flatwire.encode_text(value)  # noqa: E731
    assert outcome(encode_text) == outcome(without_fast_path(encode_text))


def test_lone_surrogates_take_the_token_path_and_round_trip() -> None:
    value = padded(["\ud800", "a\udfffb", {"\udc00": "\ud8ff"}])
    assert flatwire_fast.encode_text(value) is None
    assert same(flatwire.decode_text(flatwire.encode_text(value)), value)


def test_unicode_beyond_the_bmp_takes_the_fast_path() -> None:
    value = padded({"\U0001f600 😀 \U0010ffff": ["日本", "é", "\U0001f600" * 50]})
    text = fast_text(value)
    wire = flatwire.encode_text(value)
    assert wire.isascii()  # the frame stays ASCII: the token text is escaped once in it
    assert same(flatwire.decode_text(wire), value)
    assert ledger._walk_size(value, 1 << 40) == len(text.encode("utf-8"))


def test_huge_ints_within_the_limit_are_exact() -> None:
    big = 10**4299 + 7
    value = padded([big, -big, 2**64])
    fast_text(value)
    assert same(flatwire.decode_text(flatwire.encode_text(value)), value)


def test_floats_round_trip_bit_for_bit() -> None:
    rng = random.Random(7)
    floats = [random_float(rng) for _ in range(2000)]
    floats = [f for f in floats if not (f == 0.0 and math.copysign(1.0, f) < 0)]
    decoded = flatwire.decode_text(flatwire.encode_text(floats))
    assert isinstance(decoded, list)
    assert [f.hex() for f in decoded] == [f.hex() for f in floats]


def test_small_values_keep_the_token_encoding() -> None:
    assert flatwire.encode({"echo": 5}) == [{"kind": "object", "keys": ["echo"]}, 5]
    # A few values, however long, are not worth the C encoder's attempt.
    few = {"a": "y" * 1000, "b": [2, {"c": "y" * 1000}]}
    assert flatwire.encode(few) == token_path(few)
    value = [[0] * 30, ["y" * (MIN_FAST_TEXT - 69)]]
    assert len(json.dumps(value, separators=(",", ":"))) == MIN_FAST_TEXT - 1
    assert flatwire.encode(value) == token_path(value)
    fast_text([[0] * 30, ["y" * (MIN_FAST_TEXT - 68)]])


def _nested(depth: int) -> list[object]:
    value = nested_lists(depth - 1)  # depth - 1 levels below the root: depth levels in all
    value.append("z" * MIN_FAST_TEXT)
    return value


@pytest.mark.parametrize("depth", [FAST_DEPTH - 1, FAST_DEPTH, FAST_DEPTH + 1, FAST_DEPTH + 50])
def test_depth_around_the_fast_bound(depth: int) -> None:
    value = _nested(depth)
    tokens = flatwire.encode(value)
    if depth <= FAST_DEPTH:
        assert flatwire_fast.text_depth(fast_text(value)) == depth
    else:
        assert tokens == token_path(value)
    assert list_depth(flatwire.decode_text(flatwire.encode_text(value))) == depth - 1


def test_a_raised_recursion_limit_keeps_deep_values_iterative() -> None:
    # Under a raised limit the C encoder's recursion guard no longer protects the C stack:
    # the fast path stands aside and a 100,000-deep value still round-trips.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1_000_000)
    try:
        assert flatwire_fast.encode_text(padded(1)) is None
        deep = nested_lists(100_000)
        assert list_depth(flatwire.decode_text(flatwire.encode_text(deep))) == 100_000
    finally:
        sys.setrecursionlimit(old)


def test_a_lowered_recursion_limit_still_reads_fast_tokens() -> None:
    text = flatwire.encode_text(_nested(FAST_DEPTH))
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(60, _stack_depth() + 20))
    try:
        decoded = flatwire.decode_text(text)
    finally:
        sys.setrecursionlimit(old)
    assert list_depth(decoded) == FAST_DEPTH - 1


def _stack_depth() -> int:
    frame = sys._getframe()
    depth = 0
    while frame is not None:
        depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    return depth


# -- decoding --------------------------------------------------------------------------------


def token_equivalent(text: str) -> list[Any]:
    """The token list that says what ``text`` says (parsed as ``loads_strict`` does)."""
    return flatwire._tokens_of(flatwire.loads_strict(text))


def decode_alike(text: str) -> tuple[str, object]:
    """What the json token decodes to, asserting the equivalent token list decodes the same."""
    fast = outcome(lambda: flatwire.decode(json_token(text)))
    slow = outcome(lambda: flatwire.decode(token_equivalent(text)))
    if fast[0] == "ok":
        assert slow[0] == "ok" and same(fast[1], slow[1]), text
    else:
        assert fast == slow, text
    return fast


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[NaN]", "NaN is not valid JSON"),
        ('{"a":[Infinity]}', "Infinity is not valid JSON"),
        ("[-Infinity]", "-Infinity is not valid JSON"),
        ('{"a":1,"a":2}', "duplicate key in JSON object"),
        ('[{"k":{"x":1,"x":1}}]', "duplicate key in JSON object"),
        ("[-0]", "negative zero (-0) cannot round-trip through JSON"),
        ('{"a":[1,-0]}', "negative zero (-0) cannot round-trip through JSON"),
        ("[-0.0]", "negative zero (-0) cannot round-trip through JSON"),
        ("[-0e3]", "negative zero (-0) cannot round-trip through JSON"),
        ("[-1e-400]", "negative zero (-0) cannot round-trip through JSON"),
        ("[1e400]", "invalid token of type float"),
        ('{"a":-1e400}', "invalid token of type float"),
        ("[1", "invalid JSON text: Expecting ',' delimiter: line 1 column 3 (char 2)"),
        ("", "invalid JSON text: Expecting value: line 1 column 1 (char 0)"),
        ("[1] [2]", "invalid JSON text: Extra data: line 1 column 5 (char 4)"),
        ('["\x01"]', "invalid JSON text: Invalid control character at: line 1 column 3 (char 2)"),
        (f"[{'1' * 5000}]", None),  # beyond int_max_str_digits
    ],
)
def test_refused_texts_fail_alike(text: str, message: str | None) -> None:
    result = decode_alike(text)
    assert result[0] == "error"
    if message is not None:
        assert result[1] == (WireError, message)


@pytest.mark.parametrize(
    "text",
    [
        '["[[[[[[", "]]]]", "{{{"]',
        '{"a\\"[[[": "\\\\", "b": "\\\\\\"[[[["}',
        '["\\u005b\\u005b", "\\ud83d\\ude00", "\\ud800"]',
        '{"-0": "-0", "x": [0, -0.5, 0.0, -10, 5e-324]}',
        '[[], {}, [[]], [{}], {"a": {}}]',
        ' [ 1 , { "a" : [ true , false , null ] } ] ',
        "[" + '"' + "[" * 5000 + '"' + "]",
        "[" * FAST_DEPTH + "]" * FAST_DEPTH,
    ],
)
def test_accepted_texts_decode_alike(text: str) -> None:
    result = decode_alike(text)
    assert result[0] == "ok"
    assert same(result[1], json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        "[" * (FAST_DEPTH + 1) + "]" * (FAST_DEPTH + 1),
        '{"a":' * FAST_DEPTH + "[1]" + "}" * FAST_DEPTH,
        "[" * 1_000_000,  # unbalanced: refused by the pre-scan before any parser sees it
        "[" * 600 + '"',
    ],
)
def test_texts_deeper_than_the_bound_are_refused(text: str) -> None:
    with pytest.raises(WireError, match=f"nested deeper than {FAST_DEPTH} levels"):
        flatwire.decode(json_token(text))


@pytest.mark.parametrize(
    "tokens",
    [
        [{"kind": "json"}],
        [{"kind": "json", "text": 1}],
        [{"kind": "json", "text": "[1]", "extra": 1}],
        [{"kind": "json", "length": 1}],
        [{"kind": "json", "text": "[1]"}, 1],  # only valid as the sole token
        [{"kind": "array", "length": 1}, {"kind": "json", "text": "[1]"}],
    ],
)
def test_malformed_json_tokens_are_rejected(tokens: list[Any]) -> None:
    with pytest.raises(WireError, match="invalid marker token"):
        flatwire.decode(tokens)


def random_text(rng: random.Random) -> str:
    """JSON-ish text: valid documents, some damaged by a random edit."""
    value = random_value(rng, rng.randrange(1, 6))
    text = json.dumps(value, ensure_ascii=rng.random() < 0.5)
    if rng.random() < 0.4 and text:
        spot = rng.randrange(len(text))
        edit = rng.choice(["-0", "NaN", "1e400", "[", "]", '"', "\\", ",", "-0.0", ""])
        text = text[:spot] + edit + text[spot + rng.randrange(2) :]
    return text


@pytest.mark.parametrize("seed", range(4))
def test_random_texts_decode_alike(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        text = random_text(rng)
        decode_alike(text)


@pytest.mark.parametrize("seed", range(4))
def test_the_depth_pre_scan_bounds_the_true_depth(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        value = random_value(rng, rng.randrange(1, 9))
        text = json.dumps(value)
        depth = _value_depth(value)
        assert depth <= flatwire_fast.text_depth(text) <= depth + 4, text


def _value_depth(value: object) -> int:
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            deepest = max(deepest, depth + 1)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


# -- through a real worker -------------------------------------------------------------------


async def test_large_documents_cross_the_worker_wire_intact(run_program: ProgramRunner) -> None:
    seen: list[object] = []

    async def handler(call: BindingCall) -> BindingResult:
        seen.append(call.arguments)
        return BindingResult.success({"echo": call.arguments})

    program = "deep = []\ncursor = deep\nfor _ in range(5000):\n    cursor.append([])\n"
    program += "    cursor = cursor[0]\n" + (
        "rows = [{'id': i, 'name': f'item-{i}', 'tags': ['[', ']', '\"'], 'score': i * 0.5,"
        " 'ok': i % 2 == 0, 'emoji': '\\U0001f600'} for i in range(2000)]\n"
        "reply = await tools.echo({'rows': rows})\n"
        "assert reply == {'echo': {'rows': rows}}, 'reply differs'\n"
        "return {'rows': rows, 'deep': deep}\n"
    )
    result = await run_program(program, bindings=("echo",), handler=handler)
    assert result.error is None
    rows = [
        {
            "id": i,
            "name": f"item-{i}",
            "tags": ["[", "]", '"'],
            "score": i * 0.5,
            "ok": i % 2 == 0,
            "emoji": "\U0001f600",
        }
        for i in range(2000)
    ]
    assert seen == [{"rows": rows}]
    assert isinstance(result.value, dict)
    assert result.value["rows"] == rows
    assert list_depth(result.value["deep"]) == 5000


async def test_forged_json_tokens_from_a_hostile_worker_are_refused(
    run_program: ProgramRunner,
) -> None:
    seen: list[object] = []

    async def handler(call: BindingCall) -> BindingResult:
        seen.append(call.arguments)
        return BindingResult.success(call.arguments)

    forged = [
        '{"a":1,"a":2}',  # duplicate keys
        "[NaN]",
        "[1e400]",
        '{"x":[-0]}',
        "[" * (FAST_DEPTH + 1) + "]" * (FAST_DEPTH + 1),
        "[" * 200_000,
    ]
    program = PRELUDE + (
        f"forged = {forged!r}\n"
        "for i, text in enumerate(forged):\n"
        "    send({'t': 'call', 'id': 1000 + i, 'name': 'echo',"
        " 'args': [{'kind': 'json', 'text': text}]})\n"
        "replies = [recv() for _ in forged]\n"
        "assert [r['ok'] for r in replies] == [False] * len(forged), replies\n"
        "assert {r['message'] for r in replies} == {'tool arguments must be lossless JSON'}\n"
        "send({'t': 'done', 'value': [{'kind': 'json', 'text': '[NaN]'}]})\n"
        "import time\ntime.sleep(5)\n"
    )
    result = await run_program(program, bindings=("echo",), handler=handler)
    assert result.error == RunFailure("invalid-output", "program completion must be lossless JSON")
    assert seen == []


@pytest.mark.parametrize("seed", range(4))
def test_the_ledger_charges_what_its_walk_charges(seed: int) -> None:
    # json_value_size measures plain values by their C-encoded text: the same byte counts as
    # the walk, at and around every limit.
    rng = random.Random(seed)
    for value in random_values(seed, 100):
        size = ledger._walk_size(value, 1 << 40)
        for limit in (0, size - 1, size, size + 1, rng.randrange(size + 1)):
            assert ledger.json_value_size(value, limit) == ledger._walk_size(value, limit)


# -- the C decoder without hooks ---------------------------------------------------------------
# Where no number token can be refused (``_hooks_needless``), json tokens are read without the
# Python hooks, and a count of the values built against the values the text spells finds a
# duplicate key. Whatever the spelling, the outcome is the token path's.

_KEYS = ["a", "b", "a,", "[", "{a:", '"', "\\", "\u00e9", "\\u0061"]


def _text_with_pairs(rng: random.Random, depth: int) -> tuple[str, bool]:
    """A JSON text whose objects are written member by member from a few keys (so keys
    repeat often, also spelled differently: ``"\\u0061"`` is ``"a"``), spaced at random; and
    whether it repeats a key in some object."""
    space = rng.choice(["", "", " ", "\n "])
    if depth <= 0 or rng.random() < 0.2:
        leaf = rng.choice(["1", "-2", "0.5", "-0.25", '"x"', '"a,b"', '"[{"', "true", "null"])
        return leaf, False
    if rng.random() < 0.4:
        items = [_text_with_pairs(rng, depth - 1) for _ in range(rng.randrange(0, 4))]
        body = ("," + space).join(text for text, _ in items)
        return "[" + space + body + space + "]", any(dup for _, dup in items)
    members: list[str] = []
    names: set[str] = set()
    repeated = False
    for _ in range(rng.randrange(0, 4)):
        key = rng.choice(_KEYS)
        spelled = json.dumps(key, ensure_ascii=False) if key != "\\u0061" else '"\\u0061"'
        name = "a" if key == "\\u0061" else key
        repeated |= name in names
        names.add(name)
        text, dup = _text_with_pairs(rng, depth - 1)
        repeated |= dup
        members.append(spelled + space + ":" + space + text)
    return "{" + space + ("," + space).join(members) + space + "}", repeated


@pytest.mark.parametrize("seed", range(6))
def test_duplicate_keys_are_found_without_the_hooks(seed: int) -> None:
    rng = random.Random(seed)
    seen = {True: 0, False: 0}
    for _ in range(400):
        text, repeated = _text_with_pairs(rng, rng.randrange(1, 6))
        assert flatwire_fast._hooks_needless(text)
        counted = json_shape.values_in(json_shape.structure(text))
        built = json_shape.values_of(json.loads(text))
        if repeated:
            assert built < counted, text
        elif not any(space in text for space in " \n"):  # a spaced [ ] is counted as full
            assert built == counted, text
        result = decode_alike(text)
        if repeated:
            assert result == ("error", (WireError, "duplicate key in JSON object")), text
        else:
            assert result[0] == "ok" and same(result[1], json.loads(text)), text
        seen[repeated] += 1
    assert seen[True] > 50 and seen[False] > 50


@pytest.mark.parametrize(
    "text",
    [
        '{"a":[1,[2,3],{"x":{"y":[]}}],"a":1}',  # the dropped value holds a subtree
        '{"a":1,"a":[1,[2,3],{"x":{}}]}',
        '[{"k":1},{"k":2,"j":[{"z":1,"z":1}]}]',
        '{"a":{},"a":{}}',
        '{"a":[],"b":[],"a":[]}',
        '{"a":[ ],"a":[ ]}',  # spaced empty arrays count as holding a value: never hide one
        '{"a":1,"a":2,"b":[ ],"c":[\n]}',
        '{"x,":1, "x,":2}',
        '{"\\"":1,"\\u0022":2}',
        '{"\\\\":[],"\\\\":[]}',
        '{"[":"]","[":"]"}',
        '{ "ü" : 1 , "\\u00fc" : 2 }',
    ],
)
def test_a_duplicate_key_is_refused_without_the_hooks(text: str) -> None:
    assert flatwire_fast._hooks_needless(text)
    for spelled in (text, padded_text(text)):
        assert decode_alike(spelled) == ("error", (WireError, "duplicate key in JSON object"))


def padded_text(text: str) -> str:
    return '{"pad":' + json.dumps(["x, [{:" * 40] * 10) + ',"v":' + text + "}"


@pytest.mark.parametrize(
    ("text", "needless"),
    [
        ("[-0]", False),
        ("[ -0 ]", False),
        ('{"a":-0}', False),
        ("[-0.0]", False),
        ("[-0.000]", False),
        ("[1,-0.00]", False),
        ("[-0e1]", False),
        ("[1e5]", False),
        ("[1E400]", False),
        ("[-1e-400]", False),
        ("[" + "9" * 309 + ".5]", False),
        ("[" + "9" * 308 + ".5]", True),
        ('["1e5 in a string"]', False),  # conservative: only costs the hooks
        ("[-0.5, -0.05, -10, 0.0, 0]", True),
        ('["2026-01-01", "x-0", "item -05"]', True),
        ('["a", 1.5, true, null]', True),
    ],
)
def test_the_hooks_run_wherever_a_number_could_be_refused(text: str, needless: bool) -> None:
    assert flatwire_fast._hooks_needless(text) is needless
    decode_alike(text)
    decode_alike(padded_text(text))


@pytest.mark.parametrize(
    "text", ["[[ ],{ },[\n\t]]", '{"a":[ ],"b":{ }}', '[[1],["x"],[[]],[{}],[ [ ] ]]']
)
def test_spaced_and_one_member_containers_read_alike(text: str) -> None:
    for spelled in (text, padded_text(text)):
        result = decode_alike(spelled)
        assert result[0] == "ok" and same(result[1], json.loads(spelled))


def test_the_value_count_matches_the_text_for_every_accepted_text() -> None:
    rng = random.Random(7)
    for _ in range(500):
        value = random_value(rng, rng.randrange(1, 7), surrogates=rng.random() < 0.3)
        for text in (json.dumps(value), json.dumps(value, indent=1, ensure_ascii=False)):
            structure = json_shape.structure(text)
            parsed = json.loads(text)
            assert json_shape.values_in(structure) == json_shape.values_of(parsed), text


def test_both_scans_bound_the_depth_alike() -> None:
    rng = random.Random(11)
    for _ in range(300):
        text = random_text(rng)
        lean = json_shape.depth(json_shape.structure(text, members=False))
        assert json_shape.depth(json_shape.structure(text)) == lean, text
    assert json_shape._REFERENTS_ARE_VALUES


def test_a_large_plain_text_is_read_without_the_hooks() -> None:
    value = {
        "v": [
            {"id": i, "name": f"item {i}", "tags": ["a", "b"], "score": i / 2} for i in range(500)
        ]
    }
    text = json.dumps(value, separators=(",", ":"))
    hooked = mock.Mock(side_effect=AssertionError("the hooked decoder ran"))
    with mock.patch.object(flatwire_fast, "_DECODER", mock.Mock(decode=hooked)):
        assert same(flatwire.decode(json_token(text)), value)
    hooked.assert_not_called()


def test_a_spaced_empty_array_is_read_by_the_hooked_c_decoder() -> None:
    """Counted as holding a value, ``[ ]`` makes the counts differ: the hooked C decoder reads
    the text then, not the token path."""
    text = padded_text('{"a":[ ],"b":{ },"c":[\n],"d":[1,[ ]]}')
    fallback = mock.Mock(side_effect=AssertionError("the token path ran"))
    with mock.patch.object(flatwire, "loads_strict", fallback):
        assert same(flatwire.decode(json_token(text)), json.loads(text))
    fallback.assert_not_called()
    repeated = padded_text('{"a":[ ],"a":[ ]}')
    assert decode_alike(repeated) == ("error", (WireError, "duplicate key in JSON object"))
