"""Throughput of the lossless JSON codec against the standard `json` module, in the same run.

    .venv/bin/python -m benchmarks.json_codec [--quick]

Prints one JSON object: for each document, loads/dumps medians (ms, MB/s) for
`codemode_wire.jsonvalue` and for the stdlib (`json.loads`, and `json.dumps` with the same
compact, non-ASCII-preserving output), the ratio ours/stdlib (time), and a `target` verdict:
on the ~1 MB document our loads and dumps take at most 1.5x the stdlib time, and the
10,000-deep document is handled. The stdlib runs at the default recursion limit, so it fails
on the deep document; that is reported as `null` with the error, not worked around.
Ours and the stdlib run back to back in each repeat (alternating which goes first); `ratio` is
the median of the per-repeat time ratios, so drift on a shared machine hits both sides alike.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable

from codemode_wire import jsonvalue

TARGET_RATIO = 1.5
DEEP = 10_000

_WORDS = [
    "alpha", "beta", "gamma", "delta", "read", "write", "src/registry/servicer.py", "naïve",
    "café", "日本語", "Grüße", "emoji 😀", 'say "hi"', "C:\\path\\file", "tab\there", "ok",
]  # fmt: skip
_CODE = 'def main():\n    print("hello, world")\n    return {"ok": True}\n'


def realistic_document(target_bytes: int = 1_000_000, seed: int = 20260801) -> object:
    """A tool-result-like document: search hits with metadata, text, code, numbers."""
    rng = random.Random(seed)
    hits: list[object] = []
    size = 0
    while size < target_bytes:
        n = len(hits)
        hit = {
            "id": n,
            "path": f"packages/{rng.choice(_WORDS)}/src/file_{n}.py",
            "line": rng.randint(1, 5000),
            "score": round(rng.uniform(-50, 50), rng.randint(0, 6)) or 0.0,  # never -0.0
            "ratio": rng.random(),
            "hash": rng.getrandbits(64),
            "binary": rng.random() < 0.5,
            "owner": None if n % 4 else {"name": rng.choice(_WORDS), "uid": rng.randint(0, 10**6)},
            "tags": [rng.choice(_WORDS) for _ in range(rng.randint(0, 6))],
            "snippet": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 40))),
            "code": _CODE if n % 5 == 0 else "",
            "history": [
                {"rev": rng.randint(1, 999), "delta": [rng.randint(-9, 9) for _ in range(3)]}
                for _ in range(rng.randint(0, 3))
            ],
        }
        hits.append(hit)
        size += len(json.dumps(hit, ensure_ascii=False).encode("utf-8"))
    return {"query": "lossless json", "total": len(hits), "truncated": False, "hits": hits}


def _stdlib_dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _time(fn: Callable[[], object]) -> float | None:
    """Seconds for one call, or None if it raised RecursionError/ValueError."""
    start = time.perf_counter()
    try:
        fn()
    except (RecursionError, ValueError):
        return None
    return time.perf_counter() - start


def _error(fn: Callable[[], object]) -> str:
    try:
        fn()
    except (RecursionError, ValueError) as exc:
        return type(exc).__name__
    return "none"


def _figures(seconds: list[float], size: int) -> dict[str, float]:
    median = statistics.median(seconds)
    return {"median_ms": round(median * 1000, 3), "mb_per_s": round(size / median / 1e6, 1)}


def _compare(
    ours: Callable[[], object], stdlib: Callable[[], object], size: int, repeats: int
) -> dict[str, object]:
    """Interleaved medians; a side that fails is reported as null with its error."""
    runs = {"ours": ours, "stdlib": stdlib}
    samples: dict[str, list[float]] = {"ours": [], "stdlib": []}
    failed: set[str] = set()
    for i in range(repeats):
        for name in ("ours", "stdlib") if i % 2 else ("stdlib", "ours"):
            if name not in failed:
                seconds = _time(runs[name])
                if seconds is None:
                    failed.add(name)
                else:
                    samples[name].append(seconds)
    result: dict[str, object] = {}
    for name in ("ours", "stdlib"):
        if name in failed:
            result[name] = None
            result[f"{name}_error"] = _error(runs[name])
        else:
            result[name] = _figures(samples[name], size)
    # The median of per-repeat ratios: each pair ran back to back, so drift cancels out.
    pairs = zip(samples["ours"], samples["stdlib"], strict=True)
    result["ratio"] = None if failed else round(statistics.median(o / s for o, s in pairs), 3)
    return result


def _document(value: object, repeats: int) -> dict[str, object]:
    text = jsonvalue.dumps(value)
    size = len(text.encode("utf-8"))
    return {
        "bytes": size,
        "loads": _compare(lambda: jsonvalue.loads(text), lambda: json.loads(text), size, repeats),
        "dumps": _compare(
            lambda: jsonvalue.dumps(value), lambda: _stdlib_dumps(value), size, repeats
        ),
    }


def _ratio(document: dict[str, object], op: str) -> float | None:
    figures = document[op]
    assert isinstance(figures, dict)
    ratio = figures["ratio"]
    return ratio if isinstance(ratio, float) else None


def _ours_ok(document: dict[str, object], op: str) -> bool:
    figures = document[op]
    assert isinstance(figures, dict)
    return figures["ours"] is not None


def main() -> None:
    parser = argparse.ArgumentParser(description="JSON codec throughput vs the stdlib")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (under a minute)")
    args = parser.parse_args()
    repeats = 11 if args.quick else 61

    document = realistic_document()
    deep_value: object = []
    for _ in range(DEEP - 1):
        deep_value = [deep_value]
    realistic = _document(document, repeats)
    deep = _document(deep_value, max(3, repeats // 3))

    # Our pure-Python reference paths, for scale (they serve deep or unusual documents).
    text = jsonvalue.dumps(document)
    size = len(text.encode("utf-8"))
    slow_repeats = 3 if args.quick else 7
    slow = {
        "loads_mb_per_s": _figures(
            [jsonvalue_time(lambda: jsonvalue._loads_slow(text)) for _ in range(slow_repeats)],
            size,
        )["mb_per_s"],
        "dumps_mb_per_s": _figures(
            [jsonvalue_time(lambda: jsonvalue._dumps_slow(document)) for _ in range(slow_repeats)],
            size,
        )["mb_per_s"],
    }

    loads_ratio, dumps_ratio = _ratio(realistic, "loads"), _ratio(realistic, "dumps")
    target: dict[str, object] = {
        "description": (
            f"1 MB document: our loads and dumps take at most {TARGET_RATIO}x the stdlib time; "
            f"the {DEEP}-deep document is handled"
        ),
        "loads_within": loads_ratio is not None and loads_ratio <= TARGET_RATIO,
        "dumps_within": dumps_ratio is not None and dumps_ratio <= TARGET_RATIO,
        "deep_handled": _ours_ok(deep, "loads") and _ours_ok(deep, "dumps"),
    }
    target["met"] = all(target[k] for k in ("loads_within", "dumps_within", "deep_handled"))
    result = {
        "benchmark": "json_codec",
        "python": platform.python_version(),
        "quick": args.quick,
        "repeats": repeats,
        "baseline": (
            "stdlib json.loads and json.dumps(ensure_ascii=False, separators=(',', ':')) at the "
            f"default recursion limit ({sys.getrecursionlimit()})"
        ),
        "documents": {"realistic_1mb": realistic, f"deep_{DEEP}": deep},
        "reference_paths_1mb": slow,
        "target": target,
    }
    print(json.dumps(result, indent=2))


def jsonvalue_time(fn: Callable[[], object]) -> float:
    seconds = _time(fn)
    assert seconds is not None
    return seconds


if __name__ == "__main__":
    main()
