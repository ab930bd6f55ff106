"""Flat-wire codec vs the stdlib ``json`` module (issue 4 benchmark c).

Measures encode+decode of the worker <-> runtime wire (value -> token list -> JSON text -> token
list -> value) against ``json.dumps`` + ``json.loads`` of the same value, on a ~1 MB document
and on a 10,000-deep one (which stdlib ``json`` cannot handle: it recurses). Prints one JSON
object. There is no pass/fail target: the figure tells what the wire's iteration costs.

    .venv/bin/python -m benchmarks.runtime_codec [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from runtime_service.worker import flatwire


def _document_1mb() -> object:
    rows = [
        {"id": i, "name": f"item-{i}", "tags": ["a", "b", "c"], "score": i * 0.5, "ok": i % 2 == 0}
        for i in range(11_000)
    ]
    return {"rows": rows, "total": len(rows)}


def _deep(depth: int) -> object:
    root: list[object] = []
    cursor = root
    for _ in range(depth):
        child: list[object] = []
        cursor.append({"k": child})
        cursor = child
    return root


def _time(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return {"p50_ms": round(statistics.median(samples) * 1000, 2), "n": repeats}


def _stdlib_round_trip(value: object) -> Callable[[], object]:
    return lambda: json.loads(json.dumps(value))


def _wire_round_trip(value: object) -> Callable[[], object]:
    return lambda: flatwire.decode_text(flatwire.encode_text(value))


def main(quick: bool) -> dict[str, object]:
    repeats = 5 if quick else 20
    doc = _document_1mb()
    size = len(json.dumps(doc))
    wire_1mb = _time(_wire_round_trip(doc), repeats)
    json_1mb = _time(_stdlib_round_trip(doc), repeats)
    deep = _deep(10_000)
    wire_deep = _time(_wire_round_trip(deep), repeats)
    try:
        json.loads(json.dumps(deep))
        stdlib_deep: object = _time(_stdlib_round_trip(deep), repeats)
    except RecursionError:
        stdlib_deep = "RecursionError (stdlib json recurses per nesting level)"
    return {
        "benchmark": "runtime_codec",
        "quick": quick,
        "document_1mb": {
            "json_bytes": size,
            "flatwire_round_trip": wire_1mb,
            "baseline_stdlib_json_round_trip": json_1mb,
            "slowdown_vs_stdlib": round(wire_1mb["p50_ms"] / json_1mb["p50_ms"], 1),
            "flatwire_mb_per_s": round(size / 1e6 / (wire_1mb["p50_ms"] / 1000), 1),
        },
        "document_10000_deep": {
            "flatwire_round_trip": wire_deep,
            "baseline_stdlib_json_round_trip": stdlib_deep,
        },
        "target": "none (informational); the wire must round-trip depth stdlib json cannot",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(main(parser.parse_args().quick)))
