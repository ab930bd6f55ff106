"""`codemode trace <call_id>`: arguments and entry (the work is in codemode_cli.trace)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("call_id", help="the tool call id (a nested call id works too)")
    parser.add_argument(
        "--file",
        default="var/traces.jsonl",
        help="the trace file the services write (setting trace_file; default %(default)s)",
    )
    parser.add_argument("--events", action="store_true", help="also show each span's events")


def run(args: argparse.Namespace) -> int:
    from codemode_cli.trace import run_trace

    return run_trace(args.call_id, args.file, events=args.events)
