"""`python -m runtime_service [--config FILE]`: run the runtime until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from runtime_service.config import ConfigError, load_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime_service", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML settings file (env vars override it)")
    parser.add_argument("--listen", help="host:port to bind (overrides settings)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    overrides = {"listen": args.listen} if args.listen else {}
    try:
        settings = load_settings(args.config, **overrides)
    except ConfigError as exc:
        print(f"runtime: {exc}", file=sys.stderr)
        return 2
    from runtime_service.server import serve  # imports grpc only once settings are valid

    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
