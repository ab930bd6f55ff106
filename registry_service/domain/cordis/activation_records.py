"""Pending client-bearing activations as store records: the port `client_runs.ClientRuns`
writes through, its record, the one table of which move is allowed from which state, and an
in-memory store.

A record is what a page needs to answer an activation request (`cordis_run` of a package with
a Client half) and where the answer stands, so that every registry sharing the store shows it
to its pages and any of them answers it. The registry that armed it (`asked_by`) holds the
attempt and is the only one that starts its Host half and applies its outcome to the plugin;
the others only move the record.

    pending --approve--> approved --asker started the host--> hosting --success--> succeeded
       |                    |--asker's start failed--> host-failed
       +-- rejected / failed / cancelled / interrupted, from any open state

The contract every store keeps (tests/registry/history/test_activation_conformance.py runs it
against memory, SQLite and PostgreSQL):

- `add` stores a pending record; an id written twice is refused (`ActivationNotOpen` naming
  the stored one).
- `move` changes a record's state by one conditional update, allowed only from the states
  `MOVES` lists for the target: the first answer wins whichever registry gives it, and a move
  that is not allowed (a duplicate, a stale answer, a record that ended) raises
  `ActivationNotOpen` with the stored record (None: no such id) and changes nothing. In
  particular a success is taken only from `hosting`: what a page's Client half reports can
  never stand in for the approval, nor for the Host half the asking registry started.
- `open` lists the open records in the order they were asked (`position`).
- `interrupt_orphans` moves the open records whose asking registry is gone (its history writer
  lease expired or removed; on SQLite and in memory: any asker but this one) to
  `interrupted`, and returns them.
- `prune` deletes records that ended before a time, never open ones.
- `attach_pages` / `detach_pages` say that this registry has pages of an agent attached (with
  the client inspect manifest they synced, and where its peer channel answers) or no longer;
  `pages_elsewhere` lists what other live registries said (on SQLite and in memory: nothing,
  one registry owns the store). A client-half call of a program is carried to them
  (cordis_page_peers.py) when no page of its agent is attached here.
- `follow` tells this process that another registry changed activation records (PostgreSQL
  NOTIFY); a missed notification costs only time: `ClientRuns` also polls
  (`cordis_activation_poll_s`).
- Every operation raises `CodemodeError` (the history's database errors) when the backend
  fails, and then stores nothing."""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias


class ActivationState(enum.Enum):
    PENDING = "pending"  # asked; no page answered yet
    APPROVED = "approved"  # a page approved it (ran the Host half step); the asker starts it
    HOSTING = "hosting"  # the asker started the Host half for it; the Client half may load
    HOST_FAILED = "host-failed"  # the asker's start of the Host half failed; a page settles
    SUCCEEDED = "succeeded"
    REJECTED = "rejected"
    FAILED = "failed"  # a page settled host-half-failed or client-half-failed
    CANCELLED = "cancelled"  # stopped or removed, on any registry
    INTERRUPTED = "interrupted"  # the asking registry died while it was open


OPEN = frozenset(
    {
        ActivationState.PENDING,
        ActivationState.APPROVED,
        ActivationState.HOSTING,
        ActivationState.HOST_FAILED,
    }
)

# Target state -> the states a record may move to it from (the stores spell this in SQL).
MOVES: dict[ActivationState, frozenset[ActivationState]] = {
    ActivationState.APPROVED: frozenset({ActivationState.PENDING}),
    ActivationState.HOSTING: frozenset({ActivationState.APPROVED}),
    ActivationState.HOST_FAILED: frozenset({ActivationState.APPROVED}),
    ActivationState.SUCCEEDED: frozenset({ActivationState.HOSTING}),
    ActivationState.REJECTED: OPEN,
    ActivationState.FAILED: OPEN,
    ActivationState.CANCELLED: OPEN,
    ActivationState.INTERRUPTED: OPEN,
}


@dataclass(frozen=True, slots=True)
class ActivationRecord:
    request_id: str  # approval-<n>, from the Cordis id counter shared by the registries
    agent: str  # the owning agent, agents/{id}
    plugin_id: str
    package_id: str
    run_id: str  # the attempt's run-<n>
    mode: str
    name: str
    purpose: str
    requires_approval: bool
    has_host: bool
    source_host: str  # the package's halves as a person reviews them (page_runners.py cuts)
    source_client: str
    source_truncated: bool
    asked_by: str  # the asking registry (its history writer id)
    asked_at: float  # Unix time
    state: ActivationState = ActivationState.PENDING
    approved_by: str = ""  # the page (registry:page) that approved it
    approve_future: bool = False  # the approval covers later versions too
    settled_by: str = ""  # who moved it out of open (a page, or a registry)
    detail: str = ""  # JSON text: the settlement's outcome, message, stack, waitingFor
    changed_at: float | None = None  # the last move
    position: int = 0  # the store's ask order (assigned by `add`)

    @property
    def open(self) -> bool:
        return self.state in OPEN


class ActivationNotOpen(Exception):
    """The move is not allowed from the stored state: another answer won, or it ended."""

    def __init__(self, request_id: str, stored: ActivationRecord | None) -> None:
        state = "unknown" if stored is None else stored.state.value
        super().__init__(f"run request {request_id} cannot move now ({state})")
        self.request_id = request_id
        self.stored = stored


@dataclass(frozen=True, slots=True)
class Move:
    """One move: the target state and what it records."""

    state: ActivationState
    by: str
    at: float
    detail: str = ""
    approve_future: bool = False

    def __post_init__(self) -> None:
        if self.state is ActivationState.PENDING:
            raise ValueError("a run request moves out of pending, never into it")


@dataclass(frozen=True, slots=True)
class PagesAt:
    """Another registry has pages of `agent` attached."""

    agent: str
    registry: str  # its history writer id
    address: str  # its peer channel
    manifest_json: str  # the client inspect manifest its pages last synced ("" none)


ActivationFollower: TypeAlias = Callable[[], None]


class ActivationStore(Protocol):
    asker_id: str
    """This registry as an asker (`asked_by`): its history writer id on the database."""

    async def add(self, record: ActivationRecord) -> ActivationRecord:
        """Stores a pending record; returns it with its `position`."""
        ...

    async def move(self, request_id: str, move: Move) -> ActivationRecord:
        """Moves the record if `MOVES` allows it from its stored state; returns it."""
        ...

    async def get(self, request_ids: Collection[str]) -> Sequence[ActivationRecord]:
        """The records of these ids that exist, in position order."""
        ...

    async def open(self, *, limit: int) -> Sequence[ActivationRecord]:
        """The open records, in position order, at most `limit`."""
        ...

    async def interrupt_orphans(self, *, at: float) -> Sequence[ActivationRecord]:
        """Open records of registries that are gone, moved to INTERRUPTED."""
        ...

    async def prune(self, before: float, *, limit: int = 500) -> int:
        """Deletes up to `limit` records that ended before `before`; never open ones."""
        ...

    async def attach_pages(self, agent: str, address: str, manifest_json: str) -> None:
        """This registry has pages of `agent` attached (written again on a manifest sync)."""
        ...

    async def detach_pages(self, agent: str) -> None:
        """This registry has no page of `agent` attached any more."""
        ...

    async def pages_elsewhere(self) -> Sequence[PagesAt]:
        """What other registries that are alive said they have attached, by agent."""
        ...

    def follow(self, changed: ActivationFollower) -> None:
        """Calls `changed` when other registries sharing the store change records."""
        ...


def moved(record: ActivationRecord, move: Move) -> ActivationRecord | None:
    """`record` after `move`, or None when `MOVES` does not allow it (the rule the SQL stores'
    conditional updates spell too)."""
    if record.state not in MOVES[move.state]:
        return None
    if move.state is ActivationState.APPROVED:
        return dataclasses.replace(
            record,
            state=move.state,
            approved_by=move.by,
            approve_future=move.approve_future,
            changed_at=move.at,
        )
    if move.state in (ActivationState.HOSTING, ActivationState.HOST_FAILED):
        return dataclasses.replace(record, state=move.state, detail=move.detail, changed_at=move.at)
    return dataclasses.replace(
        record, state=move.state, settled_by=move.by, detail=move.detail, changed_at=move.at
    )


@dataclass
class MemoryActivationStore:
    """One process's run requests (a registry without a shared store, and the conformance
    suite's reference). One registry (`asker_id`) owns it: any other asker is gone."""

    asker_id: str = "local"
    _records: dict[str, ActivationRecord] = field(default_factory=dict)
    _positions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _pages: dict[str, PagesAt] = field(default_factory=dict)

    async def attach_pages(self, agent: str, address: str, manifest_json: str) -> None:
        self._pages[agent] = PagesAt(agent, self.asker_id, address, manifest_json)

    async def detach_pages(self, agent: str) -> None:
        self._pages.pop(agent, None)

    async def pages_elsewhere(self) -> Sequence[PagesAt]:
        return []  # one registry owns this memory

    async def add(self, record: ActivationRecord) -> ActivationRecord:
        if record.request_id in self._records:
            raise ActivationNotOpen(record.request_id, self._records[record.request_id])
        stored = dataclasses.replace(record, position=next(self._positions))
        self._records[record.request_id] = stored
        return stored

    async def move(self, request_id: str, move: Move) -> ActivationRecord:
        stored = self._records.get(request_id)
        after = None if stored is None else moved(stored, move)
        if after is None:
            raise ActivationNotOpen(request_id, stored)
        self._records[request_id] = after
        return after

    async def get(self, request_ids: Collection[str]) -> Sequence[ActivationRecord]:
        found = [self._records[i] for i in set(request_ids) if i in self._records]
        return sorted(found, key=lambda r: r.position)

    async def open(self, *, limit: int) -> Sequence[ActivationRecord]:
        rows = sorted(self._records.values(), key=lambda r: r.position)
        return [r for r in rows if r.open][:limit]

    async def interrupt_orphans(self, *, at: float) -> Sequence[ActivationRecord]:
        orphans = [r for r in await self.open(limit=2**31) if r.asked_by != self.asker_id]
        move = Move(ActivationState.INTERRUPTED, self.asker_id, at)
        return [await self.move(r.request_id, move) for r in orphans]

    async def prune(self, before: float, *, limit: int = 500) -> int:
        ended = [
            r
            for r in sorted(self._records.values(), key=lambda r: r.position)
            if not r.open and r.changed_at is not None and r.changed_at < before
        ][:limit]
        for record in ended:
            del self._records[record.request_id]
        return len(ended)

    def follow(self, changed: ActivationFollower) -> None:
        return None  # nothing else changes this process's memory
