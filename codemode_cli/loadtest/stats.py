"""Exact percentiles, log-spaced histograms and bounded time-series sampling (no numpy)."""

from __future__ import annotations

import math
from collections.abc import Sequence

MAX_POINTS = 2_000
HISTOGRAM_BINS = 40


def percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) over sorted values."""
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, min, mean, p50, p95, p99, max (milliseconds in, milliseconds out)."""
    if not values:
        keys = ("min", "mean", "p50", "p95", "p99", "max")
        return {"count": 0} | dict.fromkeys(keys)
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "min": round(ordered[0], 3),
        "mean": round(math.fsum(ordered) / len(ordered), 3),
        "p50": round(percentile(ordered, 50), 3),
        "p95": round(percentile(ordered, 95), 3),
        "p99": round(percentile(ordered, 99), 3),
        "max": round(ordered[-1], 3),
    }


def log_edges(low: float, high: float, bins: int = HISTOGRAM_BINS) -> list[float]:
    """Bin edges spaced evenly in log10 between low and high (both > 0)."""
    low = max(low, 1e-3)
    high = max(high, low * 1.01)
    step = (math.log10(high) - math.log10(low)) / bins
    return [round(10 ** (math.log10(low) + step * k), 4) for k in range(bins + 1)]


def histogram(values: Sequence[float], edges: Sequence[float]) -> list[int]:
    """Counts per bin; values below the first edge land in the first bin, above in the last."""
    counts = [0] * (len(edges) - 1)
    if not counts:
        return counts
    for value in values:
        index = _bisect(edges, value) - 1
        counts[min(max(index, 0), len(counts) - 1)] += 1
    return counts


def _bisect(edges: Sequence[float], value: float) -> int:
    low, high = 0, len(edges)
    while low < high:
        middle = (low + high) // 2
        if edges[middle] <= value:
            low = middle + 1
        else:
            high = middle
    return low


def sample_series(
    points: Sequence[tuple[float, float]], limit: int = MAX_POINTS
) -> list[list[float]]:
    """At most `limit` points, evenly strided over time order, always keeping the last one."""
    ordered = sorted(points)
    if len(ordered) > limit:
        stride = len(ordered) / limit
        ordered = [ordered[int(k * stride)] for k in range(limit - 1)] + [ordered[-1]]
    return [[round(t, 4), round(v, 3)] for t, v in ordered]
