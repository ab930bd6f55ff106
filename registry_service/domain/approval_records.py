"""Approvals as store records (`approvals_in_store`): the port the approval broker writes
through when several registries share one database, its record, and an in-memory store.

The contract every store keeps (tests/registry/history/test_approval_conformance.py runs it
against memory, SQLite and PostgreSQL):

- `add` stores a pending record; its id is unique across registries (the broker mints a
  uuid), an id written twice is refused (`ApprovalNotPending` naming the stored one).
- `resolve` moves a pending record to a final state by a conditional update: the first
  answer wins, whichever registry gives it. A record that is no longer pending (or an answer,
  allowed-once or rejected, to one whose expiry has passed) raises `ApprovalNotPending` with
  the stored record (None: no such id) and changes nothing.
- `pending` lists the pending records in the order they were asked (`position`), from
  `after` on, at most `limit`.
- `interrupt_orphans` moves the pending records whose asking registry is gone (its history
  writer lease expired or removed; on SQLite: any registry but this process, since one
  registry owns the file) to `interrupted`, and returns them.
- `prune` deletes records that ended before a time (history retention), never pending ones.
- `follow` tells this process, on its event loop, that another registry changed approvals
  (PostgreSQL NOTIFY); a store only one registry opens never calls it. A missed notification
  costs only time: the broker also polls (`approval_poll_s`).
- Every operation raises `CodemodeError` (the history's database errors) when the backend
  fails, and then stores nothing."""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias


class ApprovalState(enum.Enum):
    PENDING = "pending"
    ALLOWED_ONCE = "allowed-once"
    REJECTED = "rejected"
    CANCELLED = "cancelled"  # the asking call went away
    EXPIRED = "expired"  # nobody answered before its expiry
    INTERRUPTED = "interrupted"  # the asking registry died while it waited


ANSWERS = frozenset({ApprovalState.ALLOWED_ONCE, ApprovalState.REJECTED})


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    approval_id: str
    agent: str  # agents/{id}
    principal: str  # who made the call that waits (qualified), "" when unauthenticated
    call_id: str
    tool_name: str
    arguments_json: str
    reason: str
    asked_by: str  # the asking registry's history writer id
    asked_at: float  # Unix time
    expires_at: float | None = None  # Unix time; None: never
    state: ApprovalState = ApprovalState.PENDING
    answered_by: str = ""  # the approver (or registry) that moved it out of pending
    answered_at: float | None = None
    position: int = 0  # the store's ask order (assigned by `add`)


class ApprovalNotPending(Exception):
    """The record is not pending (or its expiry passed): another answer won, or it ended."""

    def __init__(self, approval_id: str, stored: ApprovalRecord | None) -> None:
        state = "unknown" if stored is None else stored.state.value
        super().__init__(f"approval {approval_id} is not pending ({state})")
        self.approval_id = approval_id
        self.stored = stored


# Told that another registry changed approvals (which ones is read from the store).
ApprovalFollower: TypeAlias = Callable[[], None]


class ApprovalStore(Protocol):
    asker_id: str
    """This registry as an asker (`asked_by`): its history writer id on the database."""

    async def add(self, record: ApprovalRecord) -> ApprovalRecord:
        """Stores a pending record; returns it with its `position`."""
        ...

    async def resolve(
        self, approval_id: str, state: ApprovalState, *, by: str, at: float
    ) -> ApprovalRecord:
        """Moves a pending record to `state` (not PENDING); returns the stored record."""
        ...

    async def get(self, approval_ids: Collection[str]) -> Sequence[ApprovalRecord]:
        """The records of these ids that exist, in position order."""
        ...

    async def pending(self, *, after: int = 0, limit: int) -> Sequence[ApprovalRecord]:
        """Pending records with a position after `after`, in position order."""
        ...

    async def interrupt_orphans(self, *, at: float) -> Sequence[ApprovalRecord]:
        """Pending records of registries that are gone, moved to INTERRUPTED."""
        ...

    async def prune(self, before: float, *, limit: int = 500) -> int:
        """Deletes up to `limit` records that ended before `before` (a Unix time, their
        `answered_at`); pending ones are never deleted. Returns how many went."""
        ...

    def follow(self, changed: ApprovalFollower) -> None:
        """Calls `changed` when other registries sharing the store change approvals."""
        ...


def answerable(record: ApprovalRecord, state: ApprovalState, at: float) -> bool:
    """Whether `record` may move to `state` at `at`: it is pending, and an answer comes
    before its expiry (the one rule the stores' conditional updates also spell in SQL)."""
    if record.state is not ApprovalState.PENDING:
        return False
    return state not in ANSWERS or record.expires_at is None or at < record.expires_at


@dataclass
class MemoryApprovalStore:
    """One process's approvals (the conformance suite's reference; a registry without a
    shared store keeps its approvals in the broker alone). Like SQLite, one registry
    (`asker_id`) owns it: any other asker is gone."""

    asker_id: str = ""
    _records: dict[str, ApprovalRecord] = field(default_factory=dict)
    _positions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def add(self, record: ApprovalRecord) -> ApprovalRecord:
        if record.approval_id in self._records:
            raise ApprovalNotPending(record.approval_id, self._records[record.approval_id])
        stored = dataclasses.replace(record, position=next(self._positions))
        self._records[record.approval_id] = stored
        return stored

    async def resolve(
        self, approval_id: str, state: ApprovalState, *, by: str, at: float
    ) -> ApprovalRecord:
        if state is ApprovalState.PENDING:
            raise ValueError("an approval is resolved to a final state, not pending")
        stored = self._records.get(approval_id)
        if stored is None or not answerable(stored, state, at):
            raise ApprovalNotPending(approval_id, stored)
        stored = dataclasses.replace(stored, state=state, answered_by=by, answered_at=at)
        self._records[approval_id] = stored
        return stored

    async def get(self, approval_ids: Collection[str]) -> Sequence[ApprovalRecord]:
        found = [self._records[i] for i in set(approval_ids) if i in self._records]
        return sorted(found, key=lambda r: r.position)

    async def pending(self, *, after: int = 0, limit: int) -> Sequence[ApprovalRecord]:
        rows = sorted(self._records.values(), key=lambda r: r.position)
        wanted = [r for r in rows if r.state is ApprovalState.PENDING and r.position > after]
        return wanted[:limit]

    async def interrupt_orphans(self, *, at: float) -> Sequence[ApprovalRecord]:
        orphans = [
            r
            for r in self._records.values()
            if r.state is ApprovalState.PENDING and r.asked_by != self.asker_id
        ]
        return [
            await self.resolve(r.approval_id, ApprovalState.INTERRUPTED, by=self.asker_id, at=at)
            for r in sorted(orphans, key=lambda r: r.position)
        ]

    async def prune(self, before: float, *, limit: int = 500) -> int:
        ended = [
            r
            for r in sorted(self._records.values(), key=lambda r: r.position)
            if r.answered_at is not None and r.answered_at < before
        ][:limit]
        for record in ended:
            del self._records[record.approval_id]
        return len(ended)

    def follow(self, changed: ApprovalFollower) -> None:
        return None  # nothing else changes this process's memory
