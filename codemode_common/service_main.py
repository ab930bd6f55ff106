"""The one entry point both services share: `python -m <service>` and `codemode <service>`.

Parsing stays cheap (argparse only); settings are validated before the server module (and so
grpc) is imported, which the runtime needs: grpc must not be imported before its fork
settings are in place.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from codemode_common import process_env
from codemode_common.exit_codes import ExitCode

S = TypeVar("S")


def add_arguments(parser: argparse.ArgumentParser, *, service: str, env_prefix: str) -> None:
    parser.epilog = (
        f"Prints `{service} listening on port N` once it serves. Settings come from the YAML "
        f"file, then {env_prefix}* environment variables, then --listen."
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML settings file (env vars override it)"
    )
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="address to bind (overrides settings; port 0: any)"
    )
    parser.add_argument(
        "--log-level",
        choices=process_env.LOG_LEVELS,
        # Not set when not given: `codemode --log-level LEVEL registry` keeps the CLI's.
        default=argparse.SUPPRESS,
        help=f"log level (default: ${process_env.LOG_LEVEL_VARIABLE}, else info)",
    )


def run(
    args: argparse.Namespace,
    *,
    prog: str,
    load_settings: Callable[..., S],
    config_error: type[Exception],
    serve: Callable[[S], Coroutine[Any, Any, bool]],
    env_settings: Mapping[str, type[BaseModel]],
) -> int:
    """Serves until SIGTERM (0) or SIGINT (130); invalid settings: 2; cannot listen: 4 (see
    codemode_common/exit_codes.py). `serve` is called only once the settings are valid (it may
    import the server lazily) and returns whether SIGINT stopped it. `env_settings` (prefix ->
    settings class) are the environment variables this service reads: others under its prefix
    are warned about."""
    # grpc core logs every failed TLS handshake of a peer at INFO: a flood of them would be a
    # line per attempt. Its errors are kept; an operator's GRPC_VERBOSITY wins. (Connections
    # refused by `max_connections` or closed by the handshake timeout log nothing.)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        level = process_env.log_level(getattr(args, "log_level", None))
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    process_env.configure_logging(level)
    process_env.warn_unknown_variables(prog, env_settings)
    overrides = {"listen": args.listen} if args.listen else {}
    try:
        settings = load_settings(args.config, **overrides)
    except config_error as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        interrupted = asyncio.run(serve(settings))
    except config_error as exc:  # found while composing the service (plugins, declarations)
        print(f"{prog}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except OSError as exc:  # the servers report a failed bind as OSError
        print(
            f"{prog}: cannot listen on {getattr(settings, 'listen', '?')}: {exc}", file=sys.stderr
        )
        return ExitCode.UNAVAILABLE
    return ExitCode.INTERRUPTED if interrupted else ExitCode.OK


def main(
    argv: list[str] | None,
    *,
    module: str,
    description: str,
    add: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    add(parser)
    return run(parser.parse_args(argv))
