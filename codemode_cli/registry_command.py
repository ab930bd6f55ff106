"""`codemode registry`: run the registry until SIGINT/SIGTERM (the same as
`python -m registry_service`, whose arguments and start-up it reuses)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from registry_service.__main__ import add_arguments as service_arguments  # argparse only

    service_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from registry_service.__main__ import run as serve

    return serve(args, prog="codemode registry")
