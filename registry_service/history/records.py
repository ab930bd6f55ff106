"""History record kinds and the store interface a server database can implement later."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

TOOL_CALL = "tool/call"
TOOL_RESULT = "tool/result"
DISPATCH_START = "tool/code-dispatch-start"
DISPATCH = "tool/code-dispatch"
KINDS = (TOOL_CALL, TOOL_RESULT, DISPATCH_START, DISPATCH)
# Only the outer layer derives model messages; nested records are log-only.
MODEL_KINDS = frozenset({TOOL_CALL, TOOL_RESULT})


@dataclass(frozen=True, slots=True)
class Record:
    """One history record. `content_json` is the final rendered content as JSON text (a list of
    blocks), or a spill preview when the content was larger than the inline limit."""

    kind: str
    agent: str
    call_id: str  # the outer call id, or the sub-call id for nested records
    root_call_id: str
    parent_call_id: str  # "" for outer records
    name: str
    arguments_json: str = ""
    content_json: str = ""
    is_error: bool = False
    error_code: str = ""
    time: float = 0.0
    seq: int = 0  # assigned by the store, strictly increasing
    spilled: str = ""  # locator of the full content when spilled


class HistoryStore(Protocol):
    async def append(self, record: Record) -> Record:
        """Durably appends; returns the record with `seq` (and spill fields) assigned."""
        ...

    def submit(self, record: Record) -> asyncio.Future[Record]:
        """`append` without waiting: the write is queued now (records submitted earlier are
        written first) and the future resolves once it is durable."""
        ...

    async def list(
        self, agent: str, *, after_seq: int, limit: int, call_id: str = ""
    ) -> Sequence[Record]:
        """Records of one agent in seq order; `call_id` matches call or root call ids."""
        ...

    def watch(self, agent: str, after_seq: int) -> AsyncIterator[Record]:
        """Existing records after `after_seq`, then live ones as they are appended."""
        ...

    def prune(self, before: float, *, limit: int = 500) -> int:
        """Deletes up to `limit` whole calls (all records of a root call id, and what they
        spilled) whose newest record is older than the Unix time `before`; returns how many."""
        ...

    def end_watches(self) -> None:
        """Ends every live watch: its iterator returns once it has yielded what it holds."""
        ...

    async def read_spill(self, locator: str) -> str | None: ...

    async def close(self) -> None: ...
