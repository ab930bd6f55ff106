"""The one entry point both services share: `python -m <service>` and `codemode <service>`.

Parsing stays cheap (argparse only); settings are validated before the server module (and so
grpc) is imported, which the runtime needs: grpc must not be imported before its fork
settings are in place.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

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


def run(
    args: argparse.Namespace,
    *,
    prog: str,
    load_settings: Callable[..., S],
    config_error: type[Exception],
    serve: Callable[[S], Coroutine[Any, Any, None]],
) -> int:
    """Serves until SIGINT/SIGTERM (0); invalid settings: 2; cannot listen: 1. `serve` is
    called only once the settings are valid (it may import the server lazily)."""
    # grpc core logs every failed TLS handshake of a peer at INFO: a flood of them would be a
    # line per attempt. Its errors are kept; an operator's GRPC_VERBOSITY wins. (Connections
    # refused by `max_connections` or closed by the handshake timeout log nothing.)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    overrides = {"listen": args.listen} if args.listen else {}
    try:
        settings = load_settings(args.config, **overrides)
    except config_error as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(settings))
    except config_error as exc:  # found while composing the service (plugins, declarations)
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the servers report a failed bind as OSError
        print(
            f"{prog}: cannot listen on {getattr(settings, 'listen', '?')}: {exc}", file=sys.stderr
        )
        return 1
    return 0


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
