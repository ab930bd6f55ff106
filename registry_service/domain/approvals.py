"""Approval routing: connected approvers receive every request they may answer (`admits`:
the agents an approver's principal may approve for); the first answer wins.

Without a store (`approvals_in_store` false, or a history that dies with the process) a
request waits in this process only. With no approver connected that may answer it, the
outcome is UNAVAILABLE (also when the last one leaves while a request is open).

With a store (domain/approval_records.py) a request is a record that every registry sharing
the database sees: each one's broker delivers the pending records to its own approvers
(notified by the store, and polling every `poll_s` so a missed notification only delays),
answers through the store's conditional update (first answer wins across registries), and
withdraws a record once it ended anywhere. The asking registry's waiting call learns the
answer the same way. A request waits even with no approver connected here: one may connect
to another registry, or answer through ResolveApproval. A pending record whose asking
registry died (its history writer lease is gone) is interrupted by a survivor.

Either way: an optional expiry (per request, else `expiry_s`) ends a request unanswered as
EXPIRED; the caller's cancellation resolves the wait as CANCELLED. Every approver that saw
the request and did not win is told it was withdrawn, so UIs can close their prompts. An
approver never sees, and cannot answer, a request of an agent it does not admit: its id then
reads as unknown.

Nor is it sent a request larger than its stream receives (it declared its limit, see
receive_limits.py): one agent's large arguments would otherwise end a stream that answers for
every agent. Such a request goes to the approvers that can receive it; without a store and
with none of them connected its outcome is UNAVAILABLE, and the resolution says it was too
large.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from codemode_wire.errors import CodemodeError
from registry_service.domain.approval_records import (
    ApprovalNotPending,
    ApprovalRecord,
    ApprovalState,
    ApprovalStore,
)
from registry_service.domain.change_follow import ChangeFollower
from registry_service.domain.receive_limits import ReceiveLimits, too_large
from registry_service.domain.signals import AbortSignal

log = logging.getLogger(__name__)

_ENDED_KEPT = 10_000  # ended ids remembered, to tell "no longer pending" from "unknown"
_VIEW_LIMIT = 10_000  # store-pending records one refresh reads (a bound, not a page)
_LIST_SCAN = 2_000  # store records one ListPendingApprovals page reads at most


class ApprovalOutcome(enum.Enum):
    ALLOWED_ONCE = "allowed-once"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    UNAVAILABLE = "unavailable"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    approval_id: str
    call_id: str
    agent: str
    tool_name: str
    arguments_json: str
    reason: str
    principal: str = ""  # who made the call that waits (qualified); not sent to approvers
    expires_at: float | None = None  # Unix time; None: never


@dataclass(frozen=True, slots=True)
class ApprovalWithdrawn:
    approval_id: str
    outcome: ApprovalOutcome


ApproverMessage = ApprovalRequest | ApprovalWithdrawn

NO_APPROVER = "no approval channel is available"

# A store record's final state -> the outcome its waiting call and the approvers see.
_OUTCOME_OF = {
    ApprovalState.ALLOWED_ONCE: ApprovalOutcome.ALLOWED_ONCE,
    ApprovalState.REJECTED: ApprovalOutcome.REJECTED,
    ApprovalState.CANCELLED: ApprovalOutcome.CANCELLED,
    ApprovalState.EXPIRED: ApprovalOutcome.EXPIRED,
    ApprovalState.INTERRUPTED: ApprovalOutcome.CANCELLED,
}
_ANSWERS = {
    ApprovalOutcome.ALLOWED_ONCE: ApprovalState.ALLOWED_ONCE,
    ApprovalOutcome.REJECTED: ApprovalState.REJECTED,
}


@dataclass(frozen=True, slots=True)
class ApprovalResolution:
    outcome: ApprovalOutcome
    unavailable_because: str = NO_APPROVER
    """Why no approver could answer (meaningful for UNAVAILABLE only)."""


class Decided(enum.Enum):
    """What became of an answer."""

    WON = "won"
    NOT_PENDING = "not-pending"  # another answer won, or the request ended (or expired)
    UNKNOWN = "unknown"  # no such request, or one the answerer may not see


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A pending request as the unary listing shows it, with its place in the ask order."""

    position: int
    request: ApprovalRequest
    asked_at: float


def _everyone(_agent: str) -> bool:
    return True


class ApproverSession:
    def __init__(
        self,
        approver_id: str,
        name: str,
        admits: Callable[[str], bool],
        max_receive_bytes: int,
    ) -> None:
        self.approver_id = approver_id
        self.name = name
        self.admits = admits
        """Whether this approver may see and answer requests of an agent (`""`: global)."""
        self.max_receive_bytes = max_receive_bytes
        """The largest request message this approver can receive (encoded bytes)."""
        self.outbox: asyncio.Queue[ApproverMessage] = asyncio.Queue()

    def receives(self, agent: str, encoded_bytes: int) -> bool:
        """Whether a request of `agent` whose message takes `encoded_bytes` is sent here."""
        return self.admits(agent) and encoded_bytes <= self.max_receive_bytes


@dataclass
class _Pending:
    request: ApprovalRequest
    encoded_bytes: int
    future: asyncio.Future[ApprovalResolution] | None  # None: another registry's request
    position: int
    asked_at: float


class ApprovalBroker:
    def __init__(
        self,
        limits: ReceiveLimits,
        encoded_bytes: Callable[[ApprovalRequest], int],
        store: ApprovalStore | None = None,
        *,
        poll_s: float = 2.0,
        expiry_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`encoded_bytes(request)`: the size of the message that carries `request` to an
        approver (the transport's encoding), compared with what each approver receives.
        `store`: where requests are records shared with other registries (None: this
        process only). `expiry_s`: how long a request waits at most (0: until answered)."""
        self._limits = limits
        self._encoded_bytes = encoded_bytes
        self._store = store
        self._poll_s = poll_s
        self._expiry_s = expiry_s
        self._clock = clock
        self._approvers: dict[str, ApproverSession] = {}
        self._pending: dict[str, _Pending] = {}
        self._asking: set[str] = set()  # being added to the store by this process
        self._ended: OrderedDict[str, tuple[str, ApprovalOutcome]] = OrderedDict()
        self._approver_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._positions = itertools.count(1)  # the ask order without a store
        self._tasks: set[asyncio.Task[None]] = set()
        self._follower: ChangeFollower | None = None

    @property
    def connected(self) -> int:
        return len(self._approvers)

    @property
    def in_store(self) -> bool:
        return self._store is not None

    @property
    def store(self) -> ApprovalStore | None:
        return self._store

    # -- following the store ---------------------------------------------------------------

    async def start(self) -> None:
        """With a store: reads what is pending now, then follows what other registries ask
        and answer (their notifications, and a poll every `poll_s`)."""
        if self._store is None or self._follower is not None:
            return
        try:  # at start, before any call: what registries that are gone left is interrupted
            await self._refresh()
        except CodemodeError as exc:  # the store reports itself unavailable; the poll retries
            log.error("approvals: cannot read the pending approvals: %s", exc.message)
        follower = self._follower = ChangeFollower(self._refresh, "approvals")
        self._store.follow(lambda: follower.changed(None))
        follower.poll(self._poll_s)

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.close()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _refresh(self, _ids: object = None) -> None:
        """Brings this registry's view to the store's: interrupts what registries that are
        gone left pending, delivers other registries' new requests, withdraws what ended
        elsewhere, and cancels a record of this process that nobody waits on any more (its
        cancellation could not be written when the call went away)."""
        store = self._store
        assert store is not None
        pending = await store.pending(limit=_VIEW_LIMIT)
        if any(record.asked_by != store.asker_id for record in pending):
            # Only another registry's record can be an orphan (a write, so not every poll).
            orphans = await store.interrupt_orphans(at=self._clock())
            for record in orphans:
                self._apply(record)
            if orphans:
                ended = {record.approval_id for record in orphans}
                pending = [record for record in pending if record.approval_id not in ended]
        live = {record.approval_id for record in pending}
        for record in pending:
            approval_id = record.approval_id
            if approval_id in self._pending or approval_id in self._asking:
                continue
            if record.asked_by == store.asker_id:  # its call went away (or was answered)
                self._spawn(self._conclude(approval_id, ApprovalState.CANCELLED))
            elif approval_id not in self._ended:
                self._deliver(_remote(record, self._encoded_bytes))
        gone = [approval_id for approval_id in self._pending if approval_id not in live]
        if gone:
            for record in await store.get(gone):
                if record.state is not ApprovalState.PENDING:
                    self._apply(record)

    def _apply(self, record: ApprovalRecord) -> None:
        """A record that ended (anywhere): its waiting call and its approvers learn it."""
        outcome = _OUTCOME_OF[record.state]
        pending = self._pending.get(record.approval_id)
        if pending is None:
            self._remember(record.approval_id, record.agent, outcome)
            return
        self._settle(pending, ApprovalResolution(outcome))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _conclude(self, approval_id: str, state: ApprovalState) -> None:
        """Ends a record in the store as this registry (expired, or cancelled when its caller
        went away); whatever won is applied here. A store that fails leaves the record to the
        next refresh (an expiry is still applied here: the call does not wait on the store)."""
        store = self._store
        assert store is not None
        try:
            now = self._clock()
            self._apply(await store.resolve(approval_id, state, by=store.asker_id, at=now))
        except ApprovalNotPending as refused:
            if refused.stored is not None and refused.stored.state is not ApprovalState.PENDING:
                self._apply(refused.stored)
        except CodemodeError as exc:
            log.warning("approvals: cannot record %s of %s: %s", state.value, approval_id, exc)
            pending = self._pending.get(approval_id)
            if state is ApprovalState.EXPIRED and pending is not None:
                self._settle(pending, ApprovalResolution(ApprovalOutcome.EXPIRED))

    # -- approvers -------------------------------------------------------------------------

    def connect(
        self, name: str, admits: Callable[[str], bool] = _everyone, max_receive_bytes: int = 0
    ) -> ApproverSession:
        """A session for an approver that declared it receives `max_receive_bytes` (see
        `ReceiveLimits.of`)."""
        session = ApproverSession(
            f"approver-{next(self._approver_ids)}",
            name,
            admits,
            self._limits.of(max_receive_bytes),
        )
        self._approvers[session.approver_id] = session
        # A newly connected approver also sees requests that are already waiting.
        for pending in self._pending.values():
            if session.receives(pending.request.agent, pending.encoded_bytes):
                session.outbox.put_nowait(pending.request)
        return session

    def disconnect(self, session: ApproverSession) -> None:
        self._approvers.pop(session.approver_id, None)
        if self._store is not None:
            return  # a stored request waits for approvers anywhere
        for pending in list(self._pending.values()):
            if not self._audience_of(pending):
                agent, encoded_bytes = pending.request.agent, pending.encoded_bytes
                self._settle(pending, self._unavailable(agent, encoded_bytes))

    def _audience(self, agent: str, encoded_bytes: int) -> list[ApproverSession]:
        """The approvers a request is sent to: those that admit its agent and receive it."""
        return [s for s in self._approvers.values() if s.receives(agent, encoded_bytes)]

    def _unavailable(self, agent: str, encoded_bytes: int) -> ApprovalResolution:
        limits = [s.max_receive_bytes for s in self._approvers.values() if s.admits(agent)]
        if not limits:
            return ApprovalResolution(ApprovalOutcome.UNAVAILABLE)
        largest = max(limits)
        because = too_large("approval request", encoded_bytes, largest, "any connected approver")
        return ApprovalResolution(ApprovalOutcome.UNAVAILABLE, because)

    def next_id(self) -> str:
        """A request id; with a store, unique across the registries sharing it (and not
        guessable: the id of another tenant's request is not found by counting)."""
        if self._store is not None:
            return f"approval-{uuid.uuid4().hex}"
        return f"approval-{next(self._request_ids)}"

    # -- answers ---------------------------------------------------------------------------

    async def answer(
        self, approval_id: str, outcome: ApprovalOutcome, by: ApproverSession | None = None
    ) -> bool:
        """Records an approver stream's answer; False when the request is no longer open, or
        is one `by` may not answer or was not sent (told apart from nothing: the id of
        another agent's request reveals nothing)."""
        sees: Callable[[str, int], bool] = (
            (lambda _agent, _size: True) if by is None else by.receives
        )
        answered_by = "" if by is None else f"{by.approver_id}:{by.name}"
        return await self.decide(approval_id, outcome, sees, answered_by) is Decided.WON

    async def decide(
        self,
        approval_id: str,
        outcome: ApprovalOutcome,
        sees: Callable[[str, int], bool],
        answered_by: str,
    ) -> Decided:
        """An answer (ALLOWED_ONCE or REJECTED) from one who `sees(agent, encoded_bytes)`:
        WON when it is the first; else whether the request ended (NOT_PENDING) or is none
        this answerer may know of (UNKNOWN). With a store the answer is the store's
        conditional update, so the first answer on any registry wins; a store that fails
        raises its error and changes nothing."""
        state = _ANSWERS[outcome]
        pending = self._pending.get(approval_id)
        if pending is not None and not sees(pending.request.agent, pending.encoded_bytes):
            return Decided.UNKNOWN
        store = self._store
        if store is None:
            if pending is None:
                return self._ended_for(approval_id, sees)
            self._settle(pending, ApprovalResolution(outcome))
            return Decided.WON
        if pending is None:
            # Not in this registry's view (yet): the store knows whether it is one to answer.
            found = await store.get([approval_id])
            if not found or not sees(found[0].agent, self._encoded_bytes(_request_of(found[0]))):
                return self._ended_for(approval_id, sees)
            if found[0].state is not ApprovalState.PENDING:
                self._apply(found[0])
                return Decided.NOT_PENDING
        try:
            record = await store.resolve(approval_id, state, by=answered_by, at=self._clock())
        except ApprovalNotPending as refused:
            if refused.stored is None:
                return Decided.UNKNOWN
            if refused.stored.state is not ApprovalState.PENDING:
                self._apply(refused.stored)
            return Decided.NOT_PENDING  # ended, or past its expiry
        self._apply(record)
        return Decided.WON

    def _ended_for(self, approval_id: str, sees: Callable[[str, int], bool]) -> Decided:
        ended = self._ended.get(approval_id)
        if ended is not None and sees(ended[0], 0):
            return Decided.NOT_PENDING
        return Decided.UNKNOWN

    async def listing(
        self, admits: Callable[[str], bool], *, after: int, limit: int
    ) -> tuple[list[PendingApproval], int]:
        """The pending requests `admits` lets one see, in ask order after `after`, at most
        `limit`; and where the next page starts (0: this was the last). With a store, what
        every registry sharing it waits on, read from the store; at most `_LIST_SCAN`
        records are read per page, so a page may hold fewer than `limit`."""
        if self._store is None:
            rows = [
                PendingApproval(p.position, p.request, p.asked_at)
                for p in sorted(self._pending.values(), key=lambda p: p.position)
                if p.position > after and admits(p.request.agent)
            ]
            return rows[:limit], (rows[limit - 1].position if len(rows) > limit else 0)
        found: list[PendingApproval] = []
        scanned = 0
        cursor = after
        while scanned < _LIST_SCAN:
            asked = min(500, _LIST_SCAN - scanned)
            page = await self._store.pending(after=cursor, limit=asked)
            scanned += len(page)
            for record in page:
                if admits(record.agent):
                    if len(found) == limit:
                        return found, found[-1].position
                    request = _request_of(record)
                    found.append(PendingApproval(record.position, request, record.asked_at))
                cursor = record.position
            if len(page) < asked:
                return found, 0
        return found, cursor

    # -- requests --------------------------------------------------------------------------

    async def request(
        self, request: ApprovalRequest, signal: AbortSignal, *, expires_in_s: float | None = None
    ) -> ApprovalResolution:
        """Waits for the first answer; `expires_in_s` (else `expiry_s`; 0: never) ends it
        unanswered as EXPIRED. With a store, a store that fails before the request is
        recorded raises its error (the call fails, nothing is asked)."""
        expiry = self._expiry_s if expires_in_s is None else expires_in_s
        now = self._clock()
        if expiry > 0:
            request = dataclasses.replace(request, expires_at=now + expiry)
        encoded_bytes = self._encoded_bytes(request)
        store = self._store
        position = next(self._positions)
        if store is None:
            if not self._audience(request.agent, encoded_bytes):
                return self._unavailable(request.agent, encoded_bytes)
        else:
            self._asking.add(request.approval_id)
            try:
                stored = await store.add(_record_of(request, store.asker_id, now))
            finally:
                self._asking.discard(request.approval_id)
            position = stored.position
        future: asyncio.Future[ApprovalResolution] = asyncio.get_running_loop().create_future()
        pending = _Pending(request, encoded_bytes, future, position, now)
        self._deliver(pending)
        remove = signal.add_listener(lambda _reason: self._cancel(pending))
        timer = (
            asyncio.get_running_loop().call_later(expiry, self._expire, pending)
            if expiry > 0
            else None
        )
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self._cancel(pending)
            raise
        finally:
            remove()
            if timer is not None:
                timer.cancel()

    def _deliver(self, pending: _Pending) -> None:
        self._pending[pending.request.approval_id] = pending
        for session in self._audience_of(pending):
            session.outbox.put_nowait(pending.request)

    def _cancel(self, pending: _Pending) -> None:
        """The caller went away: its wait ends now; the store's record is cancelled after."""
        if pending.future is None or pending.future.done():
            return
        self._settle(pending, ApprovalResolution(ApprovalOutcome.CANCELLED))
        if self._store is not None:
            self._spawn(self._conclude(pending.request.approval_id, ApprovalState.CANCELLED))

    def _expire(self, pending: _Pending) -> None:
        if self._store is None:
            self._settle(pending, ApprovalResolution(ApprovalOutcome.EXPIRED))
        else:  # an answer on another registry may have come first: the store decides
            self._spawn(self._conclude(pending.request.approval_id, ApprovalState.EXPIRED))

    def _audience_of(self, pending: _Pending) -> list[ApproverSession]:
        return self._audience(pending.request.agent, pending.encoded_bytes)

    def _remember(self, approval_id: str, agent: str, outcome: ApprovalOutcome) -> None:
        self._ended[approval_id] = (agent, outcome)
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)

    def _settle(self, pending: _Pending, resolution: ApprovalResolution) -> None:
        approval_id = pending.request.approval_id
        if self._pending.get(approval_id) is not pending:
            return
        del self._pending[approval_id]
        self._remember(approval_id, pending.request.agent, resolution.outcome)
        if pending.future is not None and not pending.future.done():
            pending.future.set_result(resolution)
        # Only the approvers that were sent the request hear that it is withdrawn.
        withdrawn = ApprovalWithdrawn(approval_id, resolution.outcome)
        for session in self._audience_of(pending):
            session.outbox.put_nowait(withdrawn)


def _record_of(request: ApprovalRequest, asker_id: str, now: float) -> ApprovalRecord:
    return ApprovalRecord(
        request.approval_id,
        request.agent,
        request.principal,
        request.call_id,
        request.tool_name,
        request.arguments_json,
        request.reason,
        asker_id,
        now,
        request.expires_at,
    )


def _request_of(record: ApprovalRecord) -> ApprovalRequest:
    return ApprovalRequest(
        record.approval_id,
        record.call_id,
        record.agent,
        record.tool_name,
        record.arguments_json,
        record.reason,
        record.principal,
        record.expires_at,
    )


def _remote(record: ApprovalRecord, encoded_bytes: Callable[[ApprovalRequest], int]) -> _Pending:
    request = _request_of(record)
    return _Pending(request, encoded_bytes(request), None, record.position, record.asked_at)
