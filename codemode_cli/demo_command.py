"""`codemode demo`: arguments and entry for the demo (the work is in codemode_cli.demo)."""

from __future__ import annotations

import argparse
import asyncio
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--program", help="a program file to run instead of the built-in one")


def run(args: argparse.Namespace) -> int:
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
