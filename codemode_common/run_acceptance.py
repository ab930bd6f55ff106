"""How a runtime tells its caller that it has taken a run's program.

`RuntimeService.Run` has no message for it, so the runtime sends this initial-metadata entry
as soon as it has accepted a run, before any message. A caller whose Run failed without it
knows the program never ran (safe to try again, on that or another runtime); once it has it,
the program may have run (and made binding calls), so a lost connection is not retryable.
"""

from __future__ import annotations

from collections.abc import Iterable

ACCEPTED = ("codemode-run", "accepted")


def accepted(metadata: Iterable[tuple[str, str | bytes]]) -> bool:
    """Whether a call's initial metadata holds the acceptance entry."""
    return any(tuple(entry) == ACCEPTED for entry in metadata)
