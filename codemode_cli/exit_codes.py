"""The exit statuses of every `codemode` command: one table, documented in docs/cli.md.

A script can tell apart what went wrong without parsing messages: a usage error (fix the
command line) from a missing call (wrong id) from an unreachable registry (retry later) from a
program that ran and failed. `for_rpc_failure` is the one mapping of an RPC failure to a status.
"""

from __future__ import annotations

import enum
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from codemode_client.errors import CodemodeError

__all__ = ["ExitCode", "for_rpc_failure"]


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
    INTERRUPTED = 130
    """Ctrl-C (SIGINT): stopped cleanly, 128 + SIGINT as shells report it."""
    PIPE_CLOSED = 128 + signal.SIGPIPE
    """The reader of stdout went away (`| head`): the process ends by SIGPIPE, quietly, as
    other tools in a pipeline do; shells report 141."""


def for_rpc_failure(exc: CodemodeError) -> ExitCode:
    """The status for a failed RPC, by its canonical code."""
    code = exc.code.name
    if code == "NOT_FOUND":
        return ExitCode.NOT_FOUND
    if code == "UNAVAILABLE":
        return ExitCode.UNAVAILABLE
    if code == "DEADLINE_EXCEEDED":
        return ExitCode.TIMEOUT
    if code == "CANCELLED":
        return ExitCode.INTERRUPTED
    return ExitCode.REFUSED
