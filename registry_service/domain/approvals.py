"""Approval routing: connected approvers receive every request they may answer (`admits`:
the agents an approver's principal may approve for); the first answer wins.

With no such approver connected the outcome is UNAVAILABLE (also when the last one leaves while
a request is open); the caller's cancellation resolves the wait as CANCELLED. Every approver
that saw the request and did not win is told it was withdrawn, so UIs can close their prompts.
An approver never sees, and cannot answer, a request of an agent it does not admit.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from registry_service.domain.signals import AbortSignal


class ApprovalOutcome(enum.Enum):
    ALLOWED_ONCE = "allowed-once"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    approval_id: str
    call_id: str
    agent: str
    tool_name: str
    arguments_json: str
    reason: str


@dataclass(frozen=True, slots=True)
class ApprovalWithdrawn:
    approval_id: str
    outcome: ApprovalOutcome


ApproverMessage = ApprovalRequest | ApprovalWithdrawn


def _everyone(_agent: str) -> bool:
    return True


class ApproverSession:
    def __init__(
        self, approver_id: str, name: str, admits: Callable[[str], bool] = _everyone
    ) -> None:
        self.approver_id = approver_id
        self.name = name
        self.admits = admits
        """Whether this approver may see and answer requests of an agent (`""`: global)."""
        self.outbox: asyncio.Queue[ApproverMessage] = asyncio.Queue()


@dataclass
class _Pending:
    request: ApprovalRequest
    future: asyncio.Future[ApprovalOutcome]


class ApprovalBroker:
    def __init__(self) -> None:
        self._approvers: dict[str, ApproverSession] = {}
        self._pending: dict[str, _Pending] = {}
        self._approver_ids = itertools.count(1)
        self._request_ids = itertools.count(1)

    @property
    def connected(self) -> int:
        return len(self._approvers)

    def connect(self, name: str, admits: Callable[[str], bool] = _everyone) -> ApproverSession:
        session = ApproverSession(f"approver-{next(self._approver_ids)}", name, admits)
        self._approvers[session.approver_id] = session
        # A newly connected approver also sees requests that are already waiting.
        for pending in self._pending.values():
            if admits(pending.request.agent):
                session.outbox.put_nowait(pending.request)
        return session

    def disconnect(self, session: ApproverSession) -> None:
        self._approvers.pop(session.approver_id, None)
        for pending in list(self._pending.values()):
            if not self._approvers_of(pending.request.agent):
                self._settle(pending, ApprovalOutcome.UNAVAILABLE)

    def _approvers_of(self, agent: str) -> list[ApproverSession]:
        return [s for s in self._approvers.values() if s.admits(agent)]

    def next_id(self) -> str:
        return f"approval-{next(self._request_ids)}"

    def answer(
        self, approval_id: str, outcome: ApprovalOutcome, by: ApproverSession | None = None
    ) -> bool:
        """Records an approver's answer; False when the request is no longer open, or is one
        `by` may not answer (told apart from nothing: the id of another agent's request
        reveals nothing)."""
        pending = self._pending.get(approval_id)
        if pending is None or (by is not None and not by.admits(pending.request.agent)):
            return False
        self._settle(pending, outcome)
        return True

    async def request(self, request: ApprovalRequest, signal: AbortSignal) -> ApprovalOutcome:
        approvers = self._approvers_of(request.agent)
        if not approvers:
            return ApprovalOutcome.UNAVAILABLE
        future: asyncio.Future[ApprovalOutcome] = asyncio.get_running_loop().create_future()
        pending = _Pending(request, future)
        self._pending[request.approval_id] = pending
        remove = signal.add_listener(
            lambda _reason: self._settle(pending, ApprovalOutcome.CANCELLED)
        )
        for session in approvers:
            session.outbox.put_nowait(request)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self._settle(pending, ApprovalOutcome.CANCELLED)
            raise
        finally:
            remove()

    def _settle(self, pending: _Pending, outcome: ApprovalOutcome) -> None:
        if pending.future.done():
            return
        pending.future.set_result(outcome)
        del self._pending[pending.request.approval_id]
        withdrawn = ApprovalWithdrawn(pending.request.approval_id, outcome)
        for session in self._approvers_of(pending.request.agent):
            session.outbox.put_nowait(withdrawn)
