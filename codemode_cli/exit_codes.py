"""The `codemode` commands' exit statuses: the table (codemode_common/exit_codes.py, which the
services share) and `for_rpc_failure`, the one mapping of a failed RPC onto it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from codemode_common.exit_codes import ExitCode

if TYPE_CHECKING:
    from codemode_client.errors import CodemodeError

__all__ = ["ExitCode", "for_rpc_failure"]


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
