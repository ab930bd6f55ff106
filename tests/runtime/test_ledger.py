"""Output ledger byte accounting: sizes are exactly the JSON the result would take, plus
a fixed overhead per log line."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from runtime_service.worker import ledger as ledger_module
from runtime_service.worker.ledger import (
    LOG_LINE_OVERHEAD,
    OutputLedger,
    fit_prefix,
    json_string_size,
    json_value_size,
    overflow_message,
    valid_text,
)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("", 2),
        ("abc", 5),
        ('"', 4),
        ("\\", 4),
        ("\n\t\b\f\r", 12),
        ("\x00", 8),
        ("\x1f", 8),
        ("\x7f", 3),
        ("é", 4),
        ("€", 5),
        ("\U0001f600", 6),
        ("\ud800", 8),
    ],
)
def test_json_string_size(text: str, size: int) -> None:
    assert json_string_size(text) == size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("é😀€", "é😀€"),
        ("\ud800", "\ufffd"),
        ("a\udcffb\udfff", "a\ufffdb\ufffd"),
        ("é😀\ud800é😀", "é😀\ufffdé😀"),
        ("\ud83d\ude00", "\ufffd\ufffd"),  # a pair held as two code points is no character
    ],
)
def test_valid_text_replaces_each_surrogate(text: str, expected: str) -> None:
    assert valid_text(text) == expected
    valid_text(text).encode("utf-8")  # what a protobuf string field needs


@pytest.mark.parametrize(
    "text", ["plain", 'quote " and \\', "ctl \x01\x02\n", "mixed é€😀 \t", "a" * 1000]
)
def test_string_size_matches_json_utf8(text: str) -> None:
    assert json_string_size(text) == len(json.dumps(text, ensure_ascii=False).encode())


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -17,
        10**30,
        1.5,
        1e100,
        -2.5e-7,
        "x",
        [],
        {},
        [1, 2, 3],
        {"a": 1, "bb": [None, True, {"c": "é"}]},
    ],
)
def test_value_size_matches_compact_json(value: object) -> None:
    expected = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    assert json_value_size(value, 10**9) == expected


def test_value_size_stops_at_limit() -> None:
    assert json_value_size(["x" * 100] * 10_000, 50) == 51


def test_fit_prefix_is_code_point_aligned() -> None:
    assert fit_prefix("ab€cd", 2 + 2) == "ab"
    assert fit_prefix("ab€cd", 2 + 5) == "ab€"
    assert fit_prefix("\U0001f600x", 2 + 3) == ""
    assert fit_prefix("abc", 1) == ""


def test_logs_array_accounting() -> None:
    ledger = OutputLedger(1000)
    assert ledger.used == 2
    assert ledger.admit_log("abc")  # 2 + 5 + the line's overhead
    assert ledger.used == 7 + LOG_LINE_OVERHEAD
    assert ledger.admit_log("de")  # + 1 comma + 4 + the line's overhead
    assert ledger.used == 12 + 2 * LOG_LINE_OVERHEAD
    text = len(json.dumps(["abc", "de"], separators=(",", ":")))
    assert ledger.used == text + 2 * LOG_LINE_OVERHEAD


def test_each_line_costs_its_overhead_so_tiny_lines_cannot_flood() -> None:
    # What the runtime and the registry hold per line is paid for: a budget holds at most
    # budget / (overhead + 4) one-character lines, not budget / 4.
    budget = 1 << 16
    ledger = OutputLedger(budget)
    while ledger.admit_log("x"):
        pass
    lines = len(ledger.logs) - 1  # the last one overflowed
    assert lines == (budget - 2 + 1) // (4 + LOG_LINE_OVERHEAD)
    assert ledger.remaining_for_entry() < 0
    kept, message = ledger.overflow_logs()
    assert 2 + len(kept) * (4 + LOG_LINE_OVERHEAD) - 1 + json_string_size(message) <= budget


def test_exact_cap_and_one_over() -> None:
    ledger = OutputLedger(64)
    assert ledger.fits_value("x" * 60)  # [] + "x*60" = 2 + 62
    assert not ledger.fits_value("x" * 61)
    assert ledger.fits_message("m" * 60)
    assert not ledger.fits_message("m" * 61)


def test_log_overflow_keeps_fitting_prefix() -> None:
    cap = 64 + 2 * LOG_LINE_OVERHEAD
    ledger = OutputLedger(cap)
    assert ledger.admit_log("a" * 10)
    assert not ledger.admit_log("b" * 100)
    logs, message = ledger.overflow_logs()
    assert message == overflow_message(cap)  # "outer output exceeded 128 bytes" = 31 chars
    budget = cap - (len(message) + 2)
    assert logs[0] == "a" * 10
    assert logs[1] == "b" * (budget - 2 - 12 - 1 - 2 - 2 * LOG_LINE_OVERHEAD)
    total = len(json.dumps(logs, separators=(",", ":"))) + len(message) + 2
    assert total + 2 * LOG_LINE_OVERHEAD == cap


def test_overflow_truncates_the_message_when_the_cap_is_tiny() -> None:
    ledger = OutputLedger(4)
    ledger.admit_log("x")
    logs, message = ledger.overflow_logs()
    assert logs == []
    assert message == ""
    ledger = OutputLedger(10)
    logs, message = ledger.overflow_logs()
    assert message == "outer "


def test_overflow_prefix_respects_utf8_boundaries() -> None:
    ledger = OutputLedger(40)
    ledger.admit_log("€" * 100)
    logs, message = ledger.overflow_logs()
    used = len(json.dumps(logs, ensure_ascii=False, separators=(",", ":")).encode())
    assert used + json_string_size(message) <= 40
    assert all(ch == "€" for ch in "".join(logs))


def test_minimum_cap() -> None:
    with pytest.raises(ValueError, match=">= 4"):
        OutputLedger(3)


def test_both_workers_charge_a_line_the_same_overhead() -> None:
    source = (Path(ledger_module.__file__).parent.parent / "worker_ts" / "ledger.js").read_text()
    match = re.search(r"export const LOG_LINE_OVERHEAD = (\d+);", source)
    assert match is not None
    assert int(match.group(1)) == LOG_LINE_OVERHEAD


def _walked_size(text: str) -> int:
    """JSON-string size by a walk over the characters (what the ledger's C-speed one is)."""
    size = 2
    for ch in text:
        code = ord(ch)
        if code < 0x20:
            size += 2 if code in (0x08, 0x09, 0x0A, 0x0C, 0x0D) else 6
        elif code in (0x22, 0x5C):
            size += 2
        elif code < 0x80:
            size += 1
        elif code < 0x800:
            size += 2
        elif 0xD800 <= code <= 0xDFFF:
            size += 6
        else:
            size += 3 if code < 0x10000 else 4
    return size


def test_sizes_and_prefixes_agree_with_a_walk_over_the_characters() -> None:
    rng = random.Random(7)
    alphabet = 'a"\\\n\x01\x7f é€😀\ud800\udc00\t\x1f'
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        assert json_string_size(text) == _walked_size(text), repr(text)
        budget = rng.randint(0, 70)
        prefix = fit_prefix(text, budget)
        assert text.startswith(prefix)
        assert _walked_size(prefix) <= budget or prefix == ""
        if prefix != text:
            assert _walked_size(text[: len(prefix) + 1]) > budget, (repr(text), budget)
