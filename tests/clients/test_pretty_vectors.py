"""The shared corpus of shown results (``pretty_vectors.jsonl``) against ``render_pretty``.

The same file drives the TypeScript client's ``renderPrettyJson``
(``clients/typescript/test/pretty.test.ts``), so both clients show a result that travelled once
(`ToolResult.shared_result`) exactly as the registry showed it. See ``pretty_vectors.py``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from codemode_wire.jsonvalue import JsonValueError, dumps, loads, render_pretty
from tests.clients import pretty_vectors


@pytest.fixture(autouse=True)
def _any_int_digits() -> Iterator[None]:
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    yield
    sys.set_int_max_str_digits(limit)


def _cases() -> list[dict[str, Any]]:
    text = pretty_vectors.VECTORS.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _scalars(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [s for item in value for s in _scalars(item)]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _scalars(item)]
    return [value]


def test_the_corpus_is_what_the_generator_writes() -> None:
    sys.set_int_max_str_digits(0)
    assert pretty_vectors.VECTORS.read_text() == "\n".join(pretty_vectors.lines()) + "\n"


@pytest.mark.parametrize("case", _cases(), ids=lambda case: case["name"])
def test_render_pretty_shows_the_value_of_its_text_so(case: dict[str, Any]) -> None:
    text = case["json"]
    if "error" in case:
        with pytest.raises(JsonValueError, match=case["error"]):
            loads(text)
        # A float the text refuses for (-0.0, NaN) is refused by the renderer as well.
        try:
            value = json.loads(text)
        except ValueError:
            return  # (a duplicate key: no Python value holds both)
        floats = [v for v in _scalars(value) if type(v) is float]
        if any(math.isnan(v) or math.copysign(1.0, v) < 0 for v in floats):
            with pytest.raises(JsonValueError, match=case["error"]):
                render_pretty(value)
        return
    value = loads(text)
    assert dumps(value) == text  # the text is the registry's spelling of the value
    assert render_pretty(value) == case["pretty"]


def test_the_corpus_covers_what_it_promises() -> None:
    names = {case["name"] for case in _cases()}
    assert {"deep nesting", "big ints", "floats as Python spells them", "negative zero"} <= names
    deep = next(c for c in _cases() if c["name"] == "deep nesting")["pretty"]
    assert max(len(line) - len(line.lstrip(" ")) for line in deep.split("\n")) == 10
