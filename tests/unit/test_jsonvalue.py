"""The lossless JSON codec: both parser paths, both encoder paths, snapshot, render_pretty.

Deep values are compared through `dumps`: Python's own `==` and `repr` recurse.
"""

from __future__ import annotations

import enum
import math
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from unittest import mock

import pytest

from codemode_wire import _jsonbase
from codemode_wire import jsonvalue as jv
from codemode_wire.jsonvalue import (
    JsonValue,
    JsonValueError,
    dumps,
    loads,
    render_pretty,
    snapshot,
)

DEEP = 100_000


def _nested_list(depth: int, leaf: JsonValue = None) -> JsonValue:
    value: JsonValue = [] if leaf is None else leaf
    for _ in range(depth):
        value = [value]
    return value


def _nested_dict(depth: int) -> JsonValue:
    value: JsonValue = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _container_ids(value: object) -> set[int]:
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is list:
            seen.add(id(item))
            stack.extend(item)
        elif type(item) is dict:
            seen.add(id(item))
            stack.extend(item.values())
    return seen


# ---------------------------------------------------------------------------------------------
# loads: accepted texts, on both paths
# ---------------------------------------------------------------------------------------------

ACCEPTED = [
    # (text, canonical dumps of the result)
    ("null", "null"),
    ("true", "true"),
    ("false", "false"),
    ("0", "0"),
    ("-1", "-1"),
    ("1.0", "1.0"),
    ("1e2", "100.0"),
    ("1E+2", "100.0"),
    ("-2.5e-3", "-0.0025"),
    ("-0.5", "-0.5"),
    ("0.0", "0.0"),
    ("0e5", "0.0"),
    ("1e-400", "0.0"),  # rounds to +0.0 like any float rounding; only -0 and ±inf are refused
    ("1.7976931348623157e308", "1.7976931348623157e+308"),
    ("5e-324", "5e-324"),
    ("9007199254740993", "9007199254740993"),  # 2**53 + 1 stays exact
    ("-100000000000000000000000000000000000000000", "-100000000000000000000000000000000000000000"),
    ('""', '""'),
    ('"a\\"b\\\\c\\/d"', '"a\\"b\\\\c/d"'),
    ('"\\b\\f\\n\\r\\t\\u0000\\u001f"', '"\\b\\f\\n\\r\\t\\u0000\\u001f"'),
    ('"é日本😀"', '"é日本😀"'),
    ('"\\u00e9\\ud83d\\ude00"', '"é😀"'),  # an escaped pair becomes one character
    ('"\\ud800"', '"\\ud800"'),  # a lone surrogate is kept and escaped back
    ('"\\udc00\\ud800x"', '"\\udc00\\ud800x"'),
    ('"\x7f\u2028"', '"\x7f\u2028"'),
    ('"-0"', '"-0"'),
    ('["item-0", 3]', '["item-0",3]'),  # "-0" inside a string is not a number
    ('[0, -0.5, "2026-01-01"]', '[0,-0.5,"2026-01-01"]'),
    ("[]", "[]"),
    ("{}", "{}"),
    (" \t\r\n[ 1 , 2 ] \n", "[1,2]"),
    ('{ "a" : { "b" : [ ] } , "c" : null }', '{"a":{"b":[]},"c":null}'),
    ('{"b":1,"a":2}', '{"b":1,"a":2}'),  # key order kept
    ('{"a":1,"A":2,"a ":3}', '{"a":1,"A":2,"a ":3}'),
    ('{"__proto__":1}', '{"__proto__":1}'),
    ("[[[[[[[[[[1]]]]]]]]]]", "[[[[[[[[[[1]]]]]]]]]]"),
]


@pytest.mark.parametrize(("text", "canonical"), ACCEPTED)
def test_loads_accepts_on_both_paths(text: str, canonical: str) -> None:
    fast = jv._decode_fast(text)
    slow = jv._loads_slow(text)
    assert dumps(fast) == canonical
    assert dumps(slow) == canonical
    assert dumps(loads(text)) == canonical
    assert dumps(loads(text.encode("utf-8"))) == canonical


@pytest.mark.parametrize(
    ("text", "kind"),
    [("1", int), ("1.0", float), ("1e2", float), ("-3", int), ("true", bool), ("2.5E0", float)],
)
def test_number_kinds_are_kept(text: str, kind: type) -> None:
    assert type(loads(text)) is kind
    assert type(jv._loads_slow(text)) is kind


BIG = {
    "2**53+1": 2**53 + 1,
    "-(2**53+1)": -(2**53 + 1),
    "10**40": 10**40,
    "-10**40": -(10**40),
    "2**64": 2**64,
    "10**4299": 10**4299,
    "10**4300+7": 10**4300 + 7,  # past the interpreter's default int<->str digit limit
    "-10**12345-1": -(10**12345) - 1,
}


@pytest.mark.parametrize("number", BIG.values(), ids=BIG.keys())
def test_big_integers_are_exact(number: int) -> None:
    text = _jsonbase.int_to_digits(number)
    assert loads(text) == number
    assert jv._loads_slow(text) == number
    assert dumps(loads(text)) == text
    assert dumps(loads(f"[{text}]")) == f"[{text}]"
    assert dumps(number) == text
    assert jv._dumps_slow(number) == text
    assert dumps(snapshot([number])) == f"[{text}]"


def test_integers_beyond_the_interpreter_digit_limit() -> None:
    digits = "9" * 20_000  # past sys.get_int_max_str_digits(): the C path declines
    with pytest.raises(ValueError, match="limit"):
        jv._decode_fast(digits)
    value = loads(digits)
    assert type(value) is int
    assert value == 10**20_000 - 1
    assert dumps(value) == digits
    assert dumps(-value) == "-" + digits


# ---------------------------------------------------------------------------------------------
# loads: refused texts, with the same message on both paths
# ---------------------------------------------------------------------------------------------

REFUSED = [
    # (text, offset, message fragment)
    ("", 0, "unexpected end of text, expected a value"),
    ("   ", 3, "unexpected end of text"),
    ("NaN", 0, "NaN is not valid JSON"),
    ("[1, NaN]", 4, "NaN is not valid JSON"),
    ("Infinity", 0, "Infinity is not valid JSON"),
    ("-Infinity", 0, "-Infinity is not valid JSON"),
    ('{"a": -Infinity}', 6, "-Infinity is not valid JSON"),
    ("1e400", 0, "number 1e400 overflows a 64-bit float"),
    ("[-1e400]", 1, "overflows"),
    ("1" + "0" * 400 + ".0", 0, "overflows"),
    ("-0", 0, "negative zero"),
    ("[-0]", 1, "negative zero"),
    ('{"a": -0}', 6, "negative zero"),
    ("[1, -0 ]", 4, "negative zero"),
    ("-0.0", 0, "negative zero"),
    ("-0.000", 0, "negative zero"),
    ("-0e3", 0, "negative zero"),
    ("-0E+3", 0, "negative zero"),
    ("-0.0e-5", 0, "negative zero"),
    ("-1e-400", 0, "negative zero"),  # underflows to -0.0
    ('{"a":1,"a":2}', 7, 'duplicate object key "a"'),
    ('{"a":1,"\\u0061":2}', 7, 'duplicate object key "a"'),  # same key, spelled differently
    ('[{"x":{"k":1,"k":1}}]', 13, 'duplicate object key "k"'),
    ("[1] x", 4, "unexpected data after the JSON value"),
    ("1 2", 2, "unexpected data after the JSON value"),
    ("{} {}", 3, "unexpected data"),
    ("[1,]", 3, "expected a value"),
    ("[,1]", 1, "expected a value"),
    ("[1 2]", 3, "expected ',' or ']'"),
    ('{"a":1,}', 7, "expected a string key"),
    ("{1:2}", 1, "expected a string key"),
    ("{'a':1}", 1, "expected a string key"),
    ('{"a" 1}', 5, "expected ':' after the object key"),
    ('{"a":1 "b":2}', 7, "expected ',' or '}'"),
    ("[", 1, "unexpected end of text"),
    ('{"a":', 5, "unexpected end of text"),
    ("[1", 2, "expected ',' or ']'"),
    ("01", 1, "unexpected data"),
    ("1.", 1, "unexpected data"),
    (".5", 0, "unexpected character '.'"),
    ("+1", 0, "unexpected character '+'"),
    ("-", 0, "unexpected character '-'"),
    ("1e", 1, "unexpected data"),
    ("0x10", 1, "unexpected data"),
    ("tru", 0, "unexpected character 't'"),
    ("True", 0, "unexpected character 'T'"),
    ("nul", 0, "unexpected character 'n'"),
    ("١", 0, "unexpected character"),  # non-ASCII digits are not JSON digits
    ('"abc', 0, "unterminated string"),
    ('"a\x01b"', 2, "invalid control character"),
    ('"a\nb"', 2, "invalid control character"),
    ('"\\x"', 1, "invalid \\escape"),
    ('"\\u12"', 2, "invalid \\uXXXX escape"),
    ("\ufeff[]", 0, "unexpected character '\\ufeff'"),  # no byte order mark
    ("[1]\x00", 3, "unexpected data"),
    ("/* c */ 1", 0, "unexpected character '/'"),
]


@pytest.mark.parametrize(("text", "offset", "fragment"), REFUSED)
def test_loads_refuses_on_both_paths(text: str, offset: int, fragment: str) -> None:
    with pytest.raises((ValueError, RecursionError)):
        jv._decode_fast(text)  # the C path must never accept what the reference refuses
    with pytest.raises(JsonValueError) as slow:
        jv._loads_slow(text)
    with pytest.raises(JsonValueError) as public:
        loads(text)
    assert str(public.value) == str(slow.value)
    assert fragment in str(public.value)
    assert public.value.offset == offset
    assert f"invalid JSON at offset {offset} " in str(public.value)


def test_error_message_has_line_and_column() -> None:
    with pytest.raises(JsonValueError, match=r"offset 10 \(line 3, column 4\): expected"):
        loads("[\n  1,\n 2 3]")


def test_bytes_input() -> None:
    assert loads(b'{"k":"\xc3\xa9"}') == {"k": "é"}
    with pytest.raises(JsonValueError, match="not UTF-8 at byte offset 2") as info:
        loads(b'["\xff"]')
    assert info.value.offset == 2
    with pytest.raises(JsonValueError, match="not UTF-8"):
        loads('"\ud800"'.encode("utf-8", "surrogatepass"))  # CESU-style surrogates
    with pytest.raises(JsonValueError, match="unexpected character"):
        loads(b"\xef\xbb\xbf[]")  # UTF-8 byte order mark
    with pytest.raises(TypeError):
        loads(12)  # type: ignore[arg-type]


def test_raw_surrogates_in_text_are_refused() -> None:
    # A raw surrogate is not Unicode text; accepting it would let "\ud83d" + raw "\ude00"
    # forge a pair that does not survive a round trip.
    for text in ('"\ud800"', '["ok", "\\ud83d\ude00"]'):
        with pytest.raises(JsonValueError, match=r"raw surrogate U\+D"):
            loads(text)
        with pytest.raises(JsonValueError, match="raw surrogate"):
            jv._loads_slow(text)


# ---------------------------------------------------------------------------------------------
# dumps: accepted values, on both paths
# ---------------------------------------------------------------------------------------------

VALUES: list[tuple[object, str]] = [
    (None, "null"),
    (True, "true"),
    (False, "false"),
    (0, "0"),
    (-7, "-7"),
    (0.0, "0.0"),
    (1.0, "1.0"),
    (-0.5, "-0.5"),
    (-0.05, "-0.05"),
    (1e16, "1e+16"),
    (1e-7, "1e-07"),
    (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (0.1 + 0.2, "0.30000000000000004"),
    (2**64, "18446744073709551616"),
    ("", '""'),
    ('q"b\\', '"q\\"b\\\\"'),
    ("\x00\x1f\n", '"\\u0000\\u001f\\n"'),
    ("é😀\u2028", '"é😀\u2028"'),
    ([], "[]"),
    ({}, "{}"),
    ({"b": [1, {"c": None}], "a": "x"}, '{"b":[1,{"c":null}],"a":"x"}'),
    ([[1, 2], [3, [4, [5]]]], "[[1,2],[3,[4,[5]]]]"),
    ({"": {"-0.0": "-0.0"}}, '{"":{"-0.0":"-0.0"}}'),  # "-0.0" as text is fine
    ([0.0, -0.25, 0.0], "[0.0,-0.25,0.0]"),
]


@pytest.mark.parametrize(("value", "text"), VALUES)
def test_dumps_on_both_paths(value: object, text: str) -> None:
    assert jv._encode_fast(value) == text
    assert jv._dumps_slow(value) == text
    assert dumps(value) == text
    assert dumps(loads(text)) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("\ud800", '"\\ud800"'),
        ("a\udfffb", '"a\\udfffb"'),
        ("\ude00\ud83d", '"\\ude00\\ud83d"'),  # low then high is not a pair
        (["x", {"k\udc00": "\ud8ff"}], '["x",{"k\\udc00":"\\ud8ff"}]'),
    ],
)
def test_lone_surrogates_are_escaped_and_round_trip(value: object, text: str) -> None:
    assert jv._encode_fast(value) is None  # the C encoder would write them raw
    assert dumps(value) == text
    assert dumps(loads(text)) == text
    assert dumps(snapshot(value)) == text
    text.encode("utf-8")  # valid Unicode, fit for a protobuf string field


def test_shared_subobjects_are_written_once_per_occurrence() -> None:
    shared = {"k": [1]}
    value = [shared, shared, {"again": shared}]
    expected = '[{"k":[1]},{"k":[1]},{"again":{"k":[1]}}]'
    assert dumps(value) == expected
    assert jv._dumps_slow(value) == expected
    copy = snapshot(value)
    assert type(copy) is list
    assert copy[0] is not copy[1]


@pytest.mark.parametrize("value", [{"k": [1, "é", None]}, [[[]]] * 3, "\udc80", 2**80])
def test_snapshot_with_text_is_a_copy_and_its_dumps(value: object) -> None:
    copy, text = jv.snapshot_with_text(value)
    assert text == dumps(value)
    assert copy == value
    if isinstance(value, list | dict):
        assert copy is not value


# ---------------------------------------------------------------------------------------------
# dumps / snapshot: refused values
# ---------------------------------------------------------------------------------------------


class Color(enum.IntEnum):
    RED = 1


class Mode(enum.StrEnum):
    CODE = "code"


class MyList(list[int]):
    pass


class MyFloat(float):
    pass


def _self_list() -> list[object]:
    loop: list[object] = [1]
    loop.append(loop)
    return loop


def _indirect_cycle() -> dict[str, object]:
    outer: dict[str, object] = {"a": [1, 2]}
    inner = outer["a"]
    assert isinstance(inner, list)
    inner.append({"b": outer})
    return outer


REJECTED: list[tuple[object, str, str]] = [
    # (value, path, message fragment)
    (math.nan, "$", "NaN is not valid JSON"),
    ({"a": [0, 1, 2, {"b": math.nan}]}, "$.a[3].b", "NaN"),
    ([math.inf], "$[0]", "Infinity is not valid JSON"),
    ({"x": -math.inf}, "$.x", "-Infinity is not valid JSON"),
    (-0.0, "$", "negative zero (-0.0)"),
    ({"a": [1.5, -0.0]}, "$.a[1]", "negative zero"),
    ((1, 2), "$", "tuple is not a JSON value"),
    ({"t": {1, 2}}, "$.t", "set is not a JSON value"),
    ([b"x"], "$[0]", "bytes is not a JSON value"),
    ([object()], "$[0]", "object is not a JSON value"),
    ({"c": 1 + 2j}, "$.c", "complex is not a JSON value"),
    ([Color.RED], "$[0]", "Color is a subclass of int"),
    ({"m": Mode.CODE}, "$.m", "Mode is a subclass of str"),
    (MyList([1]), "$", "MyList is a subclass of list"),
    ([MyFloat(1.0)], "$[0]", "MyFloat is a subclass of float"),
    (OrderedDict(a=1), "$", "OrderedDict is a subclass of dict"),
    ({"d": defaultdict(list)}, "$.d", "defaultdict is a subclass of dict"),
    ({1: "x"}, "$", "object key of type int is not a str"),
    ({"a": {None: 1}}, "$.a", "object key of type NoneType"),
    ({"a": {Mode.CODE: 1}}, "$.a", "object key of type Mode"),
    ({"a b": {"c.d": [math.nan]}}, '$["a b"]["c.d"][0]', "NaN"),
    ("\ud83d\ude00", "$", "surrogate pair as two code points"),
    (["ok", "x\ud83d\ude00"], "$[1]", "surrogate pair"),
    (_self_list(), "$[1]", "cycle: this list contains itself"),
    (_indirect_cycle(), "$.a[2].b", "cycle: this dict contains itself"),
]


@pytest.mark.parametrize(("value", "path", "fragment"), REJECTED)
@pytest.mark.parametrize("function", [dumps, jv._dumps_slow, snapshot, render_pretty])
def test_refused_values(value: object, path: str, fragment: str, function: object) -> None:
    assert jv._encode_fast(value) is None
    assert callable(function)
    if function is render_pretty and type(value) is str:
        return  # a string root renders raw, whatever it holds
    with pytest.raises(JsonValueError) as info:
        function(value)
    assert info.value.path == path
    assert str(info.value).startswith(f"not lossless JSON at {path}: ")
    assert fragment in str(info.value)


def test_very_deep_paths_are_shortened() -> None:
    value = _nested_list(1000, math.nan)
    with pytest.raises(JsonValueError) as info:
        dumps(value)
    assert info.value.path == "$" + "[0]" * 12 + "…(976 levels)…" + "[0]" * 12


def test_fast_path_is_used_for_plain_shallow_values() -> None:
    assert jv._encode({"a": [1, 2.5, "x", None, True]}) == ('{"a":[1,2.5,"x",null,true]}', True)
    assert jv._encode(_nested_list(150))[1] is False  # deeper than the C path is allowed


def test_raised_recursion_limit_keeps_deep_texts_off_the_c_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With a raised limit the C decoder no longer stops at a safe depth: only texts that are
    # provably shallow (few brackets) may reach it. The encoder walks the value first, so its
    # depth proof does not depend on the limit.
    seen: list[int] = []
    real = jv._decode_fast

    def spy(text: str) -> JsonValue:
        seen.append(len(text))
        return real(text)

    monkeypatch.setattr(sys, "getrecursionlimit", lambda: 1_000_000)
    monkeypatch.setattr(jv, "_decode_fast", spy)
    text = "[" * 50_000 + "]" * 50_000
    assert dumps(loads(text)) == text
    assert loads('{"a":[1,2]}') == {"a": [1, 2]}
    assert seen == [11]
    assert jv._encode_fast([1]) == "[1]"
    assert jv._encode_fast(_nested_list(200)) is None


def test_disabled_int_digit_limit_disables_the_c_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    # The C codec's int<->str conversion is quadratic once int_max_str_digits is off.
    monkeypatch.setattr(sys, "get_int_max_str_digits", lambda: 0)
    assert not jv._c_decoder_usable("[1]")
    assert jv._encode_fast([1]) is None
    assert loads("[1]") == [1]
    assert dumps([10**5000]) == "[1" + "0" * 5000 + "]"


# ---------------------------------------------------------------------------------------------
# Depth: nothing recurses
# ---------------------------------------------------------------------------------------------


def test_deep_array_round_trip() -> None:
    text = "[" * DEEP + "]" * DEEP
    value = loads(text)
    assert dumps(value) == text
    assert dumps(jv._loads_slow(text)) == text
    assert dumps(snapshot(value)) == text
    assert dumps(loads(text.encode())) == text


def test_deep_object_round_trip() -> None:
    value = _nested_dict(DEEP)
    text = dumps(value)
    assert text == '{"a":' * DEEP + "{}" + "}" * DEEP
    assert dumps(loads(text)) == text
    assert dumps(snapshot(value)) == text


def test_deep_refusal_reports_the_path() -> None:
    value = _nested_list(DEEP, [1, -0.0])
    with pytest.raises(JsonValueError, match=r"levels\)….*\[0\]\[1\]: negative zero"):
        dumps(value)
    with pytest.raises(JsonValueError, match="negative zero"):
        loads("[" * DEEP + "-0" + "]" * DEEP)
    with pytest.raises(JsonValueError, match=f"offset {2 * DEEP}"):
        loads("[" * DEEP + "]" * DEEP + "]")


def test_deep_cycle_is_found() -> None:
    top: list[object] = []
    node = top
    for _ in range(1000):
        child: list[object] = []
        node.append(child)
        node = child
    node.append(top)
    with pytest.raises(JsonValueError, match="cycle"):
        dumps(top)


# ---------------------------------------------------------------------------------------------
# snapshot
# ---------------------------------------------------------------------------------------------


def test_snapshot_is_an_independent_copy() -> None:
    original: dict[str, object] = {"a": [1, {"b": "c"}], "n": 2**70, "f": 1.0, "s": "\ud800"}
    copy = snapshot(original)
    assert dumps(copy) == dumps(original)
    assert not _container_ids(copy) & _container_ids(original)
    inner = original["a"]
    assert isinstance(inner, list)
    inner.append("mutated")
    assert dumps(copy) == '{"a":[1,{"b":"c"}],"n":1180591620717411303424,"f":1.0,"s":"\\ud800"}'


@pytest.mark.parametrize(("value", "text"), VALUES)
def test_snapshot_keeps_values_and_types(value: object, text: str) -> None:
    copy = snapshot(value)
    assert dumps(copy) == text
    assert type(copy) is type(value)


# ---------------------------------------------------------------------------------------------
# render_pretty
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("plain text", "plain text"),
        ("", ""),
        ('a "quoted"\nline\\', 'a "quoted"\nline\\'),  # strings are raw: no quotes, no escapes
        ("\ud800", "\ud800"),
        (42, "42"),
        (-1.5, "-1.5"),
        (2**64, "18446744073709551616"),
        (True, "true"),
        (None, "null"),
        ([], "[]"),
        ({}, "{}"),
        ([1, "two", None], '[\n  1,\n  "two",\n  null\n]'),
        ({"a": 1, "b": [], "c": {}}, '{\n  "a": 1,\n  "b": [],\n  "c": {}\n}'),
        (
            {"k": ["x\ud800", {"n": 1.0}]},
            '{\n  "k": [\n    "x\\ud800",\n    {\n      "n": 1.0\n    }\n  ]\n}',
        ),
        (["é😀"], '[\n  "é😀"\n]'),
    ],
)
def test_render_pretty(value: JsonValue, rendered: str) -> None:
    assert render_pretty(value) == rendered


def test_render_pretty_matches_stdlib_indent_while_shallow() -> None:
    import json

    value: JsonValue = {"a": [1, {"b": [2, 3]}, "x"], "c": {"d": {"e": None}}, "f": 1.25}
    assert render_pretty(value) == json.dumps(value, indent=2, ensure_ascii=False)


def test_render_pretty_cap_boundary() -> None:
    # Five container levels (depth 0-4) are pretty; the container at depth 5 is compact.
    value: JsonValue = [[[[[[1, {"k": [2]}]]]]]]
    assert render_pretty(value) == (
        "[\n"
        "  [\n"
        "    [\n"
        "      [\n"
        "        [\n"
        '          [1,{"k":[2]}]\n'
        "        ]\n"
        "      ]\n"
        "    ]\n"
        "  ]\n"
        "]"
    )
    objects: JsonValue = {"a": {"b": {"c": {"d": {"e": {"f": 1, "g": [1]}, "h": 2}}}}}
    assert render_pretty(objects) == (
        "{\n"
        '  "a": {\n'
        '    "b": {\n'
        '      "c": {\n'
        '        "d": {\n'
        '          "e": {"f":1,"g":[1]},\n'
        '          "h": 2\n'
        "        }\n"
        "      }\n"
        "    }\n"
        "  }\n"
        "}"
    )


def test_render_pretty_deep_value_is_capped_and_linear() -> None:
    rendered = render_pretty(_nested_list(DEEP, 7))
    lines = rendered.split("\n")
    assert len(lines) == 11  # 5 opening lines, 1 compact line, 5 closing lines
    assert lines[5] == " " * 10 + "[" * (DEEP - 5) + "7" + "]" * (DEEP - 5)
    assert max(len(line) - len(line.lstrip(" ")) for line in lines) == 10
    assert len(rendered) == 2 * DEEP + 1 + 2 * (2 + 4 + 6 + 8) + 10 + 10


def test_render_pretty_refuses_with_paths() -> None:
    with pytest.raises(JsonValueError, match=r"at \$\.a\[1\]: NaN"):
        render_pretty({"a": [1, math.nan]})
    deep: JsonValue = [[[[[[[math.inf]]]]]]]
    with pytest.raises(JsonValueError, match=r"at \$\[0\]\[0\]\[0\]\[0\]\[0\]\[0\]\[0\]: Inf"):
        render_pretty(deep)
    with pytest.raises(JsonValueError, match="cycle"):
        render_pretty(_self_list())  # type: ignore[arg-type]
    with pytest.raises(JsonValueError, match="key of type int"):
        render_pretty({"a": {1: 2}})  # type: ignore[dict-item]


# ---------------------------------------------------------------------------------------------
# The pieces behind the fast paths
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-0", True),
        ("[1,-0]", True),
        ('{"a": -0}', True),
        ("[\n-0]", True),
        ('"item-0"', False),
        ("-0.5", False),
        ("-0e1", False),  # a float: the float hook catches it
        ('"2026-01-01"', False),
        ("[10, -01]", False),
    ],
)
def test_integer_negative_zero_prefilter(text: str, expected: bool) -> None:
    assert jv._may_hold_int_neg_zero(text) is expected


def test_integer_text_conversion() -> None:
    for digits in (1, 599, 600, 601, 1199, 1200, 1201, 4300, 4301, 9999):
        text = "7" * digits
        number = _jsonbase.digits_to_int(text)
        assert _jsonbase.int_to_digits(number) == text
        assert _jsonbase.int_to_digits(-number) == "-" + text
        assert number == 7 * (10**digits - 1) // 9  # computed without any text conversion
    assert _jsonbase.int_to_digits(-(10**1000)) == "-1" + "0" * 1000
    assert _jsonbase.digits_to_int("0" * 1500 + "42") == 42
    assert _jsonbase.int_to_digits(0) == "0"


# ---------------------------------------------------------------------------------------------
# max_depth and loads_canonical (the registry's admission bounds, codemode_common side)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "max_depth", "refused_at"),
    [
        ("[]", 0, None),
        ("1", 0, None),
        ("[[]]", 0, 1),
        ("[[]]", 1, None),
        ('{"a":[{"b":1}]}', 2, None),
        ('{"a":[{"b":1}]}', 1, 6),
        ("[[1,2],[3,[4]]]", 1, 10),
        ("[" * 5000 + "]" * 5000, 4999, None),
        ("[" * 5000 + "]" * 5000, 4998, 4999),
    ],
)
def test_max_depth_counts_the_containers_around_a_container(
    text: str, max_depth: int, refused_at: int | None
) -> None:
    loaders: list[Callable[[str], object]] = [
        lambda t: jv.loads(t, max_depth=max_depth),
        lambda t: jv.loads_canonical(t, max_depth=max_depth)[0],
        lambda t: jv.loads_canonical(t, max_depth=max_depth, yielding=True)[0],
    ]
    for load in loaders:
        if refused_at is None:
            assert jv.dumps(load(text)) == text  # (deep values cannot be compared with ==)
        else:
            with pytest.raises(jv.JsonTooDeep) as caught:
                load(text)
            assert caught.value.offset == refused_at and caught.value.max_depth == max_depth
            assert f"nested deeper than {max_depth} levels" in str(caught.value)


def test_max_depth_holds_under_a_low_recursion_limit() -> None:
    # The C decoder succeeds on a shallow text; the bound is then checked on its value.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        assert jv.loads("[[1],[[2]]]", max_depth=2) == [[1], [[2]]]
        with pytest.raises(jv.JsonTooDeep):
            jv.loads("[[1],[[2]]]", max_depth=1)
    finally:
        sys.setrecursionlimit(old)


def test_a_too_deep_text_is_refused_without_reading_it_all() -> None:
    text = "[" * 4_000_000 + "]" * 4_000_000
    with pytest.raises(jv.JsonTooDeep) as caught:
        jv.loads(text, max_depth=1000)
    assert caught.value.offset == 1001


@pytest.mark.parametrize("yielding", [False, True])
def test_loads_canonical_gives_what_dumps_gives(yielding: bool) -> None:
    big = list(range(10_000))
    values: list[object] = [
        {"b": [1, 2.5, "é", "\ud800", None, True], "a": {}},
        big,
        {"xs": big, "ys": [{"k": i} for i in range(5000)], "deep": [[[big]]]},
        [big, [big, {"z": big}]],
        {f"k{i}": i for i in range(9000)},
    ]
    for value in values:
        text = jv.dumps(value)
        spaced = text.replace(",", ", ")  # not canonical: the canonical text comes back
        assert jv.loads_canonical(spaced, yielding=yielding) == (value, text)
    for bad in ("[-0]", '{"a":[1,-0]}', "[1e400]", "[NaN]", '{"a":1,"a":2}'):
        with pytest.raises(jv.JsonValueError):
            jv.loads_canonical(bad, yielding=yielding)


# Large texts already spelled as `dumps` spells them come back as they are: every other
# spelling of the same value gives `dumps`'s text, never the input's.
_PAD = '"' + "p" * 2100 + '"'  # makes any text long enough for the spelling check


@pytest.mark.parametrize("yielding", [False, True])
@pytest.mark.parametrize(("text", "canonical"), ACCEPTED)
def test_loads_canonical_of_a_large_text_is_dumps(
    text: str, canonical: str, yielding: bool
) -> None:
    for wrapped, wrapped_canonical in (
        (f"[{_PAD},{text}]", f"[{_PAD},{canonical}]"),
        (f'{{"pad":{_PAD},"v":{text}}}', f'{{"pad":{_PAD},"v":{canonical}}}'),
        (f"[{text},{_PAD}]", f"[{canonical},{_PAD}]"),
    ):
        value, spelled = jv.loads_canonical(wrapped, yielding=yielding)
        assert spelled == wrapped_canonical == dumps(value)


@pytest.mark.parametrize("yielding", [False, True])
@pytest.mark.parametrize(
    "spelling",
    [
        "[PAD, 1]",
        "[PAD ,1]",
        " [PAD,1]",
        "[PAD,1]\n",
        "[PAD,1]\t",
        "\r[PAD,1]",
        '{"a" :PAD}',
        '{"a": PAD}',
        "[ PAD]",
        "[PAD ]",
        "[PAD,{ }]",
        "[PAD,[\n]]",
        "[PAD,1.50]",
        "[PAD,1e2]",
        "[PAD,1E2]",
        "[PAD,0.1e1]",
        "[PAD,1.0000000000000001]",
        "[PAD,12345678901234567890.0]",
        "[PAD,-0.10]",
        "[PAD,1e-7]",
        "[PAD,2.5E0]",
        '[PAD,"a\\/b"]',
        '[PAD,"\\u0041"]',
        '[PAD,"\\u00e9"]',
        '[PAD,"\\u00E9"]',
        '[PAD,"\\u001F"]',
        '[PAD,"\\u0008"]',
        '[PAD,"\\u000a"]',
        '[PAD,"\\u0022"]',
        '[PAD,"\\u005c"]',
        '[PAD,"\\ud83d\\ude00"]',
        '[PAD,"\\\\\\/"]',
        '{"\\u0061":PAD}',
    ],
)
def test_loads_canonical_respells_every_other_spelling(spelling: str, yielding: bool) -> None:
    text = spelling.replace("PAD", _PAD)
    value, spelled = jv.loads_canonical(text, yielding=yielding)
    assert spelled == dumps(value)
    assert spelled != text


@pytest.mark.parametrize("yielding", [False, True])
def test_loads_canonical_keeps_a_canonical_large_text(yielding: bool) -> None:
    """The text itself comes back (not written again) when it is `dumps`'s, including strings
    holding escapes `dumps` writes, whitespace inside strings, and canonical floats."""
    value = {
        "items": [
            {"id": i, "name": f"item {i}", "score": i / 3, "big": 10**30 + i, "neg": -i - 0.5}
            for i in range(300)
        ],
        "text": 'say "hi"\\ \n\r\t\b\f\x00\x1f\x0b é日本😀 \u2028 x ,y [ ] : {',
        "floats": [1e16, 1e-7, 5e-324, 1.7976931348623157e308, 0.1, 100.0],
        "empty": [[], {}, ""],
        "lits": [True, False, None],
    }
    text = dumps(value)
    assert "\\" in text and "\\u000b" in text
    # Strings holding ", " or "[ " are spelled again, whatever else they hold:
    got_value, spelled = jv.loads_canonical(text, yielding=yielding)
    assert spelled == text and got_value == value
    del value["text"]
    text = dumps(value)
    got_value, spelled = jv.loads_canonical(text, yielding=yielding)
    assert spelled is text and got_value == value


@pytest.mark.parametrize("yielding", [False, True])
def test_loads_canonical_of_large_texts_still_refuses(yielding: bool) -> None:
    for bad in (
        "[PAD,-0]",
        "[PAD,-0.0]",
        "[PAD,1e400]",
        "[PAD,NaN]",
        '{"a":PAD,"a":1}',
        '{"a":[1,[2,{"x":[]}]],"b":PAD,"a":1}',  # the dropped value holds a subtree
        '[PAD,{"k":{"z":1,"y":[ ],"z":{}}}]',
        '[PAD,{"\\u0061":1,"a":2}]',
        '[PAD,{"\\"":[],"\\u0022":[]}]',
        '{"[":PAD,"[":"]"}',
    ):
        text = bad.replace("PAD", _PAD)
        with pytest.raises(jv.JsonValueError) as caught:
            jv.loads_canonical(text, yielding=yielding)
        with pytest.raises(jv.JsonValueError) as slow:
            jv._loads_slow(text)
        assert str(caught.value) == str(slow.value)


@pytest.mark.parametrize(
    "value",
    [
        -0.0,
        [-0.0],
        [1, -0.0],
        {"a": -0.0},
        {"a": [0.5, {"b": -0.0}]},
        [[-0.0], 2],
        {"x": -0.0, "y": 1},
    ],
)
def test_negative_zero_is_refused_wherever_it_sits(value: object) -> None:
    with pytest.raises(JsonValueError, match="-0"):
        dumps(value)
    assert jv._encode_fast(value) is None


@pytest.mark.parametrize("text", ["[-0.0]", ",-0.0,", ":-0.0}", "-0.0"])
def test_a_string_spelling_negative_zero_is_written_alike(text: str) -> None:
    value = {"s": text, "t": [text, 0.0, -0.5]}
    assert dumps(value) == jv._dumps_slow(value)


@pytest.mark.parametrize("yielding", [False, True])
def test_a_large_text_with_spaced_empty_arrays_stays_on_the_c_decoder(yielding: bool) -> None:
    text = f'{{"pad":{_PAD},"a":[ ],"b":[[\n],{{ }}],"c":[1, [ ]]}}'
    slow = jv._loads_slow(text)
    with mock.patch.object(jv, "parse", side_effect=AssertionError("the slow path ran")):
        value, spelled = jv.loads_canonical(text, yielding=yielding)
    assert value == slow and spelled == dumps(slow)
    with pytest.raises(JsonValueError, match="duplicate"):
        jv.loads_canonical(f'{{"pad":{_PAD},"a":[ ],"a":[ ]}}', yielding=yielding)
