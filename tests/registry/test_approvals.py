"""Approver streams: allowed, rejected, none connected, cancelled, two approvers racing, a
request larger than an approver receives; expiry; approvals in a SQLite file (unary answers,
a restart interrupts what was left pending); the `approvals_in_store` rule."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_client import Approver, open_channel
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from registry_service.config import ConfigError, RegistrySettings
from registry_service.domain.policy import Ask, PreDecision
from registry_service.registry import build_registry
from tests.registry.conftest import Harness, echo_tool, watch_outcomes


async def _ask_for(harness: Harness, name: str) -> str:
    async def pre(e: Any, d: PreDecision) -> PreDecision:
        return Ask(f"{e.name} changes files") if e.name == name else d

    harness.registry.catalog.hooks("").pre_execute.append(pre)
    echo_tool(harness.registry, name)
    return await harness.agent("a")


async def _approver(harness: Harness, name: str = "human") -> Any:
    call = harness.stub.Approve()
    await call.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name=name)))
    opened = await call.read()
    assert opened.WhichOneof("message") == "opened"
    return call


async def _decide(call: Any, approval_id: str, outcome: rpb.ApprovalOutcome.ValueType) -> None:
    await call.write(
        rpb.ApproveRequest(decision=rpb.ApprovalDecision(approval_id=approval_id, outcome=outcome))
    )


@pytest.mark.parametrize(
    ("outcome", "error"),
    [
        (rpb.APPROVAL_OUTCOME_ALLOWED_ONCE, None),
        (rpb.APPROVAL_OUTCOME_REJECTED, 'the user rejected tool "write"'),
    ],
)
async def test_allowed_and_rejected(
    harness: Harness, outcome: rpb.ApprovalOutcome.ValueType, error: str | None
) -> None:
    agent = await _ask_for(harness, "write")
    approver = await _approver(harness)
    call = asyncio.create_task(harness.execute("write", {"p": 1}, agent=agent))
    request = (await approver.read()).request
    assert (request.tool_name, request.agent, request.arguments_json) == ("write", agent, '{"p":1}')
    assert request.call_id == "call-1"
    assert request.reason == "write changes files"
    await _decide(approver, request.approval_id, outcome)
    events, result = await call
    assert [e.WhichOneof("event") for e in events] == [
        "started",
        "approval_pending",
        "approval_resolved",
    ]
    assert events[1].approval_pending.approval_id == request.approval_id
    assert events[2].approval_resolved.outcome == outcome
    if error is None:
        assert not result.is_error
    else:
        assert result.error.message == error
    withdrawn = (await approver.read()).withdrawn
    assert withdrawn.approval_id == request.approval_id
    approver.cancel()


async def test_two_approvers_first_answer_wins(harness: Harness) -> None:
    agent = await _ask_for(harness, "write")
    one, two = await _approver(harness, "one"), await _approver(harness, "two")
    call = asyncio.create_task(harness.execute("write", agent=agent))
    r1, r2 = (await one.read()).request, (await two.read()).request
    assert r1.approval_id == r2.approval_id
    await _decide(two, r2.approval_id, rpb.APPROVAL_OUTCOME_REJECTED)
    _, result = await call
    await _decide(one, r1.approval_id, rpb.APPROVAL_OUTCOME_ALLOWED_ONCE)  # too late: ignored
    assert result.error.message == 'the user rejected tool "write"'
    assert (await one.read()).withdrawn.outcome == rpb.APPROVAL_OUTCOME_REJECTED
    one.cancel()
    two.cancel()


async def test_caller_cancellation_cancels_the_wait(harness: Harness) -> None:
    agent = await _ask_for(harness, "write")
    seen = watch_outcomes(harness, agent)
    ran: list[str] = []

    async def body(inv: Any) -> Any:
        ran.append(inv.call_id)

    harness.registry.register_tool("write", body, scope=agent)  # shadows the echo tool
    approver = await _approver(harness)
    stream = harness.stub.ExecuteToolCall(
        rpb.ExecuteToolCallRequest(agent=agent, call_id="c", tool_name="write")
    )
    await stream.read()
    await stream.read()  # approval_pending
    request = (await approver.read()).request
    stream.cancel()
    withdrawn = (await approver.read()).withdrawn
    assert (withdrawn.approval_id, withdrawn.outcome) == (
        request.approval_id,
        rpb.APPROVAL_OUTCOME_CANCELLED,
    )
    # Cancelled approval + aborted caller → ABORTED_BEFORE_DISPATCH, and the
    # result still receives post-execute.
    record = await harness.settled(agent, "c")
    assert (record.is_error, record.error_code) == (True, "ABORTED_BEFORE_DISPATCH")
    assert seen == [
        ("post", "c", "ABORTED_BEFORE_DISPATCH"),
        ("observe", "c", "ABORTED_BEFORE_DISPATCH"),
    ]
    assert ran == []
    approver.cancel()


async def test_last_approver_leaving_makes_it_unavailable(harness: Harness) -> None:
    agent = await _ask_for(harness, "write")
    approver = await _approver(harness)
    call = asyncio.create_task(harness.execute("write", agent=agent))
    await approver.read()
    approver.cancel()
    _, result = await asyncio.wait_for(call, 5)
    assert "no approval channel is available" in result.error.message


async def test_invalid_decision_ends_the_approver_stream(harness: Harness) -> None:
    approver = await _approver(harness)
    await _decide(approver, "x", rpb.APPROVAL_OUTCOME_CANCELLED)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await approver.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_approvals_only_progress_keeps_the_approval_events(harness: Harness) -> None:
    agent = await _ask_for(harness, "write")
    approver = await _approver(harness)
    call = asyncio.create_task(
        harness.execute("write", {}, agent=agent, progress=rpb.PROGRESS_EVENTS_APPROVALS)
    )
    request = (await approver.read()).request
    await _decide(approver, request.approval_id, rpb.APPROVAL_OUTCOME_ALLOWED_ONCE)
    events, result = await call
    assert [e.WhichOneof("event") for e in events] == ["approval_pending", "approval_resolved"]
    assert not result.is_error


async def _until_request(call: Any) -> rpb.ApprovalRequest:
    """The next request on a raw approver stream, past any withdrawals."""
    while (message := await call.read()).WhichOneof("message") != "request":
        assert message.WhichOneof("message") == "withdrawn", message
    request: rpb.ApprovalRequest = message.request
    return request


async def test_a_request_larger_than_the_approver_receives_is_not_sent(harness: Harness) -> None:
    """An approver on a plain gRPC channel receives at most 4 MiB (gRPC's default). A larger
    request used to end its stream there, cutting every agent's approvals; now it is not sent:
    with no approver that can receive it the call is DENIED saying so (outcome UNAVAILABLE),
    and the same stream goes on answering another agent's requests."""
    await _ask_for(harness, "write")
    first, second = await harness.agent("first"), await harness.agent("second")
    approver = await _approver(harness)  # the harness's channel is a plain one
    caller = open_channel(harness.running.address)  # the caller's channel sends enough
    agents = Harness(harness.running, caller)
    try:
        # The approver reads throughout, as a real one does: a request it cannot receive would
        # end its stream here (RESOURCE_EXHAUSTED on its side).
        reading = asyncio.create_task(_until_request(approver))
        big = asyncio.create_task(
            agents.execute("write", {"text": "x" * (5 << 20)}, agent=first, call_id="big")
        )
        await asyncio.wait({reading, big}, return_when=asyncio.FIRST_COMPLETED)
        assert not reading.done(), reading  # nothing reached the approver, nor broke its stream
        events, refused = await big
        assert refused.is_error and refused.error.code == "DENIED", refused.error
        assert "larger than the 4194304 bytes any connected approver" in refused.error.message
        assert events[-1].approval_resolved.outcome == rpb.APPROVAL_OUTCOME_UNAVAILABLE
        record = await agents.settled(first, "big")
        assert (record.is_error, record.error_code) == (True, "DENIED")

        call = asyncio.create_task(agents.execute("write", {"p": 2}, agent=second, call_id="b"))
        request = await reading  # the first request the approver received
        assert (request.agent, request.call_id) == (second, "b")
        await _decide(approver, request.approval_id, rpb.APPROVAL_OUTCOME_ALLOWED_ONCE)
        _, allowed = await call
        assert not allowed.is_error, allowed.error
    finally:
        approver.cancel()
        await caller.close()


async def test_a_large_request_goes_to_the_approvers_that_receive_it(harness: Harness) -> None:
    """The client's approvers declare their channel's limit: on `open_channel` (64 MiB) one is
    sent a 5 MiB request and answers it; one on a plain channel is not, and is still served."""
    agent = await _ask_for(harness, "write")
    roomy_channel = open_channel(harness.running.address)
    seen: dict[str, list[str]] = {"roomy": [], "plain": []}

    def recorder(name: str, allow: bool) -> Any:
        def decide(request: rpb.ApprovalRequest) -> bool:
            seen[name].append(request.call_id)
            return allow

        return decide

    roomy = Approver(roomy_channel, "roomy", recorder("roomy", True))
    plain = Approver(harness.channel, "plain", recorder("plain", False))
    agents = Harness(harness.running, roomy_channel)
    try:
        async with plain, roomy:
            _, big = await agents.execute("write", {"text": "y" * (5 << 20)}, agent=agent)
            assert not big.is_error, big.error  # the roomy approver allowed it
            assert seen == {"roomy": ["call-1"], "plain": []}
        # With only the plain approver left, the same request is too large for all of them.
        async with plain:
            _, refused = await agents.execute(
                "write", {"text": "y" * (5 << 20)}, agent=agent, call_id="again"
            )
            assert "larger than the 4194304 bytes" in refused.error.message
            _, small = await agents.execute("write", {"p": 1}, agent=agent, call_id="small")
            assert small.error.message == 'the user rejected tool "write"'
            assert seen["plain"] == ["small"]
    finally:
        await roomy_channel.close()


async def test_the_last_approver_that_receives_a_request_leaving_makes_it_unavailable(
    harness: Harness,
) -> None:
    """A request only a roomy approver was sent: when it leaves, the plain one still connected
    cannot receive it, so the outcome is UNAVAILABLE saying why (and the plain one hears
    nothing of it, not even a withdrawal)."""
    agent = await _ask_for(harness, "write")
    roomy_channel = open_channel(harness.running.address)
    try:
        roomy = rpb_grpc.RegistryServiceStub(roomy_channel).Approve()
        opening = rpb.OpenApprover(approver_name="roomy", max_receive_message_bytes=64 << 20)
        await roomy.write(rpb.ApproveRequest(open=opening))
        assert (await roomy.read()).WhichOneof("message") == "opened"
        plain = await _approver(harness, "plain")
        agents = Harness(harness.running, roomy_channel)
        call = asyncio.create_task(agents.execute("write", {"text": "z" * (5 << 20)}, agent=agent))
        assert (await roomy.read()).request.call_id == "call-1"
        roomy.cancel()
        events, result = await call
        assert events[-1].approval_resolved.outcome == rpb.APPROVAL_OUTCOME_UNAVAILABLE
        assert "larger than the 4194304 bytes any connected approver" in result.error.message
        small = asyncio.create_task(agents.execute("write", agent=agent, call_id="small"))
        request = (await plain.read()).request  # its first message: nothing of call-1 came
        assert request.call_id == "small"
        await _decide(plain, request.approval_id, rpb.APPROVAL_OUTCOME_ALLOWED_ONCE)
        _, allowed = await small
        assert not allowed.is_error, allowed.error
        plain.cancel()
    finally:
        await roomy_channel.close()


async def test_an_approval_expires_unanswered_in_memory(make_registry: Any) -> None:
    """`approval_expiry_s` without a store: the connected approver does not answer, the call
    is DENIED saying so, and the approver hears it withdrawn as EXPIRED."""
    async with make_registry(approval_expiry_s=0.2) as h:
        assert not h.registry.approvals.in_store
        agent = await _ask_for(h, "write")
        approver = await _approver(h)
        events, result = await h.execute("write", agent=agent)
        assert result.error.message == 'the approval of tool "write" expired before anyone answered'
        assert events[-1].approval_resolved.outcome == rpb.APPROVAL_OUTCOME_EXPIRED
        request = (await approver.read()).request
        assert request.HasField("expire_time")
        withdrawn = (await approver.read()).withdrawn
        assert (withdrawn.approval_id, withdrawn.outcome) == (
            request.approval_id,
            rpb.APPROVAL_OUTCOME_EXPIRED,
        )
        answer = rpb.ResolveApprovalRequest(
            approval_id=request.approval_id, outcome=rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
        )
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await h.stub.ResolveApproval(answer)
        assert late.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        approver.cancel()


async def test_approvals_in_a_sqlite_file_wait_without_an_approver_and_a_restart_interrupts(
    make_registry: Any, tmp_path: Path
) -> None:
    """A history file outlives the process, so approvals are records (`approvals_in_store`
    unset): a request waits with no approver connected and is answered by ResolveApproval; a
    request left pending by a registry that stopped without cancelling it is interrupted by
    the next one on the file."""
    path = str(tmp_path / "history.sqlite3")
    async with make_registry(history_path=path) as h:
        assert h.registry.approvals.in_store
        agent = await _ask_for(h, "write")
        call = asyncio.create_task(h.execute("write", agent=agent))
        listed: Any = None
        for _ in range(1500):  # a latch: the request is recorded
            listed = await h.stub.ListPendingApprovals(rpb.ListPendingApprovalsRequest())
            if listed.approvals:
                break
            await asyncio.sleep(0.02)
        [request] = listed.approvals
        await h.stub.ResolveApproval(
            rpb.ResolveApprovalRequest(
                approval_id=request.approval_id, outcome=rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
            )
        )
        _, result = await call
        assert not result.is_error
    # A record a crashed registry left pending (written as it would have been).
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO approvals (approval_id, agent, principal, call_id, tool_name,"
            " arguments_json, reason, asked_by, asked_at, state, answered_by) VALUES"
            " ('approval-left', 'agents/a', '', 'c', 'write', '{}', 'r', 'gone', 1, 'pending', '')"
        )
    async with make_registry(history_path=path) as h:
        listed = await h.stub.ListPendingApprovals(rpb.ListPendingApprovalsRequest())
        assert list(listed.approvals) == []
        with sqlite3.connect(path) as db:
            rows = db.execute(
                "SELECT approval_id, state FROM approvals ORDER BY position"
            ).fetchall()
        assert rows == [(request.approval_id, "allowed-once"), ("approval-left", "interrupted")]


def test_approvals_in_store_needs_a_history_that_outlives_the_process() -> None:
    settings = RegistrySettings(history_path=":memory:", approvals_in_store=True)
    with pytest.raises(ConfigError, match="approvals_in_store"):
        build_registry(settings)
    memory = build_registry(RegistrySettings(history_path=":memory:"))
    assert not memory.approvals.in_store
