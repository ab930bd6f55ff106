"""`codemode loadtest`: real runs over loopback (own services), flag validation, and the
pieces that compute the numbers (latency parsing, plans, percentiles, the loss check)."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from codemode_cli import loadtest
from codemode_cli.loadtest import losscheck, plot, stats
from codemode_cli.loadtest import workload as w
from codemode_cli.loadtest.driver import CANCELLED, FAILED, OK, Outcome


def _cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "codemode_cli", "loadtest", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )


def _ordered(summary: dict[str, Any]) -> bool:
    return bool(summary["min"] <= summary["p50"] <= summary["p95"] <= summary["p99"])


# -- end to end -----------------------------------------------------------------------------


def test_a_mixed_load_is_measured_and_nothing_is_lost(tmp_path: Path) -> None:
    done = _cli(
        "--programs", "20", "--concurrency", "5", "--calls", "5",
        "--exclusive-share", "0.3", "--approval-share", "0.2",
        "--latency", "uniform:1ms-5ms", "--out", str(tmp_path), "--quiet",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "loadtest:" not in done.stderr  # --quiet: no progress line
    assert "nothing lost" in done.stdout and "errors: none" in done.stdout
    report = json.loads((tmp_path / "loadtest.json").read_text())
    totals = report["totals"]
    assert totals["programs_completed"] == 20 and totals["programs_cancelled"] == 0
    assert totals["nested_made"] == totals["nested_settled"] == 100
    assert totals["exclusive_planned"] == 30 and totals["approvals_planned"] == 20
    assert totals["approvals_asked"] == 20  # every approval went through the approver
    loss = report["loss_check"]
    assert loss["lost"] == 0 and loss["extra"] == 0 and loss["mismatches"] == []
    assert loss["start_records"] == loss["settle_records"] == loss["settled_events"] == 100
    assert report["errors"] == []
    latency = report["latency_ms"]
    assert latency["outer"]["count"] == 20 and latency["nested"]["count"] == 100
    # Queue wait: the scheduler's exact figure for every nested call, and the one seen from the
    # program (relay included) for the dispatch-start records of completed programs.
    assert latency["queue_wait"]["count"] == latency["queue_wait_from_program"]["count"] == 100
    kinds = ("outer", "nested", "queue_wait", "queue_wait_from_program")
    assert all(_ordered(latency[k]) for k in kinds)
    assert latency["queue_wait"]["min"] >= 0
    # Per call the program submits before the scheduler does, so its figure is never smaller.
    assert latency["queue_wait_from_program"]["p50"] >= latency["queue_wait"]["p50"]
    assert "queue wait (scheduler)" in done.stdout and "from program" in done.stdout
    # Bodies sleep 1-5 ms, so nothing settles faster than 1 ms; outer calls wrap nested ones.
    assert latency["nested"]["min"] >= 1.0
    assert latency["outer"]["p50"] >= latency["nested"]["p50"]
    assert set(latency["nested_by_tool"]) == set(w.TOOLS)
    assert report["throughput"]["programs_per_s"] > 0
    assert len(report["time_series"]["nested"]) == 100
    assert sum(report["histograms_ms"]["nested"]) == 100
    assert report["services"]["mode"] == "started"
    assert report["services"]["trace_file"] == "off"
    page = (tmp_path / "loadtest.html").read_text()
    assert "<svg" in page and page.count("<circle") == 120
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert "<script" not in page and "@import" not in page


def test_exceeding_the_admission_limit_reports_every_refused_call(tmp_path: Path) -> None:
    # 6 programs at once against 2 runs per agent; each holds its slot for >= 2 x 200 ms, so
    # the first wave alone is refused 4 times (refusals answer at once, and are retried by
    # nobody: every one is reported).
    done = _cli(
        "--programs", "12", "--concurrency", "6", "--calls", "2", "--fanout", "1",
        "--latency", "fixed:200ms", "--admission-limit", "2", "--out", str(tmp_path), "--quiet",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "loadtest.json").read_text())
    totals = report["totals"]
    assert totals["programs_refused"] >= 1, totals
    assert totals["programs_completed"] + totals["programs_refused"] == 12, totals
    assert totals["refused_with_retry_info"] == totals["programs_refused"]
    loss = report["loss_check"]
    assert loss["refused_programs"] == totals["programs_refused"]
    assert loss["lost"] == 0 and loss["extra"] == 0, loss  # no refused call left a record
    assert report["errors"] == []
    assert report["services"]["admission_limit"] == 2
    assert "refused by admission control" in done.stdout


def test_the_duration_limit_bounds_the_run(tmp_path: Path) -> None:
    began = time.monotonic()
    done = _cli(
        "--programs", "100000", "--concurrency", "4", "--calls", "3",
        "--latency", "fixed:20ms", "--duration-limit", "1.5", "--out", str(tmp_path), "--quiet",
    )  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert "stopped at the duration limit" in done.stdout
    report = json.loads((tmp_path / "loadtest.json").read_text())
    assert report["stopped_by_duration_limit"] is True
    # Stopped by the limit, not by running out of programs (100,000 would take minutes).
    assert report["elapsed_s"] < 1.5 + 30
    totals = report["totals"]
    assert 0 < totals["programs_submitted"] < 100000
    assert (
        totals["programs_completed"] + totals["programs_cancelled"] == totals["programs_submitted"]
    )
    # Calls cancelled at the limit still settle every nested call they started.
    assert report["loss_check"]["lost"] == 0 and report["loss_check"]["extra"] == 0
    assert took < 60  # set-up and the history check are bounded too


def test_bad_flags_exit_2_with_a_message(tmp_path: Path) -> None:
    done = _cli("--latency", "uniform:9ms-2ms", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "--latency" in done.stderr and "lower bound is above the upper bound" in done.stderr
    done = _cli("--registry", "192.0.2.7:50051", "--out", str(tmp_path))
    assert done.returncode == 2 and "not a loopback address" in done.stderr
    assert not (tmp_path / "loadtest.json").exists()


# -- flags ----------------------------------------------------------------------------------


def _parse(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="codemode loadtest")
    loadtest.add_arguments(parser)
    return parser.parse_args(list(args))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--programs", "0"], "out of range (1..100000)"),
        (["--programs", "ten"], "is not an integer"),
        (["--concurrency", "1001"], "out of range (1..1000)"),
        (["--calls", "1001"], "out of range (0..1000)"),
        (["--fanout", "257"], "out of range (1..256)"),
        (["--exclusive-share", "1.5"], "not a fraction between 0 and 1"),
        (["--approval-share", "nan"], "not a fraction between 0 and 1"),
        (["--duration-limit", "0"], "out of range (0 < seconds <= 3600)"),
        (["--duration-limit", "inf"], "out of range"),
        (["--latency", "gauss:3ms"], "expected fixed:5ms, uniform:1ms-20ms or exp:10ms"),
        (["--latency", "fixed:5"], "not a duration"),
        (["--latency", "fixed:2min"], "not a duration"),
        (["--latency", "exp:0ms"], "mean must be positive"),
        (["--latency", "fixed:61s"], "above 60s"),
        (["--registry", "10.1.2.3:50051"], "not a loopback address"),
        (["--registry", "registry.example.com:443"], "not a loopback address"),
        (["--registry", "127.0.0.1"], "expected HOST:PORT"),
        (["--registry", "127.0.0.1:70000"], "expected HOST:PORT"),
    ],
)
def test_flag_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parse(*args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "address", ["127.0.0.1:1", "127.8.9.10:50051", "[::1]:50051", "localhost:9"]
)
def test_loopback_registries_are_accepted(address: str) -> None:
    assert _parse("--registry", address).registry == [[address]]


def test_several_registries_are_repeated_flags_or_a_comma_list() -> None:
    args = _parse("--registry", "127.0.0.1:1,[::1]:2", "--registry", "localhost:3")
    assert args.registry == [["127.0.0.1:1", "[::1]:2"], ["localhost:3"]]


@pytest.mark.parametrize(
    ("value", "message"),
    [("127.0.0.1:1,10.0.0.1:2", "not a loopback address"), ("127.0.0.1:1,", "an empty address")],
)
def test_every_registry_of_a_list_is_checked(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parse("--registry", value)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--programs", "2000", "--calls", "1000"], "at most 1000000 nested calls"),
        (["--registry", "127.0.0.1:1", "--max-parallel", "4"], "only to services"),
        (["--registry", "127.0.0.1:1", "--trace-file", "t.jsonl"], "only to services"),
        (["--registry", "127.0.0.1:1", "--admission-limit", "2"], "only to services"),
    ],
)
def test_combinations_refused_before_anything_starts(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert loadtest.run(_parse(*args, "--out", str(tmp_path))) == 2
    assert message in capsys.readouterr().err


def test_an_unwritable_out_dir_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert loadtest.run(_parse("--out", str(blocker / "sub"))) == 2
    assert "not a writable directory" in capsys.readouterr().err


# -- the numbers ----------------------------------------------------------------------------


def test_latency_distributions() -> None:
    rng = random.Random(3)
    assert w.parse_duration("250us") == pytest.approx(250e-6)
    assert w.parse_duration(" 1.5s ") == 1.5
    fixed = w.parse_latency("fixed:5ms")
    assert fixed.sample(rng) == pytest.approx(0.005) and fixed.describe() == "fixed:5ms"
    uniform = w.parse_latency("uniform:1ms-20ms")
    assert all(0.001 <= uniform.sample(rng) <= 0.02 for _ in range(1000))
    assert uniform.describe() == "uniform:1ms-20ms"
    exp = w.parse_latency("EXP:10ms")
    samples = [exp.sample(rng) for _ in range(20000)]
    assert max(samples) <= 0.01 * w.EXP_TRUNCATION
    assert sum(samples) / len(samples) == pytest.approx(0.01, rel=0.05)


def test_plans_hit_the_shares_exactly_and_are_reproducible() -> None:
    spec = w.Spec(
        programs=37, concurrency=1, calls=7, fanout=3, exclusive_share=0.3,
        approval_share=0.15, latency=w.parse_latency("uniform:1ms-2ms"),
        duration_limit=10, seed=5,
    )  # fmt: skip
    plans = [w.plan(spec, i) for i in range(spec.programs)]
    assert sum(p.exclusive for p in plans) == int(37 * 7 * 0.3)
    assert sum(p.approvals for p in plans) == int(37 * 7 * 0.15)
    assert w.plan(spec, 11) == plans[11]
    assert all(1.0 <= ms <= 2.0 for p in plans for ms in p.sleep_ms)
    from runtime_service.worker.core import compile_program

    compile_program(w.program(spec, plans[0]))  # the program is valid as the worker runs it


def test_percentiles_and_summaries() -> None:
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 50) == pytest.approx(50.5)
    assert stats.percentile(values, 99) == pytest.approx(99.01)
    assert stats.percentile([7.0], 95) == 7.0
    summary = stats.summary(list(reversed(values)))
    assert (summary["count"], summary["min"], summary["max"]) == (100, 1.0, 100.0)
    assert _ordered(summary)
    assert stats.summary([])["p50"] is None
    with pytest.raises(ValueError, match="no values"):
        stats.percentile([], 50)


def test_histogram_and_series_are_bounded() -> None:
    edges = stats.log_edges(0.5, 500.0, bins=30)
    assert len(edges) == 31 and edges[0] == 0.5 and edges[-1] == pytest.approx(500)
    counts = stats.histogram([0.1, 1.0, 10.0, 100.0, 1e6], edges)
    assert sum(counts) == 5 and counts[0] >= 1 and counts[-1] == 1
    series = stats.sample_series([(float(t), 1.0) for t in range(10_000)], limit=500)
    assert len(series) == 500 and series[-1][0] == 9999.0


def _outcome(status: str, made: int | None, events: int) -> Outcome:
    plan = w.Plan(0, (w.SAFE,) * 3, (1.0,) * 3)
    return Outcome(plan, "lt-0", status=status, made=made, nested_settled=events)


def test_the_loss_check_flags_every_kind_of_mismatch() -> None:
    def tally(starts: int, settles: int, result: bool = True) -> losscheck.Tally:
        return losscheck.Tally(
            start_records=starts,
            settle_records=settles,
            has_result=result,
            records=starts + settles + result + 1,  # and the outer call record
        )

    cases = [
        (_outcome(OK, 3, 3), tally(3, 3), 0, 0),
        (_outcome(OK, 3, 3), tally(3, 2), 1, 0),  # a settle record missing
        (_outcome(OK, 3, 2), tally(3, 3), 1, 0),  # a settled event missing
        (_outcome(OK, 2, 2), tally(2, 3), 0, 1),  # a settle record too many
        (_outcome(CANCELLED, None, 1), tally(2, 2), 0, 0),  # cancelled: records vs records
        (_outcome(CANCELLED, None, 1), tally(2, 1), 1, 0),
    ]
    for outcome, counts, lost, extra in cases:
        result = losscheck.check([outcome], {"lt-0": counts})
        assert (result["lost"], result["extra"]) == (lost, extra), (outcome, counts)
        assert len(result["mismatches"]) == (1 if lost or extra else 0)
    unresolved = losscheck.check([_outcome(CANCELLED, None, 0)], {"lt-0": tally(1, 0, False)})
    assert unresolved["unresolved_programs"] == 1 and unresolved["lost"] == 0
    # Failed before anything was recorded (sent to a replica already gone): checked, balanced.
    never = losscheck.check([_outcome(FAILED, None, 0)], {"lt-0": losscheck.Tally()})
    assert (never["never_recorded_programs"], never["checked_programs"]) == (1, 1)
    assert (never["unresolved_programs"], never["lost"], never["extra"]) == (0, 0, 0)


def test_the_page_copes_with_no_data() -> None:
    empty = {"outer": [], "nested": [], "max_points": 10}
    hist = {"edges": [1.0, 2.0], "outer": [0], "nested": [0], "queue_wait": [0]}
    page = plot.page({"time_series": empty, "histograms_ms": hist}, ["nothing ran"])
    assert "No completed calls to plot" in page and "nothing ran" in page
