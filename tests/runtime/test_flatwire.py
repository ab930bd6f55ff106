"""The flat lossless-JSON token wire: encoding, decoding and the rejection table."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from runtime_service.worker import flatwire
from runtime_service.worker.flatwire import WireError
from tests.runtime.deep import list_depth, nested_lists


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -12,
        10**40,
        1.5,
        -2.25e-300,
        "",
        "héllo \U0001f600 \x00",
        "\ud800",
        "\udc00\ud800",
        [],
        {},
        [1, [2, [3]], {"a": None}],
        {"__proto__": 1, "constructor": [], "": "", "kind": "array", "length": 3},
        {"b": 1, "a": 2},
    ],
)
def test_round_trip(value: object) -> None:
    tokens = flatwire.encode(value)
    decoded = flatwire.decode(tokens)
    assert decoded == value
    assert type(decoded) is type(value)
    assert flatwire.decode_text(flatwire.encode_text(value)) == value


def test_encoding_is_preorder_with_markers() -> None:
    assert flatwire.encode({"a": [1, 2], "b": {}}) == [
        {"kind": "object", "keys": ["a", "b"]},
        {"kind": "array", "length": 2},
        1,
        2,
        {"kind": "object", "keys": []},
    ]


def test_key_order_is_preserved() -> None:
    decoded = flatwire.decode(flatwire.encode({"z": 1, "a": 2, "m": 3}))
    assert isinstance(decoded, dict)
    assert list(decoded) == ["z", "a", "m"]


def test_hundred_thousand_deep_round_trip_is_iterative() -> None:
    value = nested_lists(100_000)
    text = flatwire.encode_text(value)
    assert list_depth(flatwire.decode_text(text)) == 100_000


def test_deep_objects_round_trip() -> None:
    root: dict[str, object] = {}
    cursor = root
    for _ in range(100_000):
        child: dict[str, object] = {}
        cursor["k"] = child
        cursor = child
    decoded = flatwire.decode(flatwire.encode(root))
    depth = 0
    while isinstance(decoded, dict) and decoded:
        decoded = decoded["k"]
        depth += 1
    assert depth == 100_000


def test_shared_subtrees_are_copied_not_cycles() -> None:
    shared = [1]
    value = [shared, shared]
    assert flatwire.snapshot(value) == [[1], [1]]


class _Str(str):
    pass


class _Int(int):
    pass


def _cycle() -> list[object]:
    value: list[object] = []
    value.append(value)
    return value


def _dict_cycle() -> dict[str, object]:
    value: dict[str, object] = {}
    value["self"] = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        -0.0,
        (1, 2),
        {1, 2},
        b"bytes",
        {1: "int key"},
        {None: 1},
        _Str("x"),
        _Int(3),
        object(),
        len,
        lambda: 1,
        _cycle(),
        _dict_cycle(),
        [1, [math.nan]],
        {"a": {"b": -0.0}},
        1j,
        "\ud83d\ude00",
        {"\ud83d\ude00": 1},
    ],
)
def test_lossy_values_are_rejected(value: object) -> None:
    with pytest.raises(WireError):
        flatwire.encode(value)


@pytest.mark.parametrize(
    "tokens",
    [
        "not a list",
        None,
        [],
        {"kind": "array", "length": 0},
        [math.nan],
        [math.inf],
        [-0.0],
        [[]],
        [[1]],
        [(1,)],
        [b"x"],
        [object()],
        [1, 2],  # a second root
        [None, None],
        [{"kind": "array", "length": 1}],  # incomplete
        [{"kind": "array", "length": 2}, 1],  # length > tokens left
        [{"kind": "array", "length": -1}],
        [{"kind": "array", "length": True}, 1],  # bool is not a length
        [{"kind": "array", "length": 1.0}, 1],
        [{"kind": "array", "length": "1"}, 1],
        [{"kind": "array"}],
        [{"kind": "array", "length": 0, "extra": 1}],
        [{"kind": "object", "keys": ["a"], "length": 1}, 1],
        [{"kind": "object", "keys": ["a", "a"]}, 1, 2],  # duplicate keys
        [{"kind": "object", "keys": [1]}, 1],
        [{"kind": "object", "keys": "a"}, 1],
        [{"kind": "object", "keys": ["a", "b"]}, 1],  # more keys than tokens
        [{"kind": "object"}],
        [{"kind": "map", "keys": []}],
        [{"kind": "array", "length": 0}, {"kind": "array", "length": 0}],
        [{"length": 0, "keys": []}],
        [{"kind": 1, "length": 0}],
        [{"kind": "array", "length": 1}, {"kind": "array", "length": 1}],
    ],
)
def test_invalid_encodings_are_rejected(tokens: Any) -> None:
    with pytest.raises(WireError):
        flatwire.decode(tokens)


@pytest.mark.parametrize(
    "text",
    [
        "[NaN]",
        "[Infinity]",
        "[-Infinity]",
        '[{"kind":"array","kind":"array","length":0}]',
        "[1",
        "",
        "[1e400]",
        "[-0.0]",
        '"\\ud800',
    ],
)
def test_invalid_json_texts_are_rejected(text: str) -> None:
    with pytest.raises(WireError):
        flatwire.decode_text(text)


def test_big_integers_are_exact() -> None:
    value = 2**200 + 1
    assert flatwire.decode_text(flatwire.encode_text(value)) == value
    assert flatwire.decode_text(json.dumps([-(10**50)])) == -(10**50)


def test_integer_too_long_for_text_is_rejected() -> None:
    with pytest.raises(WireError):
        flatwire.encode_text(10**5000)


@pytest.mark.parametrize(
    "text",
    [
        "[-0]",
        "[-0.0]",
        "[-0e3]",
        "[-0E-2]",
        "[-1e-400]",
        '[{"kind":"array","length":2},1,-0]',
        '[{"kind":"object","keys":["a"]},-0]',
        b"[-0]",
    ],
)
def test_negative_zero_text_is_rejected(text: str | bytes) -> None:
    # JSON's -0 is negative zero, which Python's int would read as 0: refused, never coerced.
    with pytest.raises(WireError, match=r"negative zero \(-0\) cannot round-trip"):
        flatwire.decode_text(text)


@pytest.mark.parametrize("text", ["[0]", "[-0.5]", "[-10]", '["-0"]', '["a-0"]', "[0.0]"])
def test_zeros_and_minus_zero_lookalikes_are_kept(text: str) -> None:
    assert flatwire.decode_text(text) == json.loads(text)[0]


def test_negative_zero_in_a_frame_field_is_not_an_integer() -> None:
    # Outside values too, "-0" never reads as the integer 0.
    fields = flatwire.loads_strict('{"id":-0,"n":-10}')
    assert type(fields["id"]) is float and math.copysign(1.0, fields["id"]) < 0
    assert type(fields["n"]) is int and fields["n"] == -10


def test_raw_surrogates_in_bytes_are_rejected() -> None:
    pair = "\ud83d\ude00".encode("utf-8", "surrogatepass")
    with pytest.raises(WireError):
        flatwire.loads_strict(b'["' + pair + b'"]')
    # Escaped, a pair is one character and a lone surrogate stays itself.
    assert flatwire.decode_text(b'["\\ud83d\\ude00\\ud800"]') == "\U0001f600\ud800"
