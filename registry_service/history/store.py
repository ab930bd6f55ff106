"""The history store interface: what the registry needs from any durable history backend.

SQLite (`history.sqlite`) is the embedded default; a server database (PostgreSQL) implements the
same protocol and must pass the same conformance suite (tests/registry/history). The contract:

- Appends are batched and atomic: records submitted in one event-loop turn are written in one
  transaction, all or nothing. Every future of a batch the backend fails fails at once with a
  `CodemodeError` (`HISTORY_UNAVAILABLE` or `HISTORY_CORRUPT`); none is left pending.
- One bad record fails only its own write: a record no store can hold (`records.unstorable`)
  is refused at `submit` with INVALID_ARGUMENT `HISTORY_RECORD_INVALID`, and a batch the
  backend refuses for what a record holds (not for its own failure) is written again record
  by record, so that only the refused one fails, with the same error. Neither moves `state`.
  A read asking for a key no record can hold finds nothing.
- A future resolves only once its record is durable (committed, and flushed as the backend
  commits); an end record that could not be written, or whose batch may or may not have
  committed, is owed as an interrupted end (written once writes work again, only while its
  call is still open), so a call is never left open by a failed write.
- Records are keyed by `Record.agent_id` (the agent's stable identity, never reused): `list`,
  `watch` and the calls left open are per agent id; `Record.agent` (the name) is only carried.
- `seq` is strictly increasing per agent, in submission order; a page token is the last `seq`
  of the page before it.
- A store failure moves `state` off `OK`; `UNAVAILABLE` recovers by itself (the next write that
  succeeds, or `check`), `CORRUPT` never does (the operator restores the database).
- Calls left open by a crash (a start record without its end) are closed once, at start, by
  `close_interrupted`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from codemode_wire.errors import CodemodeError, Status, invalid_argument, unavailable
from registry_service.domain import records
from registry_service.domain.records import END_OF, INTERRUPTED, Record, unstorable

_log = logging.getLogger(__name__)

HISTORY_UNAVAILABLE = "HISTORY_UNAVAILABLE"
HISTORY_CORRUPT = "HISTORY_CORRUPT"
HISTORY_RECORD_INVALID = "HISTORY_RECORD_INVALID"
START_OF = {end: start for start, end in END_OF.items()}


class StoreOpenError(Exception):
    """The store cannot be opened at all (an unknown store, a path that cannot be created, no
    permission): the registry does not start."""


class StoreState(enum.Enum):
    OK = "ok"
    UNAVAILABLE = "unavailable"  # writes or reads fail now (full disk, I/O error, lost server)
    CORRUPT = "corrupt"  # the stored data is damaged: nothing is read or written any more


class StoreHealth:
    """What every store keeps alike (the contract above). Health: OK and UNAVAILABLE follow
    the backend, CORRUPT is final; `state_changed` wakes its waiters on every change. A store
    subclasses it and calls `_set_state` where it learns something. The interrupted ends owed
    for writes that failed (`_owe`), and the refusal of one record (`_unstorable`, `_refuse`)."""

    def __init__(self, where: str) -> None:
        self._where = where  # for the log: a path, or a DSN without its password
        self._state = StoreState.OK
        self._state_waiters: list[asyncio.Future[None]] = []
        # End records whose write failed, owed as interrupted ones to the next write that works.
        self._owed: list[Record] = []

    @property
    def state(self) -> StoreState:
        return self._state

    async def state_changed(self, seen: StoreState) -> StoreState:
        while self._state is seen:
            waiter = asyncio.get_running_loop().create_future()
            self._state_waiters.append(waiter)
            await waiter
        return self._state

    def _set_state(self, state: StoreState) -> None:
        if state is self._state or self._state is StoreState.CORRUPT:
            return  # damage is never undone by a write that happens to work
        _log.log(
            logging.INFO if state is StoreState.OK else logging.ERROR,
            "history store %s: %s",
            self._where,
            state.value,
        )
        self._state = state
        waiters, self._state_waiters = self._state_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _owe(self, failed: Sequence[Record], *, in_doubt: bool = False) -> None:
        """Remembers the calls a failed write leaves open: an end record whose start was
        written earlier is owed as an interrupted end (its caller saw the failure, not the
        result), so the call is closed once writes work again. `in_doubt`: the batch may have
        committed after all (the connection was lost around its commit), so its start records
        without their end in the batch are owed an end too (written only if the start was)."""
        starts = {(r.agent_id, r.call_id, r.kind) for r in failed if r.kind in END_OF}
        ended = {(r.agent_id, r.call_id, START_OF[r.kind]) for r in failed if r.kind in START_OF}
        for record in failed:
            key = (record.agent_id, record.call_id, START_OF.get(record.kind, record.kind))
            if record.kind in START_OF:  # an end record
                if key in starts:
                    continue  # its start failed with it: nothing is open
                if record.is_error and record.error_code == INTERRUPTED:
                    owed = record  # already an interrupted end: keep its reason
                else:
                    owed = records.interrupted(record, records.NOT_RECORDED)
            elif in_doubt and record.kind in END_OF and key not in ended:
                owed = records.interrupted(record, records.NOT_RECORDED)
            else:
                continue
            if problem := unstorable(owed):  # its start could not have been written either
                _log.error("history store %s: no interrupted end for %s", self._where, problem)
                continue
            self._owed.append(owed)

    def _refuse(self, record: Record, error: CodemodeError) -> None:
        """A record refused on its own (`error`, the store stays as it is): its call is owed
        an interrupted end, if it can hold one."""
        _log.warning("history store %s: a record refused: %s", self._where, error.message)
        self._owe([record])

    def _unstorable(self, record: Record) -> asyncio.Future[Record] | None:
        """The failed future of a record no store can hold (`records.unstorable`), else None."""
        problem = unstorable(record)
        if not problem:
            return None
        error = record_invalid(problem)
        self._refuse(record, error)
        future: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
        future.set_exception(error)
        return future


def record_invalid(detail: str) -> CodemodeError:
    """A record refused for what it holds: only its own write fails, the store stays OK."""
    return invalid_argument(
        HISTORY_RECORD_INVALID, f"the history store cannot hold this record: {detail}"
    )


def store_unavailable(detail: str) -> CodemodeError:
    return unavailable(HISTORY_UNAVAILABLE, f"the history store is unavailable: {detail}")


def store_corrupt(detail: str) -> CodemodeError:
    return CodemodeError(
        Status.DATA_LOSS, HISTORY_CORRUPT, f"the history database is damaged: {detail}"
    )


class HistoryStore(Protocol):
    """A durable two-layer history. Every operation raises `CodemodeError` (never a driver's
    own exception) when the backend fails."""

    @property
    def state(self) -> StoreState:
        """The store's health as last observed (the gRPC health service reports it)."""
        ...

    async def state_changed(self, seen: StoreState) -> StoreState:
        """Returns the state once it differs from `seen` (at once if it already does)."""
        ...

    async def check(self) -> StoreState:
        """Probes the backend with a small write (no history record) and returns the state:
        how an unavailable store notices it has recovered when no call writes."""
        ...

    async def append(self, record: Record) -> Record:
        """Durably appends; returns the record with `seq` (and spill fields) assigned."""
        ...

    def submit(self, record: Record) -> asyncio.Future[Record]:
        """`append` without waiting: the write is queued now (records submitted earlier are
        written first, in the same or an earlier transaction) and the future resolves once it
        is durable, or fails with the batch."""
        ...

    async def list(
        self, agent_id: str, *, after_seq: int, limit: int, call_id: str = ""
    ) -> Sequence[Record]:
        """One page of an agent's records (by agent id) in seq order, after `after_seq`;
        `call_id` matches call or root call ids."""
        ...

    def watch(self, agent_id: str, after_seq: int) -> AsyncIterator[Record]:
        """The agent's (by agent id) existing records after `after_seq`, then live ones as they
        are appended."""
        ...

    def end_watches(self) -> None:
        """Ends every live watch: its iterator returns once it has yielded what it holds."""
        ...

    async def read_spill(self, locator: str) -> str | None:
        """The full content a record spilled (`Record.spilled`), None when it is gone."""
        ...

    async def prune(self, before: float, *, limit: int = 500) -> int:
        """Deletes up to `limit` whole calls (all records of a root call id, and what they
        spilled) whose newest record is older than the Unix time `before`; returns how many."""
        ...

    async def close_interrupted(self) -> Sequence[Record]:
        """Closes every call a crashed process left open (a `tool/call` without its
        `tool/result`, a dispatch start without its dispatch) with an interrupted end record,
        nested ones before their outer call; returns the records written. Called once at start,
        before any call. A store shared by several registries must close only the calls of
        writers known to be gone."""
        ...

    async def close(self) -> None:
        """Writes what is queued, then releases the backend."""
        ...
