"""`codemode loadtest compare`: reports that record their settings and machine, real short runs
compared (same settings: a verdict; other settings: not comparable), the verdict rule on
figures changed one at a time, and inputs that are not reports."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from codemode_cli.loadtest import COMPARE_THRESHOLD
from codemode_cli.loadtest import compare as c
from codemode_cli.main import main

BAND = COMPARE_THRESHOLD
SMALL = ("--programs", "8", "--calls", "3", "--latency", "fixed:2ms", "--quiet")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "codemode_cli", "loadtest", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three real load tests: A and B with the same settings, C with another concurrency."""
    out = {}
    for name, concurrency in (("a", "2"), ("b", "2"), ("c", "4")):
        folder = tmp_path_factory.mktemp(f"run-{name}")
        done = _cli(*SMALL, "--concurrency", concurrency, "--out", str(folder))
        assert done.returncode == 0, done.stdout + done.stderr
        out[name] = folder
    return out


def _report(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "loadtest.json").read_text()))


def test_a_report_records_its_settings_machine_and_load(runs: dict[str, Path]) -> None:
    report = _report(runs["a"])
    assert report["report"] == "codemode loadtest" and report["format"] == 1
    assert report["settings"]["concurrency"] == 2 and report["settings"]["latency"] == "fixed:2ms"
    env = report["environment"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert env["commit"] == head and isinstance(env["dirty"], bool)
    machine = env["machine"]
    assert machine["cores"] == os.cpu_count()
    assert machine["memory_bytes"] > 0 and machine["cpu_model"]
    for key in ("load_average_start", "load_average_end"):
        assert len(env[key]) == 3 and all(v >= 0 for v in env[key])
    cpu = report["cpu"]
    assert set(cpu["processes_s"]) == {"runtime", "registry", "peer"}
    assert all(v is not None and v >= 0 for v in cpu["processes_s"].values())
    assert cpu["measured_s"] >= cpu["driver_s"] >= 0 and cpu["machine_busy_s"] >= 0
    page = (runs["a"] / "loadtest.html").read_text()
    assert "Settings and machine" in page and head in page
    assert "<td>concurrency</td><td>2</td>" in page and "<td>load_average_start</td>" in page
    assert "<script" not in page


def test_two_runs_with_the_same_settings_get_a_verdict(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    html = tmp_path / "side-by-side.html"
    done = _cli("compare", str(runs["a"]), str(runs["b"] / "loadtest.json"), "--out", str(html))
    verdicts = {"better": 0, "same within noise": 0, "worse": 1}
    verdict = next(line for line in done.stdout.splitlines() if line.startswith("verdict: "))
    assert verdict.removeprefix("verdict: ") in verdicts, done.stdout + done.stderr
    assert done.returncode == verdicts[verdict.removeprefix("verdict: ")], done.stdout
    assert "settings: the same workload, services and machine" in done.stdout
    for figure in ("programs/s", "outer run_code p99 (ms)", "nested start→commit p50 (ms)"):
        assert figure in done.stdout
    assert "both runs are of the same commit" in done.stdout
    page = html.read_text()
    assert f"Verdict: {verdict.removeprefix('verdict: ')}" in page
    assert str(runs["a"] / "loadtest.json") in page and str(runs["b"] / "loadtest.json") in page
    assert "<th>figure</th>" in page and "<script" not in page


def test_runs_with_other_settings_are_not_comparable(runs: dict[str, Path], tmp_path: Path) -> None:
    done = _cli("compare", str(runs["a"]), str(runs["c"]), "--out", str(tmp_path / "x.html"))
    assert done.returncode == c.NOT_COMPARABLE == 8, done.stdout + done.stderr
    assert "verdict: not comparable" in done.stdout
    assert "concurrency differs: 2 vs 4" in done.stdout
    page = (tmp_path / "x.html").read_text()
    assert "Verdict: not comparable" in page
    assert '<tr class="differs"><td>concurrency</td><td>2</td><td>4</td></tr>' in page
    assert "<tr><td>calls</td><td>3</td><td>3</td></tr>" in page


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("folder", "has no loadtest.json"),
        ("not json at all", "is not a load test report (not JSON"),
        ('{"report": "something else"}', "is not a load test report"),
        ("[1, 2]", "is not a load test report"),
        ('{"report": "codemode loadtest", "settings": {}}', "incomplete load test report"),
    ],
)
def test_inputs_that_are_not_reports_exit_4(
    runs: dict[str, Path],
    tmp_path: Path,
    content: str | None,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = tmp_path / "bad"
    if content == "folder":
        bad.mkdir()
    elif content is not None:
        bad.write_text(content)
    html = tmp_path / "out.html"
    for args in ((str(bad), str(runs["a"])), (str(runs["a"]), str(bad))):
        assert main(["loadtest", "compare", *args, "--out", str(html)]) == c.NOT_A_REPORT == 3
        out, err = capsys.readouterr()
        assert message in err and str(bad) in err and out == ""
    assert not html.exists()


def test_a_missing_report_is_not_found_and_a_missing_argument_usage(tmp_path: Path) -> None:
    done = _cli("compare", str(tmp_path / "gone"), str(tmp_path), "--out", str(tmp_path / "o"))
    assert done.returncode == c.NOT_A_REPORT == 3, done.stderr
    assert f"no load test report: {tmp_path / 'gone'} does not exist" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()
    done = _cli("compare", "only-one")
    assert done.returncode == 2 and "required: B" in done.stderr


# -- the rule, one figure at a time -----------------------------------------------------------


def _scaled(report: dict[str, Any], path: tuple[str, ...], factor: float) -> dict[str, Any]:
    out = copy.deepcopy(report)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] *= factor
    return out


def _edited(report: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(report)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("path", "factor", "verdict"),
    [
        (("throughput", "programs_per_s"), 0.6, c.WORSE_VERDICT),
        (("throughput", "programs_per_s"), 1.5, c.BETTER),
        (("throughput", "programs_per_s"), 1.1, c.SAME),
        (("latency_ms", "outer", "p50"), 1.4, c.WORSE_VERDICT),
        (("latency_ms", "outer", "p50"), 0.6, c.BETTER),
        (("latency_ms", "nested", "p99"), 1.4, c.SAME),  # a tail: within twice the band
        (("latency_ms", "nested", "p99"), 1.6, c.WORSE_VERDICT),
    ],
)
def test_the_verdict_follows_the_noise_band(
    runs: dict[str, Path], path: tuple[str, ...], factor: float, verdict: str
) -> None:
    a = _report(runs["a"])
    result = c.compare(a, _scaled(a, path, factor), BAND)
    assert result.verdict == verdict, result.reasons
    assert result.status == {c.WORSE_VERDICT: 1}.get(verdict, 0)


def test_more_errors_is_worse_even_when_faster(runs: dict[str, Path]) -> None:
    a = _report(runs["a"])
    b = _scaled(a, ("throughput", "programs_per_s"), 2.0)
    b["totals"]["programs_failed"] = 1
    result = c.compare(a, b, BAND)
    assert result.verdict == c.WORSE_VERDICT
    assert "B had more errors: 1 vs 0" in result.reasons


def test_cpu_per_call_is_judged_only_when_enough_was_measured(runs: dict[str, Path]) -> None:
    a = _edited(_report(runs["a"]), ("cpu", "measured_s"), 2.0)
    a["cpu"]["measured_per_nested_call_us"] = 1000.0
    b = _edited(a, ("cpu", "measured_per_nested_call_us"), 1500.0)
    assert c.compare(a, b, BAND).verdict == c.WORSE_VERDICT
    little = _edited(b, ("cpu", "measured_s"), 0.1)
    assert c.compare(a, little, BAND).verdict == c.SAME


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        (("environment", "machine", "cores"), 64, "machine.cores differs"),
        (("settings", "latency"), "fixed:5ms", "latency differs"),
        (("services", "max_parallel_sub_calls"), 3, "services.max_parallel_sub_calls differs"),
        (("services", "mode"), "external", "services.mode differs"),
    ],
)
def test_what_matters_makes_runs_not_comparable(
    runs: dict[str, Path], path: tuple[str, ...], value: Any, reason: str
) -> None:
    a = _report(runs["a"])
    result = c.compare(a, _edited(a, path, value), BAND)
    assert result.verdict == c.INCOMPARABLE and result.status == c.NOT_COMPARABLE
    assert any(r.startswith(reason) for r in result.reasons), result.reasons


def test_commit_and_load_may_differ_and_are_noted(runs: dict[str, Path]) -> None:
    a = _report(runs["a"])
    b = _edited(a, ("environment", "commit"), "0" * 40)
    b["environment"]["load_average_start"] = [
        a["environment"]["load_average_start"][0] * 3 + 2,
        0,
        0,
    ]
    result = c.compare(a, b, BAND)
    assert result.verdict == c.SAME
    assert any("B's machine was much busier" in note for note in result.notes)
    older = copy.deepcopy(a)
    del older["environment"], older["cpu"]  # a report from before they were recorded
    result = c.compare(older, a, BAND)
    assert result.verdict == c.SAME
    assert "a run does not record its machine: it is assumed to be the same" in result.notes


def test_the_commit_is_only_this_checkouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from codemode_cli.loadtest import environment

    outer = tmp_path / "someone-elses-project"
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    installed = outer / "venv" / "site-packages"  # this package installed inside another repo
    installed.mkdir(parents=True)
    monkeypatch.setattr(environment, "REPO_ROOT", installed.resolve())
    assert environment.commit() == {"commit": None, "dirty": None}
    monkeypatch.setattr(environment, "REPO_ROOT", tmp_path.resolve())  # no repository at all
    assert environment.commit() == {"commit": None, "dirty": None}
