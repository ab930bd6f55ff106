"""`python -m registry_service [--config FILE] [--listen HOST:PORT]`: run the registry until
SIGINT/SIGTERM.

`add_arguments` and `run` are shared with `codemode registry`, so both entry points parse and
start the same way; only the prefix of error messages differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Prints `registry listening on port N` once it serves. Settings come from the YAML file, "
        "then CODEMODE_REGISTRY_* environment variables, then --listen."
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML settings file (env vars override it)"
    )
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="address to bind (overrides settings; port 0: any)"
    )


def run(args: argparse.Namespace, *, prog: str = "registry") -> int:
    """Serves until SIGINT/SIGTERM (0); invalid settings: 2; cannot listen: 1."""
    # Heavy imports (grpc, telemetry) only here, so building a parser stays fast.
    import asyncio
    import logging

    from registry_service.config import ConfigError, load_settings
    from registry_service.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    overrides = {"listen": args.listen} if args.listen else {}
    try:
        settings = load_settings(args.config, **overrides)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(settings))
    except (OSError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and "bind" not in str(exc):
            raise  # grpc reports a failed bind as RuntimeError; anything else is a bug
        print(f"{prog}: cannot listen on {settings.listen}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m registry_service", description="Run the registry until SIGINT/SIGTERM."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
