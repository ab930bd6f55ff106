"""Approval routing: connected approvers receive every request; the first answer wins.

With no approver connected the outcome is UNAVAILABLE (also when the last approver leaves while
a request is open); the caller's cancellation resolves the wait as CANCELLED. Every approver
that did not win is told the request was withdrawn, so UIs can close their prompts.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
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


class ApproverSession:
    def __init__(self, approver_id: str, name: str) -> None:
        self.approver_id = approver_id
        self.name = name
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

    def connect(self, name: str) -> ApproverSession:
        session = ApproverSession(f"approver-{next(self._approver_ids)}", name)
        self._approvers[session.approver_id] = session
        # A newly connected approver also sees requests that are already waiting.
        for pending in self._pending.values():
            session.outbox.put_nowait(pending.request)
        return session

    def disconnect(self, session: ApproverSession) -> None:
        self._approvers.pop(session.approver_id, None)
        if not self._approvers:
            for pending in list(self._pending.values()):
                self._settle(pending, ApprovalOutcome.UNAVAILABLE)

    def next_id(self) -> str:
        return f"approval-{next(self._request_ids)}"

    def answer(self, approval_id: str, outcome: ApprovalOutcome) -> bool:
        """Records an approver's answer; False when the request is no longer open."""
        pending = self._pending.get(approval_id)
        if pending is None:
            return False
        self._settle(pending, outcome)
        return True

    async def request(self, request: ApprovalRequest, signal: AbortSignal) -> ApprovalOutcome:
        if not self._approvers:
            return ApprovalOutcome.UNAVAILABLE
        future: asyncio.Future[ApprovalOutcome] = asyncio.get_running_loop().create_future()
        pending = _Pending(request, future)
        self._pending[request.approval_id] = pending
        remove = signal.add_listener(
            lambda _reason: self._settle(pending, ApprovalOutcome.CANCELLED)
        )
        for session in self._approvers.values():
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
        for session in self._approvers.values():
            session.outbox.put_nowait(withdrawn)
