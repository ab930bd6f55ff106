"""A registry replica that dies mid-load: two registries and two runtimes (real processes) on
one real PostgreSQL on loopback, `codemode loadtest` pointed at both registries (its peer serves
both through ReplicaSet), and one registry SIGKILLed while programs run on it.

What must hold: the calls in flight on the killed replica end for their callers with a
canonical code (UNAVAILABLE), none hangs; the load goes on, on the other replica, to the end;
nothing is recorded twice (per agent id the history seqs are 1..n, each call id has one record
of each kind); nothing committed is lost (every call the client saw succeed has its records);
the killed replica's open calls are closed as interrupted by the survivor once its writer
lease expired, so the loss check balances every start record with a settle record."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from codemode_cli.processes import running

PROGRAMS = 400
RESULTS_BEFORE_KILL = 30  # outer results committed: the load runs on both replicas
_HANG_S = 600  # bounds a hang of the whole load test, not a duration
LEASE_S = 2  # the killed registry's open calls are closed this soon after its death


def _rows(dsn: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.encode(), params).fetchall()


async def _latch(dsn: str, sql: str, until: Any, *params: object) -> list[tuple[Any, ...]]:
    """Polls `sql` until `until(rows)` holds (a latch; bounded by a generous count)."""
    rows: list[tuple[Any, ...]] = []
    for _ in range(3000):
        rows = await asyncio.to_thread(_rows, dsn, sql, *params)
        if until(rows):
            return rows
        await asyncio.sleep(0.1)
    raise AssertionError(f"never held: {sql} -> {rows}")


async def test_a_registry_killed_mid_load_loses_nothing_and_records_nothing_twice(
    tmp_path: Path, pg_database: str
) -> None:
    base = {**os.environ, "PYTHONUNBUFFERED": "1"}
    async with contextlib.AsyncExitStack() as stack:
        runtimes = [
            await stack.enter_async_context(
                running(
                    "-m", "runtime_service", "--listen", "127.0.0.1:0",
                    ready="runtime listening on port ",
                    env={**base, "CODEMODE_RUNTIME_TRACE_FILE": "off"},
                    stderr=tmp_path / f"runtime-{n}.stderr",
                )
            )
            for n in range(2)
        ]  # fmt: skip
        registry_env = {
            **base,
            "CODEMODE_REGISTRY_HISTORY_STORE": "postgres",
            "CODEMODE_REGISTRY_HISTORY_DSN": pg_database,
            "CODEMODE_REGISTRY_HISTORY_WRITER_LEASE_S": str(LEASE_S),
            "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps(
                [f"127.0.0.1:{r.rest}" for r in runtimes]
            ),
            "CODEMODE_REGISTRY_TRACE_FILE": "off",
        }
        registries = [
            await stack.enter_async_context(
                running(
                    "-m", "registry_service", "--listen", "127.0.0.1:0",
                    ready="registry listening on port ",
                    env=registry_env,
                    stderr=tmp_path / f"registry-{n}.stderr",
                )
            )
            for n in range(2)
        ]  # fmt: skip
        victim, survivor = (f"127.0.0.1:{r.rest}" for r in registries)
        out = tmp_path / "report"
        load = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "codemode_cli", "loadtest",
            "--registry", f"{victim},{survivor}",
            "--programs", str(PROGRAMS), "--concurrency", "8", "--calls", "5",
            "--latency", "fixed:20ms", "--exclusive-share", "0.2",
            "--out", str(out), "--quiet",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=base,
        )  # fmt: skip
        try:
            await _latch(
                pg_database,
                "SELECT count(*) FROM history_records WHERE kind = 'tool/result'"
                " AND call_id LIKE 'lt-%%'",
                lambda rows: rows[0][0] >= RESULTS_BEFORE_KILL,
            )
            registries[0].proc.send_signal(signal.SIGKILL)
            stdout, stderr = await asyncio.wait_for(load.communicate(), _HANG_S)
        finally:
            if load.returncode is None:
                load.kill()
                await load.wait()
    print(stdout.decode())
    assert load.returncode == 1, stderr.decode()  # the killed replica's calls failed
    report = json.loads((out / "loadtest.json").read_text())
    calls = report["calls"]

    # Every program ended, none by the duration limit: nothing hung.
    assert not report["stopped_by_duration_limit"]
    assert len(calls) == PROGRAMS
    assert Counter(c["status"] for c in calls).keys() <= {"ok", "failed"}
    # The killed replica's calls in flight failed with a canonical code; nothing else failed.
    failed = [c for c in calls if c["status"] == "failed"]
    assert failed, "no call was in flight on the killed replica"
    assert {c["registry"] for c in failed} == {victim}
    assert {c["code"] for c in failed} == {"rpc:UNAVAILABLE"}, failed[:3]
    # The survivor served everything after that, to the end.
    by = report["by_registry"]
    assert by[survivor]["failed"] == 0 and by[survivor]["ok"] > by[victim]["ok"]
    assert max(calls, key=lambda c: c["ended_s"])["registry"] == survivor
    # The load test's own check: per program, start records == settle records (== made).
    loss = report["loss_check"]
    assert loss["lost"] == 0 and loss["extra"] == 0, loss["mismatches"]
    assert loss["unresolved_programs"] == 0 and loss["checked_programs"] == PROGRAMS

    agent = report["services"]["agent"]
    # Nothing left open: the survivor closed the killed replica's calls once its lease expired.
    await _latch(
        pg_database,
        "SELECT count(*) FROM history_open_calls o JOIN history_records r"
        " ON r.agent_id = o.agent_id AND r.seq = o.seq WHERE r.agent = %s",
        lambda rows: rows[0][0] == 0,
        agent,
    )
    records = _rows(
        pg_database,
        "SELECT agent_id, seq, kind, call_id, is_error, error_code FROM history_records"
        " WHERE agent = %s ORDER BY agent_id, seq",
        agent,
    )
    # Nothing recorded twice: one agent id, seqs 1..n without a gap, one record per kind and
    # call id.
    assert {r[0] for r in records} and len({r[0] for r in records}) == 1
    assert [r[1] for r in records] == list(range(1, len(records) + 1))
    twice = [key for key, n in Counter((r[2], r[3]) for r in records).items() if n > 1]
    assert twice == []
    # Nothing committed lost: every call the client saw succeed has its call and its result.
    results = {r[3]: r for r in records if r[2] == "tool/result"}
    started = {r[3] for r in records if r[2] == "tool/call"}
    for call in calls:
        if call["status"] == "ok":
            assert call["call_id"] in started and not results[call["call_id"]][4], call
        elif call["call_id"] in started:  # ended: interrupted by the sweep, or by the victim
            assert call["call_id"] in results, call
        else:  # sent to the victim once it was gone: nothing of it was recorded
            assert call["call_id"] not in results, call
    interrupted = [r for r in results.values() if r[5] == "INTERRUPTED"]
    print(
        f"killed mid-load: {len(failed)} calls failed UNAVAILABLE on the killed replica "
        f"({loss['never_recorded_programs']} of them sent after its death, never recorded), "
        f"{by[survivor]['ok']} served by the survivor, {len(interrupted)} closed as interrupted"
    )
