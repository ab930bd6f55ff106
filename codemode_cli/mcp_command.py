"""`codemode mcp <subcommand>`: Codemode and the Model Context Protocol.

Each subcommand lives in its own module with ``add_arguments(parser)`` and ``run(args) -> int``,
as the top-level commands do (`main.py`); add one by adding a row to `SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
from typing import cast

from codemode_cli.main import Command

# name -> (module, one-line help), in the order `codemode mcp --help` lists them.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": (
        "codemode_cli.mcp_serve",
        "serve an agent as an MCP server (stdio or streamable HTTP on loopback): its tools as "
        "its mode shows them, calls through the registry as one principal",
    ),
}


def _subcommand(name: str) -> Command:
    return cast(Command, importlib.import_module(SUBCOMMANDS[name][0]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subs = parser.add_subparsers(dest="mcp_command", required=True, metavar="SUBCOMMAND")
    for name, (_, summary) in SUBCOMMANDS.items():
        sub = subs.add_parser(name, help=summary, description=summary)
        _subcommand(name).add_arguments(sub)


def run(args: argparse.Namespace) -> int:
    return _subcommand(args.mcp_command).run(args)
