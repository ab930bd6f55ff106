"""`codemode runtime`: run the code runtime until SIGINT/SIGTERM (the same as
`python -m runtime_service`, whose arguments and start-up it reuses)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from runtime_service.__main__ import add_arguments as service_arguments  # argparse only

    service_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from runtime_service.__main__ import run as serve

    return serve(args, prog="codemode runtime")
