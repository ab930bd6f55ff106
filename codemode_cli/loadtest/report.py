"""The report: one JSON document (settings, where it ran, totals, throughput, latencies, CPU,
errors, loss check, time series, histograms) and the summary table printed on stdout.

`codemode loadtest compare` reads the document back (compare.py): `report` names it and
`format` is its version, raised when a field compare reads changes meaning."""

from __future__ import annotations

from typing import Any

from codemode_cli.loadtest import stats
from codemode_cli.loadtest.driver import CANCELLED, FAILED, OK, REFUSED, Load
from codemode_cli.loadtest.workload import Spec

QUEUE_WAIT_SOURCE = (
    "nested_started.queue_wait_ms: the scheduler's own submission-to-start time in the run's "
    "queue, every nested call started"
)
FROM_PROGRAM_SOURCE = (
    "dispatch-start record time (the scheduler started the call) minus the program's own "
    "time.time() stamp at submission, completed programs; includes the runtime's relay of the "
    "binding call (worker -> runtime -> registry), same host clock"
)
NESTED_SOURCE = "nested_settled.duration_ms: scheduler start to commit (approval included)"
OUTER_SOURCE = "ExecuteToolCall(run_code) wall time at the client, completed calls"
REPORT, FORMAT = "codemode loadtest", 1


def build(
    spec: Spec,
    *,
    services: dict[str, Any],
    environment: dict[str, Any],
    cpu: dict[str, Any],
    load: Load,
    loss: dict[str, Any],
    program_waits: list[float],
    negative_waits: int,
) -> dict[str, Any]:
    outcomes = load.outcomes
    done = [o for o in outcomes if o.status in (OK, FAILED)]
    outer = [o.latency_ms for o in done]
    nested = [ms for _, ms in load.nested]
    waits = load.queue_waits
    elapsed = load.elapsed_s or 1e-9
    by_status = {
        s: sum(1 for o in outcomes if o.status == s) for s in (OK, FAILED, CANCELLED, REFUSED)
    }
    low = min([*outer, *nested, *waits], default=0.1)
    high = max([*outer, *nested, *waits], default=1.0)
    edges = stats.log_edges(low, high)
    return {
        "report": REPORT,
        "format": FORMAT,
        "settings": spec.settings(),
        "services": services,
        "environment": environment,
        "elapsed_s": round(load.elapsed_s, 3),
        "stopped_by_duration_limit": load.stopped_by_limit,
        "totals": {
            "programs_planned": spec.programs,
            "programs_submitted": len(outcomes),
            "programs_completed": by_status[OK],
            "programs_failed": by_status[FAILED],
            "programs_cancelled": by_status[CANCELLED],
            "programs_refused": by_status[REFUSED],
            "refused_with_retry_info": sum(
                1 for o in outcomes if o.status == REFUSED and o.retry_delay_s is not None
            ),
            "nested_planned": sum(len(o.plan.tools) for o in outcomes),
            "nested_made": sum(o.made or 0 for o in outcomes),
            "nested_settled": len(nested),
            "nested_failed": sum(n for (where, _), n in load.errors.items() if where == "nested"),
            "exclusive_planned": sum(o.plan.exclusive for o in outcomes),
            "approvals_planned": sum(o.plan.approvals for o in outcomes),
            "approvals_asked": sum(o.approvals for o in outcomes),
        },
        "throughput": {
            "programs_per_s": round(len(done) / elapsed, 3),
            "nested_per_s": round(len(nested) / elapsed, 3),
        },
        "latency_ms": {
            "outer": stats.summary(outer),
            "nested": stats.summary(nested),
            "nested_by_tool": {
                name: stats.summary(values) for name, values in sorted(load.nested_by_tool.items())
            },
            "queue_wait": stats.summary(waits),
            "queue_wait_from_program": stats.summary(program_waits),
        },
        "cpu": cpu,
        "latency_sources": {
            "outer": OUTER_SOURCE,
            "nested": NESTED_SOURCE,
            "queue_wait": QUEUE_WAIT_SOURCE,
            "queue_wait_from_program": FROM_PROGRAM_SOURCE,
            "queue_wait_from_program_negative_clamped": negative_waits,
        },
        "errors": [
            {"where": where, "code": code, "count": count, "example": load.examples[(where, code)]}
            for (where, code), count in load.errors.most_common()
        ],
        "program_error_examples": load.program_errors,
        "loss_check": loss,
        # Per replica, and per call (which replica, how it ended): what the caller saw.
        "by_registry": {
            address: {
                s: sum(1 for o in outcomes if o.registry == address and o.status == s)
                for s in (OK, FAILED, CANCELLED, REFUSED)
            }
            for address in dict.fromkeys(o.registry for o in outcomes)
        },
        "calls": [
            {
                "call_id": o.call_id,
                "registry": o.registry,
                "status": o.status,
                "code": o.code,
                "ended_s": round(o.ended_s, 4),
            }
            for o in outcomes
        ],
        "time_series": {
            "max_points": stats.MAX_POINTS,
            "outer": stats.sample_series([(o.ended_s, o.latency_ms) for o in done]),
            "nested": stats.sample_series(load.nested),
        },
        "histograms_ms": {
            "edges": edges,
            "outer": stats.histogram(outer, edges),
            "nested": stats.histogram(nested, edges),
            "queue_wait": stats.histogram(waits, edges),
        },
    }


def _cell(value: object) -> str:
    return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def summary_lines(report: dict[str, Any]) -> list[str]:
    totals, latency, loss = report["totals"], report["latency_ms"], report["loss_check"]
    services = report["services"]
    where = (
        f"own services, max {services['max_parallel_sub_calls']} parallel per run"
        if services["mode"] == "started"
        else f"registry {', '.join(services['registries'])}"
    )
    lines = [
        f"codemode loadtest: {totals['programs_completed']}/{totals['programs_planned']} programs, "
        f"{totals['nested_settled']} nested calls in {report['elapsed_s']:.2f} s ({where})",
        settings_line(report),
    ]
    if report["stopped_by_duration_limit"]:
        lines.append(
            f"  stopped at the duration limit: {totals['programs_cancelled']} in flight cancelled, "
            f"{totals['programs_planned'] - totals['programs_submitted']} never submitted"
        )
    header = f"  {'latency (ms)':<26}{'count':>8}{'p50':>10}{'p95':>10}{'p99':>10}{'max':>10}"
    lines.append(header)
    rows = [("outer run_code", latency["outer"]), ("nested start→commit", latency["nested"])]
    rows += [(f"  {name}", s) for name, s in latency["nested_by_tool"].items()]
    rows.append(("queue wait (scheduler)", latency["queue_wait"]))
    rows.append(("  from program, +relay", latency["queue_wait_from_program"]))
    for label, s in rows:
        cells = "".join(f"{_cell(s[k]):>10}" for k in ("p50", "p95", "p99", "max"))
        lines.append(f"  {label:<26}{s['count']:>8}{cells}")
    throughput = report["throughput"]
    lines.append(
        f"  throughput: {throughput['programs_per_s']:.1f} programs/s, "
        f"{throughput['nested_per_s']:.1f} nested calls/s"
    )
    cpu = report.get("cpu")
    if cpu is not None:
        lines.append(
            f"  CPU per nested call: {_cell(cpu['measured_per_nested_call_us'])} µs driver + "
            f"services, {_cell(cpu['machine_per_nested_call_us'])} µs whole machine"
        )
    lines.append(
        f"  approvals: {totals['approvals_asked']} asked, {totals['approvals_planned']} planned; "
        f"exclusive calls planned: {totals['exclusive_planned']}"
    )
    if totals["programs_refused"]:
        lines.append(
            f"  refused by admission control: {totals['programs_refused']} "
            f"(RESOURCE_EXHAUSTED, {totals['refused_with_retry_info']} with RetryInfo)"
        )
    errors = report["errors"]
    if errors:
        listed = ", ".join(f"{e['where']} {e['code']} x{e['count']}" for e in errors)
        lines.append(f"  errors: {listed}")
    else:
        lines.append("  errors: none")
    verdict = "nothing lost" if loss["lost"] == 0 and loss["extra"] == 0 else "MISMATCH"
    lines.append(
        f"  loss check ({loss['checked_programs']} programs): {loss['made']} made, "
        f"{loss['settled_events']} settled events, {loss['start_records']} start records, "
        f"{loss['settle_records']} settle records: {verdict}"
        + (f" (lost {loss['lost']}, extra {loss['extra']})" if verdict != "nothing lost" else "")
    )
    if loss["unresolved_programs"]:
        lines.append(
            f"  {loss['unresolved_programs']} unfinished programs had not reached quiescence "
            "in time and were not checked"
        )
    return lines


def _load(values: list[float] | None) -> str:
    """A load average (1, 5, 15 minutes) as `1.2/0.8/0.5`."""
    return "unknown" if not values else "/".join(f"{v:g}" for v in values)


def settings_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """What the run was and where it ran, as (name, value) rows for the page and the summary."""
    rows = [(name, str(value)) for name, value in report["settings"].items()]
    services = report["services"]
    rows.append(("services", services["mode"]))
    for key in ("max_parallel_sub_calls", "runtime_pool_size", "admission_limit"):
        if services.get(key) is not None:
            rows.append((key, str(services[key])))
    rows.append(("registries", str(len(services["registries"]))))
    env = report.get("environment") or {}
    machine = env.get("machine") or {}
    head = env.get("commit")
    dirty = " (uncommitted changes)" if env.get("dirty") else ""
    rows.append(("commit", f"{head}{dirty}" if head else "unknown"))
    memory = machine.get("memory_bytes")
    rows += [
        ("cores", str(machine.get("cores", "unknown"))),
        ("cpu_model", str(machine.get("cpu_model") or "unknown")),
        ("memory", "unknown" if memory is None else f"{memory / 2**30:.1f} GiB"),
        ("system", str(machine.get("system", "unknown"))),
        ("started_at", str(env.get("started_at", "unknown"))),
        ("load_average_start", _load(env.get("load_average_start"))),
        ("load_average_end", _load(env.get("load_average_end"))),
    ]
    return rows


def settings_line(report: dict[str, Any]) -> str:
    s = report["settings"]
    env = report.get("environment") or {}
    machine = env.get("machine") or {}
    head = (env.get("commit") or "unknown")[:12]
    return (
        f"  settings: {s['programs']} programs, concurrency {s['concurrency']}, {s['calls']} calls "
        f"(fanout {s['fanout']}), latency {s['latency']}, seed {s['seed']}; commit {head}"
        + ("+" if env.get("dirty") else "")
        + f"; {machine.get('cores', '?')} cores; load average "
        f"{_load(env.get('load_average_start'))} -> {_load(env.get('load_average_end'))}"
    )
