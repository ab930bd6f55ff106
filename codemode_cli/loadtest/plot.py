"""A self-contained HTML page: the summary, latency over time (scatter) and the latency
histogram, drawn as inline SVG. No scripts, fonts or stylesheets are fetched from anywhere."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from codemode_cli.loadtest.report import settings_rows

WIDTH, HEIGHT = 900, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 40
COLORS = {"outer": "#c0392b", "nested": "#2471a3", "queue_wait": "#7d3c98"}
LABELS = {"outer": "outer run_code", "nested": "nested start→commit", "queue_wait": "queue wait"}


def _log_ticks(low: float, high: float) -> list[float]:
    ticks = []
    for exponent in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        for mantissa in (1, 2, 5):
            value = mantissa * 10.0**exponent
            if low <= value <= high:
                ticks.append(value)
    return ticks


def _linear_ticks(high: float, count: int = 8) -> list[float]:
    raw = max(high, 1e-9) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [k * step for k in range(int(high / step) + 1)]


def _label(value: float) -> str:
    return f"{value:g}"


class _Axes:
    """Maps data to pixels: x linear or log, y linear or log."""

    def __init__(self, x: tuple[float, float, bool], y: tuple[float, float, bool]) -> None:
        self.x, self.y = x, y

    @staticmethod
    def _scale(value: float, low: float, high: float, log: bool) -> float:
        if log:
            value, low, high = (math.log10(max(v, 1e-9)) for v in (value, low, high))
        return 0.0 if high == low else (value - low) / (high - low)

    def px(self, value: float) -> float:
        return LEFT + self._scale(value, *self.x) * (WIDTH - LEFT - RIGHT)

    def py(self, value: float) -> float:
        return HEIGHT - BOTTOM - self._scale(value, *self.y) * (HEIGHT - TOP - BOTTOM)


def _frame(
    axes: _Axes, xticks: Sequence[float], yticks: Sequence[float], titles: tuple[str, str]
) -> list[str]:
    parts = [
        f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
        f'height="{HEIGHT - TOP - BOTTOM}" class="frame"/>'
    ]
    for tick in xticks:
        x = axes.px(tick)
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" class="grid"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" class="tick mid">{_label(tick)}</text>'
        )
    for tick in yticks:
        y = axes.py(tick)
        parts.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" class="grid"/>'
        )
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="tick end">{_label(tick)}</text>')
    x_title, y_title = titles
    parts.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" class="mid">{x_title}</text>'
    )
    parts.append(
        f'<text transform="translate(14 {(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)" '
        f'class="mid">{y_title}</text>'
    )
    return parts


def scatter(series: dict[str, list[list[float]]]) -> str:
    points = [(t, v) for values in series.values() for t, v in values]
    if not points:
        return "<p>No completed calls to plot.</p>"
    t_high = max(*(t for t, _ in points), 1e-3)
    low = max(min(v for _, v in points), 1e-3)
    high = max(*(v for _, v in points), low * 10)
    low, high = 10 ** math.floor(math.log10(low)), 10 ** math.ceil(math.log10(high))
    axes = _Axes((0.0, t_high, False), (low, high, True))
    parts = _frame(
        axes, _linear_ticks(t_high), _log_ticks(low, high), ("time since start (s)", "latency (ms)")
    )
    for name, values in series.items():
        color = COLORS[name]
        parts.extend(
            f'<circle cx="{axes.px(t):.1f}" cy="{axes.py(v):.1f}" r="1.8" fill="{color}"/>'
            for t, v in values
        )
    return _svg("Latency over time", parts, series.keys())


def histogram(edges: list[float], counts: dict[str, list[int]]) -> str:
    counts = {name: c for name, c in counts.items() if sum(c)}
    if not counts or len(edges) < 2:
        return "<p>No latencies to plot.</p>"
    shares = {name: [n / sum(c) for n in c] for name, c in counts.items()}
    top = max(max(s) for s in shares.values())
    axes = _Axes((edges[0], edges[-1], True), (0.0, top * 1.05, False))
    yticks = [t for t in _linear_ticks(top * 1.05, 5) if t <= top * 1.05]
    parts = _frame(
        axes, _log_ticks(edges[0], edges[-1]), yticks, ("latency (ms, log)", "share of calls")
    )
    for name, values in shares.items():
        for k, share in enumerate(values):
            if share <= 0:
                continue
            x0, x1 = axes.px(edges[k]), axes.px(edges[k + 1])
            y = axes.py(share)
            parts.append(
                f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0 - 0.5, 0.5):.1f}" '
                f'height="{HEIGHT - BOTTOM - y:.1f}" fill="{COLORS[name]}" fill-opacity="0.45"/>'
            )
    return _svg("Latency histogram", parts, shares.keys())


def _svg(title: str, parts: list[str], names: Any) -> str:
    legend = "".join(
        f'<span class="key"><i style="background:{COLORS[n]}"></i>{html.escape(LABELS[n])}</span>'
        for n in names
    )
    body = "\n".join(parts)
    return (
        f"<h2>{html.escape(title)}</h2><div>{legend}</div>"
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{html.escape(title)}">\n{body}\n</svg>'
    )


STYLE = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
pre { background: #f6f6f6; padding: 12px; overflow-x: auto; }
svg { display: block; margin: 8px 0 24px; }
.frame { fill: none; stroke: #888; }
.grid { stroke: #e4e4e4; }
text { font-size: 11px; fill: #444; }
.mid { text-anchor: middle; }
.end { text-anchor: end; }
.key { margin-right: 16px; }
.key i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
table { border-collapse: collapse; margin: 8px 0 24px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
tr.better td { color: #1e8449; } tr.worse td { color: #c0392b; font-weight: 600; }
tr.differs td { background: #fdf2d0; }
"""


def table(
    rows: Sequence[Sequence[str]], header: Sequence[str] = (), classes: Sequence[str] = ()
) -> str:
    """Rows of text as an HTML table (every cell escaped); `classes[i]` marks row i."""

    def cells(tag: str, row: Sequence[str]) -> str:
        return "".join(f"<{tag}>{html.escape(cell)}</{tag}>" for cell in row)

    def mark(index: int) -> str:
        name = classes[index] if index < len(classes) else ""
        return f' class="{html.escape(name)}"' if name else ""

    head = f"<tr>{cells('th', header)}</tr>" if header else ""
    body = "".join(f"<tr{mark(i)}>{cells('td', row)}</tr>" for i, row in enumerate(rows))
    return f"<table>{head}{body}</table>"


def page(report: dict[str, Any], summary: list[str]) -> str:
    series = report["time_series"]
    settings = settings_rows(report) if "settings" in report else []
    scatter_svg = scatter({"outer": series["outer"], "nested": series["nested"]})
    hist = report["histograms_ms"]
    histogram_svg = histogram(
        hist["edges"], {k: hist[k] for k in ("outer", "nested", "queue_wait")}
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>codemode loadtest</title>"
        f"<style>{STYLE}</style></head><body>\n<h1>codemode loadtest</h1>\n"
        f"<pre>{html.escape(chr(10).join(summary))}</pre>\n"
        f'<h2>Settings and machine</h2><div class="settings">{table(settings)}</div>\n'
        f"{scatter_svg}\n{histogram_svg}\n"
        f"<p>Time series sampled to at most {series['max_points']} points per series; "
        "histograms count every call. Full numbers: loadtest.json.</p>\n</body></html>\n"
    )
