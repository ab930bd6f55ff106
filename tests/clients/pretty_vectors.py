"""Writes ``pretty_vectors.jsonl``: JSON values and the text ``render_pretty`` shows for them.

The file holds the TypeScript client to the Python renderer: a `run_code` result that travels
once (`ToolResult.shared_result`) is shown again by each client from its `value_json`, and the
text must be the registry's byte for byte. ``tests/clients/test_pretty_vectors.py`` checks this
file against ``render_pretty`` (and that it is what this script writes);
``clients/typescript/test/pretty.test.ts`` checks it against ``renderPrettyJson``.

One JSON object per line: ``name``; ``json``, the value's text as the registry writes it
(``dumps``); then either ``pretty``, what ``render_pretty`` shows, or ``error``, a regular
expression both languages' refusal of that text matches. Regenerate with
``.venv/bin/python -m tests.clients.pretty_vectors``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from codemode_wire.jsonvalue import JsonValue, dumps, render_pretty

VECTORS = Path(__file__).with_name("pretty_vectors.jsonl")


def _nested(depth: int, inner: JsonValue, key: str | None = None) -> JsonValue:
    value = inner
    for level in range(depth):
        value = {f"{key}{level}": value} if key is not None and level % 2 else [value]
    return value


def _levels(depth: int) -> JsonValue:
    """Objects and arrays alternating `depth` deep, with scalars and empties at every level."""
    value: JsonValue = {"leaf": 1.5, "empty": [], "none": {}}
    for level in range(depth):
        if level % 2:
            value = [level, value, [], {}, "s"]
        else:
            value = {"n": level, "child": value, "e": {}, "f": float(level) + 0.25}
    return value


VALUES: list[tuple[str, JsonValue]] = [
    # Strings: the root is shown as it is; inside a container, quoted and escaped as dumps does.
    ("a string root is shown raw", 'a "quoted"\nline\\ and é😀'),
    ("a string root that looks like JSON", '{"a": 1}'),
    ("a lone surrogate root", "\ud800x"),
    (
        "strings needing escapes",
        ['"', "\\", "\n\r\t\b\f", "\x00\x01\x1f", "\x7f", "/", "\u2028\u2029", "\ud800", "\udfff"],
    ),
    ("unicode kept raw", {"é": "ü", "😀": ["日本語", "\u00a0", "\ufeff"], "": "empty key"}),
    ("keys needing escapes", {'a"b': 1, "c\\d": 2, "e\nf": 3, "\x00": 4}),
    # Scalars.
    ("null", None),
    ("true", True),
    ("false", False),
    ("zero", 0),
    ("negative", -17),
    ("largest safe integer", 2**53 - 1),
    ("beyond the safe range", 2**53 + 1),
    ("big ints", [2**64, -(2**70), 10**40, -(10**40) - 1]),
    ("an int of 400 digits", 7 * 10**399),
    (
        "floats as Python spells them",
        [1.0, -2.5, 0.1, 1e16, 1e15, 123456789012345.6, 1e-4, 1e-5, 1.5e300, 5e-324, 1e22],
    ),
    ("floats that are whole numbers", [100.0, 2.0**53, 2.0**70, -3.0]),
    ("float extremes", [1.7976931348623157e308, 2.2250738585072014e-308, -1e-7]),
    ("integer and float side by side", {"int": 1, "float": 1.0, "big": 2**64, "bigf": 2.0**64}),
    # Containers.
    ("empty array", []),
    ("empty object", {}),
    ("empties inside", {"a": [], "b": {}, "c": [[], {}, [[]], [{}]]}),
    ("array of scalars", [1, "two", None, True, 3.5]),
    ("object", {"b": 1, "a": [1, 2], "c": {"d": None}}),
    ("key order kept", {"z": 1, "a": 2, "m": 3}),
    # The 10-space indentation cap: containers at depth 5+ are compact on their line.
    ("four levels, all pretty", _nested(4, [1, 2])),
    ("five levels: the fifth container is pretty", _nested(5, [1])),
    ("six levels: the sixth container is compact", _nested(6, [1, {"k": [2, 3.0]}])),
    ("objects at the cap", _nested(7, {"f": 1, "g": [1], "h": {}}, key="k")),
    ("mixed levels with empties at every depth", _levels(12)),
    ("a compact container holds escapes and floats", _nested(6, ["a\nb", 1e16, {"é": 2**70}])),
    ("deep nesting", _nested(1000, {"x": [1.0, "y"]})),
    ("deep objects", _nested(300, [None], key="d")),
]

ERRORS: list[tuple[str, str, str]] = [
    ("negative zero", "-0.0", "negative zero"),
    ("negative zero integer", "-0", "negative zero"),
    ("negative zero inside", '{"a":[1,-0.0]}', "negative zero"),
    ("NaN", "[NaN]", "NaN"),
    ("a duplicate key", '{"a":1,"a":2}', "duplicate"),
]


def lines() -> list[str]:
    out: list[dict[str, Any]] = []
    for name, value in VALUES:
        out.append({"name": name, "json": dumps(value), "pretty": render_pretty(value)})
    for name, text, error in ERRORS:
        out.append({"name": name, "json": text, "error": error})
    # ASCII lines: lone surrogates are escaped, so the file is valid UTF-8.
    return [json.dumps(case) for case in out]


def main() -> None:
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        VECTORS.write_text("\n".join(lines()) + "\n")
    finally:
        sys.set_int_max_str_digits(limit)


if __name__ == "__main__":
    main()
