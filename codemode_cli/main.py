"""Command-line entry point: `codemode <command>`.

Each command lives in its own module that provides ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status, from codemode_cli/exit_codes.py); modules are imported
only when their command runs, except for building the parser, so `codemode --help` stays fast.
What every command shares (Ctrl-C, a closed stdout, the log level, the environment check) is
handled here, in `codemode_cli.process`.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Protocol, cast

from codemode_cli import process


class Command(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# name -> (module, one-line help). Order is the order `--help` lists them in.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "codemode_cli.demo_command",
        "start both services and a demo tool provider, run a real program in code mode, "
        "print its nested trajectory",
    ),
    "trace": (
        "codemode_cli.trace_command",
        "print one tool call's span tree (nested calls, the runtime's run, providers) "
        "from the local JSON-lines trace file",
    ),
    "loadtest": (
        "codemode_cli.loadtest",
        "load the scheduler: concurrent programs x nested calls; reports throughput, latency "
        "percentiles, queue wait, errors and a loss check, writes JSON and an HTML plot",
    ),
    "up": (
        "codemode_cli.up",
        "start N runtimes and a registry wired to them as child processes; Ctrl-C stops them",
    ),
    "console": (
        "codemode_cli.console_command",
        "serve the web console for an agent on 127.0.0.1: plugin activations, Client halves, "
        "the plugin panel, tool approvals and live trajectories",
    ),
    "registry": ("codemode_cli.registry_command", "run the registry until SIGINT/SIGTERM"),
    "runtime": ("codemode_cli.runtime_command", "run the code runtime until SIGINT/SIGTERM"),
    "run": (
        "codemode_cli.run_command",
        "execute a program file as a run_code call for an agent, showing its nested calls live",
    ),
    "history": (
        "codemode_cli.history_command",
        "list (or follow) an agent's or a call's history records; `history export CALL_ID` "
        "writes one call's trajectory to a file",
    ),
    "replay": (
        "codemode_cli.replay_command",
        "re-run an exported trajectory's program against its recorded tool results, with no "
        "providers, and report the first divergent call",
    ),
    "mcp": ("codemode_cli.mcp_command", "Model Context Protocol: `mcp serve` serves an agent"),
}


def _command(name: str) -> Command:
    return cast(Command, importlib.import_module(COMMANDS[name][0]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codemode",
        description="Governed code-mode tool orchestration: registry + runtime over gRPC.",
        epilog="Exit statuses: see docs/cli.md (codemode_common/exit_codes.py).",
    )
    process.add_global_arguments(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        _command(name).add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return process.run_command(build_parser(), argv, lambda args: _command(args.command).run(args))
