"""Approval routing: connected approvers receive every request they may answer (`admits`:
the agents an approver's principal may approve for); the first answer wins.

With no such approver connected the outcome is UNAVAILABLE (also when the last one leaves while
a request is open); the caller's cancellation resolves the wait as CANCELLED. Every approver
that saw the request and did not win is told it was withdrawn, so UIs can close their prompts.
An approver never sees, and cannot answer, a request of an agent it does not admit.

Nor is it sent a request larger than its stream receives (it declared its limit, see
receive_limits.py): one agent's large arguments would otherwise end a stream that answers for
every agent. Such a request goes to the approvers that can receive it; with none of them
connected its outcome is UNAVAILABLE, and the resolution says the request was too large.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from registry_service.domain.receive_limits import ReceiveLimits, too_large
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

NO_APPROVER = "no approval channel is available"


@dataclass(frozen=True, slots=True)
class ApprovalResolution:
    outcome: ApprovalOutcome
    unavailable_because: str = NO_APPROVER
    """Why no approver could answer (meaningful for UNAVAILABLE only)."""


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
    future: asyncio.Future[ApprovalResolution]


class ApprovalBroker:
    def __init__(
        self, limits: ReceiveLimits, encoded_bytes: Callable[[ApprovalRequest], int]
    ) -> None:
        """`encoded_bytes(request)`: the size of the message that carries `request` to an
        approver (the transport's encoding), compared with what each approver receives."""
        self._limits = limits
        self._encoded_bytes = encoded_bytes
        self._approvers: dict[str, ApproverSession] = {}
        self._pending: dict[str, _Pending] = {}
        self._approver_ids = itertools.count(1)
        self._request_ids = itertools.count(1)

    @property
    def connected(self) -> int:
        return len(self._approvers)

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
        return f"approval-{next(self._request_ids)}"

    def answer(
        self, approval_id: str, outcome: ApprovalOutcome, by: ApproverSession | None = None
    ) -> bool:
        """Records an approver's answer; False when the request is no longer open, or is one
        `by` may not answer or was not sent (told apart from nothing: the id of another agent's
        request reveals nothing)."""
        pending = self._pending.get(approval_id)
        if pending is None or (
            by is not None and not by.receives(pending.request.agent, pending.encoded_bytes)
        ):
            return False
        self._settle(pending, ApprovalResolution(outcome))
        return True

    async def request(self, request: ApprovalRequest, signal: AbortSignal) -> ApprovalResolution:
        encoded_bytes = self._encoded_bytes(request)
        approvers = self._audience(request.agent, encoded_bytes)
        if not approvers:
            return self._unavailable(request.agent, encoded_bytes)
        future: asyncio.Future[ApprovalResolution] = asyncio.get_running_loop().create_future()
        pending = _Pending(request, encoded_bytes, future)
        self._pending[request.approval_id] = pending
        cancelled = ApprovalResolution(ApprovalOutcome.CANCELLED)
        remove = signal.add_listener(lambda _reason: self._settle(pending, cancelled))
        for session in approvers:
            session.outbox.put_nowait(request)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self._settle(pending, cancelled)
            raise
        finally:
            remove()

    def _audience_of(self, pending: _Pending) -> list[ApproverSession]:
        return self._audience(pending.request.agent, pending.encoded_bytes)

    def _settle(self, pending: _Pending, resolution: ApprovalResolution) -> None:
        if pending.future.done():
            return
        pending.future.set_result(resolution)
        del self._pending[pending.request.approval_id]
        # Only the approvers that were sent the request hear that it is withdrawn.
        withdrawn = ApprovalWithdrawn(pending.request.approval_id, resolution.outcome)
        for session in self._audience_of(pending):
            session.outbox.put_nowait(withdrawn)
