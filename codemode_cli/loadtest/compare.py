"""`codemode loadtest compare A B`: two load test reports side by side, and a verdict on B.

The rule. Two runs are **comparable** when what shapes the load is the same: the workload
settings (programs, concurrency, calls, fanout, shares, latency model, seed), the services
(started or external, their parallelism, pool, admission limit, how many registries) and the
machine (cores, CPU model). The duration limit counts only when it stopped either run. The
commit and the load average may differ (the commit is usually what is compared; the load
average is noted). When anything that matters differs, the verdict is **not comparable** and
the differences are listed.

For comparable runs each figure's relative change (B − A) / A is judged against a noise band:
`threshold` (`--threshold`, 25 % unless given: repeats on a shared 2-core machine move that
much, see docs/benchmarks.md) for throughput, p50 and CPU per call, twice that for the tails
(p95, p99). B is **worse** when it has more errors (failed, cancelled or refused programs,
failed nested calls, calls lost or extra in the loss check) than A, or any figure is worse
beyond its band; **better** when none is worse and at least one is better beyond its band;
otherwise **same within noise**. CPU per call takes part only when each run measured at least
`MIN_CPU_S` of it (the kernel counts CPU in 10 ms ticks).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codemode_cli.exit_codes import ExitCode
from codemode_cli.loadtest.plot import STYLE, table
from codemode_cli.loadtest.report import REPORT, settings_rows

# Exit statuses of `compare`, from the one table (codemode_common/exit_codes.py): a missing
# folder or a file that is not a report is "not found".
SAME_OR_BETTER, WORSE, USAGE = ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE
NOT_COMPARABLE, NOT_A_REPORT = ExitCode.NOT_COMPARABLE, ExitCode.NOT_FOUND

RULE = (
    "Comparable: the same workload settings, services and machine (cores, CPU model). Worse: "
    "more errors, or a figure worse beyond its band (the threshold for throughput, p50 and CPU "
    "per call; twice it for p95 and p99). Better: nothing worse and a figure better beyond its "
    "band. Otherwise the same within noise."
)
MIN_CPU_S = 0.5
BETTER, WORSE_VERDICT, SAME, INCOMPARABLE = "better", "worse", "same within noise", "not comparable"

# Settings whose difference makes two runs not comparable: (section, key).
_WORKLOAD = (
    "programs",
    "concurrency",
    "calls",
    "fanout",
    "exclusive_share",
    "approval_share",
    "latency",
    "seed",
)
_SERVICES = ("mode", "max_parallel_sub_calls", "runtime_pool_size", "admission_limit")
_MACHINE = ("cores", "cpu_model")


class ReportError(Exception):
    """An input that is not a load test report (missing, unreadable, or something else)."""


def load(path: Path) -> tuple[Path, dict[str, Any]]:
    """The report at `path`: a report folder (its loadtest.json) or the JSON file itself."""
    file = path / "loadtest.json" if path.is_dir() else path
    if not file.exists():
        where = f"{path} has no loadtest.json" if path.is_dir() else f"{path} does not exist"
        raise ReportError(f"no load test report: {where}")
    try:
        document = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"cannot read {file}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{file} is not a load test report (not JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("report") != REPORT:
        raise ReportError(f'{file} is not a load test report (no "report": "{REPORT}")')
    missing = [
        k
        for k in ("settings", "services", "throughput", "latency_ms", "totals")
        if k not in document
    ]
    if missing:
        raise ReportError(f"{file} is an incomplete load test report (no {', '.join(missing)})")
    return file, document


@dataclass(frozen=True)
class Row:
    """One figure of both runs."""

    name: str
    a: float | None
    b: float | None
    higher_is_better: bool
    band: float | None  # None: shown, not judged

    @property
    def change(self) -> float | None:
        if self.a is None or self.b is None or self.a == 0:
            return None
        return (self.b - self.a) / self.a

    @property
    def judgement(self) -> str:
        change = self.change
        if self.band is None or change is None or abs(change) <= self.band:
            return "" if self.band is None or change is None else "~"
        return "better" if (change > 0) == self.higher_is_better else "worse"


@dataclass
class Comparison:
    a: dict[str, Any]
    b: dict[str, Any]
    threshold: float
    differences: list[tuple[str, str, str]] = field(default_factory=list)  # what, A, B
    notes: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    verdict: str = SAME
    reasons: list[str] = field(default_factory=list)

    @property
    def status(self) -> int:
        return {INCOMPARABLE: NOT_COMPARABLE, WORSE_VERDICT: WORSE}.get(
            self.verdict, SAME_OR_BETTER
        )


def _get(document: dict[str, Any], *keys: str) -> Any:
    value: Any = document
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _settings_differences(a: dict[str, Any], b: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    def show(value: Any) -> str:
        return "unknown" if value is None else str(value)

    for key in _WORKLOAD:
        if _get(a, "settings", key) != _get(b, "settings", key):
            yield key, show(_get(a, "settings", key)), show(_get(b, "settings", key))
    for key in _SERVICES:
        if _get(a, "services", key) != _get(b, "services", key):
            yield f"services.{key}", show(_get(a, "services", key)), show(_get(b, "services", key))
    count_a, count_b = (len(_get(d, "services", "registries") or ()) for d in (a, b))
    if count_a != count_b:
        yield "registries", str(count_a), str(count_b)
    stopped = a.get("stopped_by_duration_limit") or b.get("stopped_by_duration_limit")
    if stopped and _get(a, "settings", "duration_limit_s") != _get(
        b, "settings", "duration_limit_s"
    ):
        yield (
            "duration_limit_s (a run was stopped by it)",
            show(_get(a, "settings", "duration_limit_s")),
            show(_get(b, "settings", "duration_limit_s")),
        )
    for key in _MACHINE:
        left, right = _get(a, "environment", "machine", key), _get(b, "environment", "machine", key)
        if left is not None and right is not None and left != right:
            yield f"machine.{key}", show(left), show(right)


def _errors(document: dict[str, Any]) -> int:
    totals = document["totals"]
    loss = document.get("loss_check") or {}
    keys = ("programs_failed", "programs_cancelled", "programs_refused", "nested_failed")
    return (
        sum(int(totals.get(k) or 0) for k in keys)
        + int(loss.get("lost") or 0)
        + int(loss.get("extra") or 0)
    )


def _rows(a: dict[str, Any], b: dict[str, Any], threshold: float) -> list[Row]:
    def figure(name: str, path: tuple[str, ...], band: float | None, higher: bool = False) -> Row:
        return Row(name, _get(a, *path), _get(b, *path), higher, band)

    tail = 2 * threshold
    rows = [
        figure("programs/s", ("throughput", "programs_per_s"), threshold, higher=True),
        figure("nested calls/s", ("throughput", "nested_per_s"), threshold, higher=True),
    ]
    for kind, label in (
        ("outer", "outer run_code"),
        ("nested", "nested start→commit"),
        ("queue_wait", "queue wait"),
    ):
        for q, band in (("p50", threshold), ("p95", tail), ("p99", tail)):
            rows.append(figure(f"{label} {q} (ms)", ("latency_ms", kind, q), band))
    enough = all((_get(d, "cpu", "measured_s") or 0) >= MIN_CPU_S for d in (a, b))
    rows += [
        figure(
            "CPU per nested call, driver + services (µs)",
            ("cpu", "measured_per_nested_call_us"),
            threshold if enough else None,
        ),
        figure(
            "CPU per nested call, whole machine (µs)", ("cpu", "machine_per_nested_call_us"), None
        ),
        Row("errors (programs, nested, lost)", _errors(a), _errors(b), False, None),
    ]
    return rows


def compare(a: dict[str, Any], b: dict[str, Any], threshold: float) -> Comparison:
    result = Comparison(a, b, threshold)
    result.differences = list(_settings_differences(a, b))
    commits = (_get(a, "environment", "commit"), _get(b, "environment", "commit"))
    if None in commits:
        result.notes.append("a run does not record its commit")
    elif commits[0] == commits[1]:
        result.notes.append("both runs are of the same commit")
    loads = [_get(d, "environment", "load_average_start") for d in (a, b)]
    if all(loads):
        result.notes.append(
            f"load average (1 min) at the start: A {loads[0][0]:g}, B {loads[1][0]:g}"
            + (" - B's machine was much busier" if loads[1][0] > 2 * max(loads[0][0], 0.5) else "")
            + (" - A's machine was much busier" if loads[0][0] > 2 * max(loads[1][0], 0.5) else "")
        )
    if any(_get(d, "environment", "machine") is None for d in (a, b)):
        result.notes.append("a run does not record its machine: it is assumed to be the same")
    result.rows = _rows(a, b, threshold)
    if result.differences:
        result.verdict = INCOMPARABLE
        result.reasons = [
            f"{what} differs: {left} vs {right}" for what, left, right in result.differences
        ]
        return result
    errors_a, errors_b = _errors(a), _errors(b)
    worse = [r for r in result.rows if r.judgement == "worse"]
    better = [r for r in result.rows if r.judgement == "better"]
    if errors_b > errors_a:
        result.reasons.append(f"B had more errors: {errors_b} vs {errors_a}")
    result.reasons += [f"{r.name} worse by {_percent(r.change)}" for r in worse]
    if result.reasons:
        result.verdict = WORSE_VERDICT
    elif better:
        result.verdict = BETTER
        result.reasons = [f"{r.name} better by {_percent(r.change)}" for r in better]
    else:
        result.reasons = [f"every figure within ±{threshold:.0%} (tails ±{2 * threshold:.0%})"]
    return result


def _percent(change: float | None) -> str:
    return "" if change is None else f"{change:+.1%}"


def _value(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if isinstance(value, int) or abs(value) >= 1000 else f"{value:.2f}"


def _head(document: dict[str, Any]) -> str:
    head = _get(document, "environment", "commit")
    return (head or "unknown")[:12] + ("+" if _get(document, "environment", "dirty") else "")


def lines(result: Comparison, names: tuple[str, str]) -> list[str]:
    a, b = result.a, result.b
    out = [
        f"codemode loadtest compare: A {names[0]} (commit {_head(a)})",
        f"                           B {names[1]} (commit {_head(b)})",
    ]
    if result.differences:
        out.append("  settings that differ:")
        out += [f"    {what}: {left} vs {right}" for what, left, right in result.differences]
    else:
        out.append("  settings: the same workload, services and machine")
    width = max(len(r.name) for r in result.rows) + 2
    out.append(f"  {'figure':<{width}}{'A':>12}{'B':>12}{'change':>10}")
    for r in result.rows:
        out.append(
            f"  {r.name:<{width}}{_value(r.a):>12}{_value(r.b):>12}{_percent(r.change):>10}"
            + (f"  {r.judgement}" if r.judgement else "")
        )
    out.append(
        f"  (~: within the noise band; CPU per call is judged only with {MIN_CPU_S:g} s of it "
        "measured in each run)"
    )
    out += [f"  note: {note}" for note in result.notes]
    out.append(f"verdict: {result.verdict}")
    out += [f"  {reason}" for reason in result.reasons]
    return out


def page(result: Comparison, names: tuple[str, str]) -> str:
    """Both runs side by side: the verdict, the figures, and both runs' settings."""
    figures = table(
        [(r.name, _value(r.a), _value(r.b), _percent(r.change), r.judgement) for r in result.rows],
        ("figure", "A", "B", "change", ""),
        [r.judgement if r.judgement in ("better", "worse") else "" for r in result.rows],
    )
    settings_a, settings_b = dict(settings_rows(result.a)), dict(settings_rows(result.b))
    keys = list(dict.fromkeys([*settings_a, *settings_b]))
    settings = table(
        [(k, settings_a.get(k, "-"), settings_b.get(k, "-")) for k in keys],
        ("setting", "A", "B"),
        ["differs" if settings_a.get(k) != settings_b.get(k) else "" for k in keys],
    )
    escape = html.escape
    reasons = "".join(f"<li>{escape(r)}</li>" for r in result.reasons)
    notes = "".join(f"<li>{escape(n)}</li>" for n in result.notes)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>codemode loadtest compare</title>"
        f"<style>{STYLE}</style></head><body>\n<h1>codemode loadtest compare</h1>\n"
        f"<p>A: {escape(names[0])}<br>B: {escape(names[1])}</p>\n"
        f'<h2 class="verdict">Verdict: {escape(result.verdict)}</h2><ul>{reasons}</ul>\n'
        f"<h2>Figures</h2>{figures}\n<ul>{notes}</ul>\n<h2>Settings and machine</h2>{settings}\n"
        f"<p>{escape(RULE)}</p>\n"
        "</body></html>\n"
    )
