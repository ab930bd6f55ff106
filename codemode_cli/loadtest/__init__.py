"""`codemode loadtest`: a load generator for the per-run scheduler.

Runs `--programs` run_code programs, `--concurrency` at a time, each making `--calls` nested
calls to load tools whose bodies sleep per `--latency`; reports throughput, latency percentiles
(outer, nested, queue wait), CPU, errors and a loss check, and writes loadtest.json and
loadtest.html, both with the settings and the machine they ran on. `codemode loadtest compare
A B` puts two reports side by side with a verdict. Modules: workload (flags, plans, programs),
services and peer (processes), driver (the load phase), losscheck (history), environment
(commit, machine, load, CPU), stats, report, plot, runner (all of it in order), compare.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from codemode_cli import output_dir
from codemode_cli.exit_codes import ExitCode
from codemode_cli.loadtest import workload as w

EPILOG = """\
examples:
  codemode loadtest --programs 500 --concurrency 20 --calls 10
  codemode loadtest --exclusive-share 0.3 --approval-share 0.2 --latency uniform:1ms-20ms
  codemode loadtest --registry 127.0.0.1:50051 --duration-limit 60
  codemode loadtest --registry 127.0.0.1:50051,127.0.0.1:50052   # replicas on one store
  codemode loadtest compare var/before var/after   # two reports side by side, and a verdict

By default the runtime, a registry (SQLite history in a temporary directory, tracing off) and
a load peer (tool provider + auto-approver) start on 127.0.0.1. With --registry the load goes
to an existing loopback registry; its agents are untouched (the load agent and its tools are
created for the run and deleted after), and --approval-share needs its policy rules to ask for
`work_*_approve`. Several --registry addresses (repeated, or a comma list) are replicas
sharing one store: the agent is created on the first and awaited on the others, the peer
serves every one, programs are spread over them, and a program that fails as UNAVAILABLE (a
replica gone) moves its worker to the next replica for the programs after it (the failed one
is reported, not retried). Exit status: 0 when every call succeeded and nothing was lost, 1
otherwise (the summary says why), 2 for bad flags.
"""


# Repeats on a shared 2-core machine move by about this much (docs/benchmarks.md).
COMPARE_THRESHOLD = 0.25
COMPARE_EPILOG = """\
A and B are report folders (a load test's --out) or their loadtest.json files. Comparable runs
have the same workload settings, services and machine (cores, CPU model); the commit and the
load average may differ. B is worse with more errors, or a figure worse beyond the noise band
(--threshold for throughput, p50 and CPU per call; twice it for p95 and p99); better with
nothing worse and a figure better beyond its band; otherwise the same within noise.
Exit status: 0 same or better, 1 worse, 2 bad flags, 3 not comparable (settings differ),
4 an input is missing or not a load test report.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    # The compare action is optional: without it the flags run a load test.
    parser.usage = (
        "%(prog)s [options]\n       %(prog)s compare [-h] [--out FILE] [--threshold F] A B"
    )
    add = parser.add_argument
    add(
        "--programs",
        type=w.int_in(1, w.MAX_PROGRAMS),
        default=200,
        metavar="N",
        help=f"outer run_code calls in total (1..{w.MAX_PROGRAMS}; default 200)",
    )
    add(
        "--concurrency",
        type=w.int_in(1, w.MAX_CONCURRENCY),
        default=10,
        metavar="C",
        help=f"outer calls in flight at once (1..{w.MAX_CONCURRENCY}; default 10)",
    )
    add(
        "--calls",
        type=w.int_in(0, w.MAX_CALLS),
        default=10,
        metavar="K",
        help=f"nested calls per program (0..{w.MAX_CALLS}; default 10)",
    )
    add(
        "--fanout",
        type=w.int_in(1, w.MAX_FANOUT),
        default=10,
        metavar="F",
        help="nested calls a program keeps in flight at once, under asyncio.gather "
        f"(1..{w.MAX_FANOUT}; default 10)",
    )
    add(
        "--exclusive-share",
        type=w.share,
        default=0.1,
        metavar="F",
        help="fraction of nested calls to the exclusive (not concurrency-safe) tool "
        "(0..1; default 0.1)",
    )
    add(
        "--approval-share",
        type=w.share,
        default=0.0,
        metavar="F",
        help="fraction of nested calls that need approval, auto-approved (0..1; default 0)",
    )
    add(
        "--latency",
        type=w.latency_arg,
        default=w.parse_latency("fixed:5ms"),
        metavar="DIST",
        help="tool body latency: fixed:5ms, uniform:1ms-20ms or exp:10ms (exponential mean, "
        f"cut at {w.EXP_TRUNCATION:g}x); units us, ms, s; default fixed:5ms",
    )
    add(
        "--duration-limit",
        type=w.seconds,
        default=300.0,
        metavar="S",
        help="hard bound on the load phase: then nothing new starts and calls in flight are "
        "cancelled (0 < S <= 3600; default 300)",
    )
    add(
        "--seed",
        type=w.int_in(0, 2**31 - 1),
        default=1,
        help="seed of the workload plan (tools and latencies per call; default 1)",
    )
    add(
        "--registry",
        type=w.loopback_list_arg,
        action="append",
        metavar="HOST:PORT[,...]",
        help="use this registry (loopback only) instead of starting services; repeat it, or "
        "give a comma list, for replicas sharing one store",
    )
    add(
        "--max-parallel",
        type=w.int_in(1, 1000),
        metavar="N",
        help="max parallel nested calls per run of the started registry (default 10)",
    )
    add(
        "--admission-limit",
        type=w.int_in(1, w.MAX_CONCURRENCY),
        metavar="N",
        help="start the registry with at most N concurrent run_code runs per agent, so that a "
        "--concurrency above N exceeds it: refused calls (RESOURCE_EXHAUSTED) are reported "
        "and checked to have left no history record",
    )
    add(
        "--trace-file",
        metavar="PATH",
        help="let the started services write spans to PATH (default: tracing off)",
    )
    add(
        "--out",
        type=Path,
        default=Path("var/loadtest"),
        metavar="DIR",
        help="where loadtest.json and loadtest.html go (default var/loadtest)",
    )
    add("--quiet", action="store_true", help="no progress line on stderr")
    actions = parser.add_subparsers(dest="action", metavar="compare", required=False)
    compare = actions.add_parser(
        "compare",
        help="two reports side by side with a verdict (codemode loadtest compare --help)",
        description="Two load test reports side by side: the differences that matter and a "
        "verdict on B against A (better, worse, same within noise, or not comparable when "
        "their settings differ).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=COMPARE_EPILOG,
    )
    compare.add_argument(
        "a", type=Path, metavar="A", help="the first run: its --out folder or its loadtest.json"
    )
    compare.add_argument("b", type=Path, metavar="B", help="the second run, judged against A")
    compare.add_argument(
        "--out",
        type=Path,
        default=Path("var/loadtest/compare.html"),
        metavar="FILE",
        help="where the HTML side by side goes (default var/loadtest/compare.html)",
    )
    compare.add_argument(
        "--threshold",
        type=w.share,
        default=COMPARE_THRESHOLD,
        metavar="F",
        help="the noise band for throughput, p50 and CPU per call, as a fraction (tails get "
        f"twice it; 0..1; default {COMPARE_THRESHOLD:g})",
    )


def _compare(args: argparse.Namespace) -> int:
    from codemode_cli.loadtest import compare

    try:
        (file_a, a), (file_b, b) = compare.load(args.a), compare.load(args.b)
    except compare.ReportError as exc:
        print(f"codemode loadtest compare: {exc}", file=sys.stderr)
        return compare.NOT_A_REPORT
    result = compare.compare(a, b, args.threshold)
    names = (str(file_a), str(file_b))
    print("\n".join(compare.lines(result, names)))
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(compare.page(result, names))
    except OSError as exc:
        print(f"codemode loadtest compare: cannot write {args.out}: {exc}", file=sys.stderr)
        return compare.USAGE
    print(f"wrote {args.out}")
    return result.status


def _usage(message: str) -> int:
    print(f"codemode loadtest: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) == "compare":
        return _compare(args)
    created: list[Path] = []  # the --out folders this run made: taken back if left empty
    try:
        return _run(args, created)
    finally:
        output_dir.remove_if_empty(created)


def _run(args: argparse.Namespace, created: list[Path]) -> int:
    registries = tuple(dict.fromkeys(a for group in args.registry or () for a in group))
    nested = args.programs * args.calls
    if nested > w.MAX_NESTED_TOTAL:
        return _usage(
            f"--programs x --calls is {nested}; at most {w.MAX_NESTED_TOTAL} nested calls per run"
        )
    if registries and (
        args.max_parallel is not None or args.trace_file or args.admission_limit is not None
    ):
        return _usage(
            "--max-parallel, --trace-file and --admission-limit apply only to services the "
            "load test starts"
        )
    try:
        created.extend(output_dir.create(args.out))
        probe = args.out / ".loadtest-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return _usage(f"--out {args.out} is not a writable directory: {exc}")
    spec = w.Spec(
        programs=args.programs,
        concurrency=args.concurrency,
        calls=args.calls,
        fanout=args.fanout,
        exclusive_share=args.exclusive_share,
        approval_share=args.approval_share,
        latency=args.latency,
        duration_limit=args.duration_limit,
        seed=args.seed,
    )
    # grpc and the stubs are imported only once the flags are valid
    import grpc

    from codemode_cli.loadtest import runner
    from codemode_cli.loadtest.driver import SetupError
    from codemode_cli.loadtest.services import StartError

    options = runner.Options(
        registries=registries,
        max_parallel=args.max_parallel or 10,
        trace_file=str(Path(args.trace_file).resolve()) if args.trace_file else "off",
        out=args.out,
        quiet=args.quiet,
        admission_limit=args.admission_limit,
    )
    try:
        return asyncio.run(runner.execute(spec, options))
    except KeyboardInterrupt:
        print("\ncodemode loadtest: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except (SetupError, StartError, grpc.aio.AioRpcError) as exc:
        return runner.report_failure(exc)
