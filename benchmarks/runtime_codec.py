"""Flat-wire codec vs the stdlib ``json`` module.

Measures one echo of the worker <-> runtime wire (value -> tokens -> frame text -> tokens ->
value: ``flatwire.decode_text(flatwire.encode_text(value))``) against ``json.loads(json.dumps())``
of the same value, measured in the same run, interleaved, on:

* a ~1 MB document of small dicts (``dicts_1mb_roundtrip_ratio``: ours / stdlib, target <= 2);
* the same rows ten times over (~10 MB);
* a 100,000-deep value, which stdlib ``json`` cannot handle (it recurses) and the wire must.

Each figure is also given for the iterative token codec alone (the fast path switched off), the
wire as it was before the C-speed path. Times are CPU time of this process (``process_time``:
the codec is single-threaded, and CPU time is far steadier than wall time on a shared machine),
p50 over the repeats; the wall-clock p50 is printed beside it. Prints one JSON object.

    .venv/bin/python -m benchmarks.runtime_codec [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from unittest import mock

from runtime_service.worker import flatwire, flatwire_fast

RATIO_TARGET = 2.0


def _rows(count: int) -> list[dict[str, object]]:
    return [
        {"id": i, "name": f"item-{i}", "tags": ["a", "b", "c"], "score": i * 0.5, "ok": i % 2 == 0}
        for i in range(count)
    ]


def _document(rows: int) -> object:
    return {"rows": _rows(rows), "total": rows}


def _deep(depth: int) -> object:
    root: list[object] = []
    cursor = root
    for _ in range(depth):
        child: list[object] = []
        cursor.append({"k": child})
        cursor = child
    return root


def _stdlib_round_trip(value: object) -> Callable[[], object]:
    return lambda: json.loads(json.dumps(value))


def _wire_round_trip(value: object) -> Callable[[], object]:
    return lambda: flatwire.decode_text(flatwire.encode_text(value))


def _token_round_trip(value: object) -> Callable[[], object]:
    def run() -> object:
        with mock.patch.object(flatwire_fast, "encode_text", return_value=None):
            return flatwire.decode_text(flatwire.encode_text(value))

    return run


def _time(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict[str, float]]:
    """Interleaved runs (one of each per round), so that every contender sees the same load."""
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    wall: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            started_cpu, started_wall = time.process_time(), time.perf_counter()
            fn()
            cpu[name].append(time.process_time() - started_cpu)
            wall[name].append(time.perf_counter() - started_wall)
    return {
        name: {
            "cpu_p50_ms": round(statistics.median(cpu[name]) * 1000, 2),
            "wall_p50_ms": round(statistics.median(wall[name]) * 1000, 2),
            "n": repeats,
        }
        for name in fns
    }


def _compare(value: object, repeats: int, token_repeats: int) -> tuple[float, dict[str, object]]:
    """(ours / stdlib CPU time, all figures) for round trips of ``value``."""
    figures = _time(
        {"flatwire": _wire_round_trip(value), "stdlib_json": _stdlib_round_trip(value)}, repeats
    )
    figures.update(_time({"token_codec_only": _token_round_trip(value)}, token_repeats))
    ours, stdlib = figures["flatwire"]["cpu_p50_ms"], figures["stdlib_json"]["cpu_p50_ms"]
    size = len(json.dumps(value, separators=(",", ":")))
    ratio = round(ours / stdlib, 2)
    return ratio, {
        "json_bytes": size,
        "ratio": ratio,
        "flatwire_mb_per_s": round(size / 1e6 / (ours / 1000), 1),
        **figures,
    }


def main(quick: bool) -> dict[str, object]:
    repeats = 7 if quick else 25
    ratio, doc_1mb = _compare(_document(13_000), repeats, 2 if quick else 7)
    _, doc_10mb = _compare(_document(130_000), 2 if quick else 7, 1 if quick else 3)
    deep = _deep(100_000)
    wire_deep = _time({"flatwire": _wire_round_trip(deep)}, 1 if quick else 5)["flatwire"]
    try:
        json.loads(json.dumps(deep))
        stdlib_deep: object = _time({"json": _stdlib_round_trip(deep)}, 3)["json"]
    except RecursionError:
        stdlib_deep = "RecursionError (stdlib json recurses per nesting level)"
    return {
        "benchmark": "runtime_codec",
        "quick": quick,
        "dicts_1mb_roundtrip_ratio": ratio,
        "dicts_1mb_flatwire_ms": doc_1mb["flatwire"],
        "dicts_1mb_stdlib_json_ms": doc_1mb["stdlib_json"],
        "target": f"dicts_1mb_roundtrip_ratio <= {RATIO_TARGET} (ours / stdlib json, same run)",
        "meets_target": ratio <= RATIO_TARGET,
        "baseline": "stdlib json.loads(json.dumps(v)) of the same value; token_codec_only is "
        "the wire before its C-speed path",
        "document_1mb": doc_1mb,
        "document_10mb": doc_10mb,
        "document_100000_deep": {
            "flatwire_round_trip": wire_deep,
            "baseline_stdlib_json_round_trip": stdlib_deep,
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(main(parser.parse_args().quick)))
