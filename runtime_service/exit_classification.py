"""What a worker's end means: out of its memory budget, or an exit of another kind.

One rule for every worker, program runs and plugin hosts alike (``supervisor.WorkerSupervisor``
applies it). A worker is out of memory when

- the kernel's out-of-memory killer ended any process of its run cgroup (``RunCgroup.
  oom_killed``): the budget covers every process of the run and its shmem/tmpfs pages;
- or its language says so as it dies (``ExitSigns``): an exit status the worker uses for it,
  or a line its interpreter writes to stderr when it reaches its heap limit, just before it
  aborts.

Everything else is an exit with a status (negative: the signal that ended it). How a run or a
host words the verdict is theirs; what it is, is decided here.

Pure (no grpc, no asyncio).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from runtime_service.languages import ExitSigns

__all__ = ["ExitSigns", "HeapLimitWatch", "WorkerExit", "classify_exit"]


@dataclass(frozen=True, slots=True)
class WorkerExit:
    """The verdict on a worker's end."""

    status: int | None
    """Its exit status (negative: the signal that ended it); None while it still ran (the
    out-of-memory killer ended another process of its run: the worker is ended for it)."""
    out_of_memory: bool = False
    oom_killer: bool = False
    """The kernel's out-of-memory killer acted (else, if ``out_of_memory``, the worker said
    so itself)."""
    crashed: bool = False
    """The worker said that its interpreter process crashed (``ExitSigns.crashed_status``)."""

    @property
    def signal_name(self) -> str | None:
        """The name of the signal that ended the worker, if one did."""
        if self.status is None or self.status >= 0:
            return None
        try:
            return signal.Signals(-self.status).name
        except ValueError:
            return str(-self.status)


def classify_exit(
    status: int | None, signs: ExitSigns, *, oom_killed: bool, heap_limit_reached: bool
) -> WorkerExit:
    """The verdict on a worker that ended with ``status``: ``oom_killed``, whether the
    out-of-memory killer acted in its run cgroup; ``heap_limit_reached``, whether its stderr
    carried ``signs.heap_limit_line`` (``HeapLimitWatch``)."""
    if oom_killed:
        return WorkerExit(status, out_of_memory=True, oom_killer=True)
    said_so = status is not None and status == signs.out_of_memory_status
    aborted_at_limit = status == -signal.SIGABRT and heap_limit_reached
    crashed = status is not None and status == signs.crashed_status
    return WorkerExit(status, out_of_memory=said_so or aborted_at_limit, crashed=crashed)


class HeapLimitWatch:
    """Looks for ``ExitSigns.heap_limit_line`` in a worker's stderr as it arrives, in pieces
    that may split the line anywhere; memory: the line's length."""

    __slots__ = ("_line", "_tail", "seen")

    def __init__(self, signs: ExitSigns) -> None:
        self._line = signs.heap_limit_line.encode()
        self._tail = b""
        self.seen = False
        """Whether the line appeared."""

    @property
    def watching(self) -> bool:
        """Whether the language has such a line and it has not appeared yet."""
        return bool(self._line) and not self.seen

    def feed(self, data: bytes) -> None:
        if not self.watching:
            return
        seen = self._tail + data
        self.seen = self._line in seen
        self._tail = seen[-len(self._line) :]
