"""What every `codemode` command shares as a process: `--version` and `--log-level`, the
check of `CODEMODE_*` variables, Ctrl-C and a closed stdout.

Ctrl-C ends any command with status 130 and one line, never a traceback. When the reader of
stdout goes away (`codemode history ... | head`), the command ends as the other tools of a
pipeline do: silently, by SIGPIPE (status 141 in a shell).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import sys
from collections.abc import Callable

from codemode_cli.exit_codes import ExitCode
from codemode_common import process_env

__all__ = ["add_global_arguments", "run_command", "version"]

_DISTRIBUTION = "codemode"
CLI_LOG_LEVEL = "warning"
"""The CLI's own default: its output is for people; the services it starts log at info."""


def version() -> str:
    """The installed package's version (pyproject.toml's, through the package metadata)."""
    try:
        return importlib.metadata.version(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed; run scripts/bootstrap)"


def add_global_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"codemode {version()}")
    parser.add_argument(
        "--log-level",
        choices=process_env.LOG_LEVELS,
        help=f"log level of this command and of the services it starts (default: "
        f"${process_env.LOG_LEVEL_VARIABLE}, else {CLI_LOG_LEVEL} for the command and info "
        "for services)",
    )


def run_command(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    run: Callable[[argparse.Namespace], int],
) -> int:
    args = parser.parse_args(argv)
    prog = f"codemode {args.command}"
    try:
        level = process_env.log_level(args.log_level, default=CLI_LOG_LEVEL)
    except ValueError as exc:
        print(f"codemode: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if args.log_level:  # the services this command starts inherit it
        os.environ[process_env.LOG_LEVEL_VARIABLE] = args.log_level
    if os.environ.get(process_env.LOG_LEVEL_VARIABLE):
        # Asked for: set up. Otherwise Python's own default (warnings and errors) is the
        # CLI's, and a caller of `main()` keeps its logging as it was.
        process_env.configure_logging(level)
    _check_environment()
    try:
        status = run(args)
        if sys.stdout is not None:  # None: started with fd 1 closed
            sys.stdout.flush()  # a closed pipe shows here for output still buffered
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        _end_by_sigpipe()
    return status


def _check_environment() -> None:
    if not process_env.needs_check():
        return
    # Imported only when there is something to check: the settings models import pydantic.
    from registry_service.config import RegistrySettings
    from runtime_service.config import RuntimeSettings

    process_env.warn_unknown_variables(
        "codemode",
        {"CODEMODE_REGISTRY_": RegistrySettings, "CODEMODE_RUNTIME_": RuntimeSettings},
    )


def _end_by_sigpipe() -> None:
    """Ends the process by SIGPIPE's default action. stdout is pointed at /dev/null first, so
    nothing at interpreter exit tries the closed pipe again (and prints a traceback)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.stderr.flush()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    raise SystemExit(ExitCode.PIPE_CLOSED)  # not reached where SIGPIPE kills
