"""Command-line entry point: `codemode <command>`."""

from __future__ import annotations

import argparse
import asyncio
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="codemode",
        description="Governed code-mode tool orchestration: registry + runtime over gRPC.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="start both services and a demo tool provider, run a real program in code mode, "
        "print its nested trajectory",
    )
    demo.add_argument("--program", help="a program file to run instead of the built-in one")
    trace = commands.add_parser(
        "trace",
        help="print one tool call's span tree (nested calls, the runtime's run, providers) "
        "from the local JSON-lines trace file",
    )
    trace.add_argument("call_id", help="the tool call id (a nested call id works too)")
    trace.add_argument(
        "--file",
        default="var/traces.jsonl",
        help="the trace file the services write (setting trace_file; default %(default)s)",
    )
    trace.add_argument("--events", action="store_true", help="also show each span's events")
    args = parser.parse_args(argv)
    if args.command == "trace":
        from codemode_cli.trace import run_trace

        return run_trace(args.call_id, args.file, events=args.events)
    if args.command == "demo":
        from codemode_cli.demo import run_demo

        program = None
        if args.program:
            try:
                with open(args.program, encoding="utf-8") as handle:
                    program = handle.read()
            except OSError as exc:
                print(f"codemode demo: cannot read {args.program}: {exc}", file=sys.stderr)
                return 2
        return asyncio.run(run_demo(program))
    parser.error(f"unknown command {args.command}")
    return 2
