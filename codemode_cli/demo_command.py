"""`codemode demo`: arguments and entry for the demo (the work is in codemode_cli.demo)."""

from __future__ import annotations

import argparse
import asyncio
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--program", help="a program file to run instead of the built-in one")
    parser.add_argument(
        "--cordis",
        action="store_true",
        help="the dynamic Cordis demo: the agent defines, runs, updates and stops a plugin",
    )


def run(args: argparse.Namespace) -> int:
    if args.cordis:
        from codemode_cli.demo_cordis import run_cordis_demo

        return asyncio.run(run_cordis_demo())
    from codemode_cli.demo import run_demo  # imports grpc and both services

    program = None
    if args.program:
        try:
            with open(args.program, encoding="utf-8") as handle:
                program = handle.read()
        except OSError as exc:
            print(f"codemode demo: cannot read {args.program}: {exc}", file=sys.stderr)
            return 2
    return asyncio.run(run_demo(program))
