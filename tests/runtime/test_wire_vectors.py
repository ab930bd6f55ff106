"""The shared flat-wire corpus (``wire_vectors.jsonl``) against the Python codec.

The same file drives the JavaScript codec (``runtime_service/worker_ts/test/flatwire.test.js``),
so both workers spell every value identically, refuse the same values with the same words and
read the same token lists. Case kinds (one JSON object per line, ``only`` limits a case to one
language):

* ``value``/``expr`` + ``text``: the value encodes to exactly that token-list text, and the
  text decodes back to the value;
* ``value``/``expr`` + ``error``: sending the value as binding arguments fails with that text
  (what follows ``tool arguments must be lossless JSON: ``);
* ``text`` + ``decode_error`` (or ``decode_error_prefix``): decoding the text fails so;
* ``text`` + ``decodes_to``: the text decodes to that value;
* ``deep``: a value nested that deep round-trips (no recursion anywhere).

Values use plain JSON plus tags: ``{"$int": digits}``, ``{"$float": repr}`` (``nan``, ``inf``,
``-inf``, ``-0.0`` included) and ``{"$nested": n}`` (``[]`` wrapped in n arrays); ``expr`` maps
a language to source text evaluated there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime_service.worker import flatwire, framing

VECTORS = Path(__file__).with_name("wire_vectors.jsonl")
CASES: list[dict[str, Any]] = [
    json.loads(line) for line in VECTORS.read_text().splitlines() if line.strip()
]
PY_CASES = [case for case in CASES if case.get("only", "py") == "py"]


def materialize(value: Any) -> Any:
    """The Python value a corpus value stands for (iterative: corpus values are shallow)."""
    if isinstance(value, list):
        return [materialize(item) for item in value]
    if isinstance(value, dict):
        if set(value) == {"$int"}:
            limit = sys.get_int_max_str_digits()
            sys.set_int_max_str_digits(0)
            try:
                return int(value["$int"])
            finally:
                sys.set_int_max_str_digits(limit)
        if set(value) == {"$float"}:
            return float(value["$float"])
        if set(value) == {"$nested"}:
            nested: list[Any] = []
            for _ in range(value["$nested"]):
                nested = [nested]
            return nested
        return {key: materialize(member) for key, member in value.items()}
    return value


def subject(case: dict[str, Any]) -> Any:
    if "expr" in case:
        return eval(case["expr"]["py"])  # the corpus's own source text
    return materialize(case["value"])


def same(left: object, right: object) -> bool:
    """Equal with exact types (``True`` is not ``1``, ``1.0`` is not ``1``), iteratively."""
    pending = [(left, right)]
    while pending:
        a, b = pending.pop()
        if type(a) is not type(b):
            return False
        if isinstance(a, list):
            assert isinstance(b, list)
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif isinstance(a, dict):
            assert isinstance(b, dict)
            if list(a) != list(b):
                return False
            pending.extend((a[key], b[key]) for key in a)
        elif a != b:
            return False
    return True


def send_error(value: object) -> str | None:
    """What the Python worker reports after ``tool arguments must be lossless JSON: ``."""
    try:
        framing.pack({"t": "call", "id": 1, "name": "t", "args": flatwire.encode(value)})
    except (flatwire.WireError, ValueError) as exc:
        return str(exc)
    return None


def deep_value(kind: str, depth: int) -> object:
    value: object = [] if kind == "array" else {}
    for _ in range(depth):
        value = [value] if kind == "array" else {"k": value}
    return value


def test_corpus_covers_both_languages() -> None:
    assert len(CASES) > 90
    kinds = {case.get("only", "both") for case in CASES}
    assert kinds == {"both", "py", "js"}


@pytest.mark.parametrize("case", PY_CASES, ids=[case["name"] for case in PY_CASES])
def test_vector(case: dict[str, Any]) -> None:
    if "deep" in case:
        spec = case["deep"]
        value = deep_value(spec["kind"], spec["depth"])
        text = flatwire.encode_text(value)
        assert same(flatwire.decode_text(text), value)
        tokens = flatwire.loads_strict(text)
        assert len(tokens) == spec["depth"] + 1 or tokens[0]["kind"] == "json"
        return
    if "error" in case:
        assert send_error(subject(case)) == case["error"]
        return
    if "decode_error" in case or "decode_error_prefix" in case:
        with pytest.raises(flatwire.WireError) as caught:
            flatwire.decode_text(case["text"])
        if "decode_error" in case:
            assert str(caught.value) == case["decode_error"]
        else:
            assert str(caught.value).startswith(case["decode_error_prefix"])
        return
    if "decodes_to" in case:
        assert same(flatwire.decode_text(case["text"]), materialize(case["decodes_to"]))
        return
    value = subject(case)
    assert send_error(value) is None
    assert json.dumps(flatwire.encode(value), separators=(",", ":")) == case["text"]
    assert same(flatwire.decode_text(case["text"]), value)
