"""The exit statuses of every Codemode process, the `codemode` commands and both services:
one table, documented in docs/cli.md (codemode_cli/exit_codes.py maps RPC failures onto it).

A script can tell apart what went wrong without parsing messages: a usage error (fix the
command line) from a missing call (wrong id) from an unreachable registry (retry later) from a
program that ran and failed.
"""

from __future__ import annotations

import enum
import signal

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    OK = 0
    """Done; what was run or checked succeeded."""
    FAILED = 1
    """It ran and failed: the program's result is an error, a load test lost or failed calls,
    a service the command supervises died."""
    USAGE = 2
    """Bad flags or arguments, an unreadable or invalid file, invalid settings (argparse's own
    status for usage errors)."""
    NOT_FOUND = 3
    """What was asked for does not exist: a call id with no records or spans, an agent."""
    UNAVAILABLE = 4
    """The registry cannot be reached, or a service cannot start (its port is taken)."""
    TIMEOUT = 5
    """A deadline expired (`run --timeout`)."""
    REFUSED = 6
    """The registry refused the request (permission, invalid argument, precondition)."""
    DIVERGED = 7
    """`replay`: the program made a call the recording does not have."""
    NOT_COMPARABLE = 8
    """`loadtest compare`: the two runs differ in settings that decide their figures."""
    INTERRUPTED = 130
    """Ctrl-C (SIGINT): stopped cleanly, 128 + SIGINT as shells report it."""
    PIPE_CLOSED = 128 + signal.SIGPIPE
    """The reader of stdout went away (`| head`): the process ends by SIGPIPE, quietly, as
    other tools in a pipeline do; shells report 141."""
