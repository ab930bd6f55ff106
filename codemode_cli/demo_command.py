"""`codemode demo`: arguments and entry for the demo (the work is in codemode_cli.demo)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from codemode_cli.exit_codes import ExitCode
from codemode_cli.run_command import EXTENSIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--program", help="a program file to run instead of the built-in one")
    parser.add_argument(
        "--cordis",
        action="store_true",
        help="the dynamic Cordis demo: the agent defines, runs, updates and stops a plugin",
    )
    parser.add_argument(
        "--language",
        choices=("python", "typescript"),
        help="the agent's program language: the built-in program in it, or --program's "
        "(default: --program's extension, else python)",
    )
    parser.add_argument(
        "--model",
        choices=("scripted", "openai", "anthropic"),
        help="a model drives the agent through the client's model SDK adapters: the scripted "
        "model on loopback (offline, no key), or OpenAI / Anthropic with OPENAI_API_KEY / "
        "ANTHROPIC_API_KEY (default: the demo calls run_code itself)",
    )
    parser.add_argument(
        "--model-name",
        help="the model to ask (default: gpt-5-mini for openai, claude-sonnet-4-5 for anthropic)",
    )


def run(args: argparse.Namespace) -> int:
    if args.cordis:
        if args.model:
            print("codemode demo: --model drives the code-mode demo, not --cordis", file=sys.stderr)
            return 2
        if args.language == "typescript" or args.program:
            print(
                "codemode demo: --cordis runs its own Python programs (host halves are Python)",
                file=sys.stderr,
            )
            return ExitCode.USAGE
        from codemode_cli.demo_cordis import run_cordis_demo

        return asyncio.run(run_cordis_demo())
    if args.model:
        from codemode_cli.demo_model import missing_key

        key = missing_key(args.model)
        if key is not None:
            print(f"codemode demo: --model {args.model} needs {key} (or use --model scripted)",
                  file=sys.stderr)  # fmt: skip
            return ExitCode.USAGE
    from codemode_cli.demo import run_demo, trace_file_here  # imports grpc, both services

    program = None
    if args.program:
        try:
            with open(args.program, encoding="utf-8") as handle:
                program = handle.read()
        except OSError as exc:
            print(f"codemode demo: cannot read {args.program}: {exc}", file=sys.stderr)
            return ExitCode.USAGE
    language = args.language or EXTENSIONS.get(Path(args.program or "").suffix, "python")
    if not args.model:
        return asyncio.run(run_demo(program, language, trace_file=trace_file_here()))
    from codemode_cli.demo_model import ModelFailed

    try:
        return asyncio.run(
            run_demo(program, language, args.model, args.model_name, trace_file_here())
        )
    except ModelFailed as exc:
        print(f"codemode demo: {exc}", file=sys.stderr)
        return ExitCode.FAILED
