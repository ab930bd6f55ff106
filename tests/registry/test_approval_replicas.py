"""Two registries on one real PostgreSQL, over gRPC only, with approvals in the store: an
approval asked on A is seen by B's approver stream and B's ListPendingApprovals and answered
there; the first answer wins across replicas; a stale or duplicate answer on either replica is
refused (FAILED_PRECONDITION `APPROVAL_NOT_PENDING`) and changes nothing; an expired one
denies its call and refuses a late answer; a missed notification only delays (the poll); a
replica killed while it waits leaves its approval interrupted and its call recorded so. Every
wait is a latch polled with a generous bound; nothing is timed."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from codemode_cli.processes import running
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from registry_service.domain.policy import Ask, PreDecision
from tests.registry.conftest import Harness, echo_tool, error_info_of
from tests.registry.test_replica_catalog import seen  # the replica tests' latch

ALLOW, REJECT = rpb.APPROVAL_OUTCOME_ALLOWED_ONCE, rpb.APPROVAL_OUTCOME_REJECTED


def rows(dsn: str, statement: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement.encode(), params).fetchall()


def ask_for(h: Harness, name: str, expires_in_s: float | None = None) -> None:
    async def pre(e: Any, d: PreDecision) -> PreDecision:
        if e.name == name:
            return Ask(f"{e.name} changes files", expires_in_s=expires_in_s)
        return d

    h.registry.catalog.hooks("").pre_execute.append(pre)
    echo_tool(h.registry, name)


async def approver(h: Harness, name: str) -> Any:
    call = h.stub.Approve()
    await call.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name=name)))
    assert (await call.read()).WhichOneof("message") == "opened"
    return call


async def decide(call: Any, approval_id: str, outcome: rpb.ApprovalOutcome.ValueType) -> None:
    decision = rpb.ApprovalDecision(approval_id=approval_id, outcome=outcome)
    await call.write(rpb.ApproveRequest(decision=decision))


async def pending_on(h: Harness) -> list[str]:
    listed = await h.stub.ListPendingApprovals(rpb.ListPendingApprovalsRequest())
    return [a.approval_id for a in listed.approvals]


async def resolve(h: Harness, approval_id: str, outcome: rpb.ApprovalOutcome.ValueType) -> Any:
    """ResolveApproval: None when the answer won, else the refusal's (code, ErrorInfo reason)."""
    try:
        await h.stub.ResolveApproval(
            rpb.ResolveApprovalRequest(approval_id=approval_id, outcome=outcome)
        )
    except grpc.aio.AioRpcError as error:
        info = error_info_of(error)
        return error.code(), None if info is None else info.reason
    return None


NOT_PENDING = (grpc.StatusCode.FAILED_PRECONDITION, "APPROVAL_NOT_PENDING")


@pytest.fixture
async def replicas(make_registry: Any, pg_database: str) -> AsyncIterator[tuple[Harness, Harness]]:
    settings = {"history_store": "postgres", "history_dsn": pg_database, "approval_poll_s": 0.2}
    async with make_registry(**settings) as a, make_registry(**settings) as b:
        assert a.registry.approvals.in_store and b.registry.approvals.in_store
        ask_for(a, "write")
        await a.agent("coder")
        yield a, b


async def test_asked_on_a_answered_on_b_and_stale_answers_change_nothing(
    replicas: tuple[Harness, Harness], pg_database: str
) -> None:
    a, b = replicas
    on_b = await approver(b, "b-human")
    on_a = await approver(a, "a-human")
    call = asyncio.create_task(a.execute("write", {"p": 1}, agent="agents/coder"))
    request = (await on_b.read()).request  # B's stream: through the store, not A's memory
    assert (request.tool_name, request.agent, request.arguments_json) == (
        "write",
        "agents/coder",
        '{"p":1}',
    )
    assert (await on_a.read()).request.approval_id == request.approval_id
    assert await pending_on(b) == [request.approval_id]
    await decide(on_b, request.approval_id, ALLOW)
    events, result = await call
    assert not result.is_error
    assert events[-1].approval_resolved.outcome == ALLOW
    # Both streams hear it withdrawn: A's approver from A, though B answered.
    for stream in (on_a, on_b):
        withdrawn = (await stream.read()).withdrawn
        assert (withdrawn.approval_id, withdrawn.outcome) == (request.approval_id, ALLOW)
    stored = rows(
        pg_database,
        "SELECT state, answered_by FROM approvals WHERE approval_id = %s",
        request.approval_id,
    )
    assert stored[0][0] == "allowed-once" and "b-human" in stored[0][1]

    # Late answers, on either replica and either way, are refused and change nothing.
    for h in (a, b):
        assert await resolve(h, request.approval_id, REJECT) == NOT_PENDING
        assert await resolve(h, request.approval_id, ALLOW) == NOT_PENDING
    await decide(on_a, request.approval_id, REJECT)  # a stream's late decision: ignored
    assert (
        rows(
            pg_database,
            "SELECT state, answered_by FROM approvals WHERE approval_id = %s",
            request.approval_id,
        )
        == stored
    )
    assert await pending_on(a) == [] and await pending_on(b) == []
    on_a.cancel()
    on_b.cancel()


async def test_a_unary_approver_on_b_rejects_and_racing_answers_have_one_winner(
    replicas: tuple[Harness, Harness], pg_database: str
) -> None:
    a, b = replicas
    # No approver stream anywhere: with the store the call waits for one (or a unary answer).
    first = asyncio.create_task(a.execute("write", {"n": 1}, agent="agents/coder", call_id="c1"))
    [approval_id] = await seen(lambda: pending_on(b), lambda ids: len(ids) == 1, "pending on B")
    assert await resolve(b, approval_id, REJECT) is None
    _, result = await first
    assert result.error.message == 'the user rejected tool "write"'

    second = asyncio.create_task(a.execute("write", {"n": 2}, agent="agents/coder", call_id="c2"))
    [approval_id] = await seen(lambda: pending_on(b), lambda ids: len(ids) == 1, "pending on B")
    answers = await asyncio.gather(
        resolve(a, approval_id, ALLOW),
        resolve(b, approval_id, REJECT),
        resolve(b, approval_id, ALLOW),
    )
    assert sorted(answers, key=lambda r: r is not None)[0] is None
    assert [r for r in answers if r is not None] == [NOT_PENDING, NOT_PENDING]
    winner = answers.index(None)
    _, result = await second
    assert result.is_error == (winner == 1)
    [(state,)] = rows(
        pg_database, "SELECT state FROM approvals WHERE approval_id = %s", approval_id
    )
    assert state == ("rejected" if winner == 1 else "allowed-once")


async def test_an_unknown_id_is_not_found_and_a_bad_outcome_is_invalid(
    replicas: tuple[Harness, Harness],
) -> None:
    a, b = replicas
    assert await resolve(b, "approval-nope", ALLOW) == (
        grpc.StatusCode.NOT_FOUND,
        "APPROVAL_NOT_FOUND",
    )
    call = asyncio.create_task(a.execute("write", agent="agents/coder"))
    [approval_id] = await seen(lambda: pending_on(b), lambda ids: len(ids) == 1, "pending on B")
    for outcome in (
        rpb.APPROVAL_OUTCOME_CANCELLED,
        rpb.APPROVAL_OUTCOME_EXPIRED,
        rpb.APPROVAL_OUTCOME_UNSPECIFIED,
    ):
        assert await resolve(b, approval_id, outcome) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_DECISION",
        )
    assert await pending_on(b) == [approval_id]  # nothing changed
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await b.stub.ListPendingApprovals(rpb.ListPendingApprovalsRequest(page_token="x"))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await resolve(b, approval_id, ALLOW) is None
    _, result = await call
    assert not result.is_error


async def test_an_expired_approval_denies_its_call_and_refuses_a_late_answer(
    make_registry: Any, pg_database: str
) -> None:
    settings = {"history_store": "postgres", "history_dsn": pg_database, "approval_poll_s": 0.2}
    async with make_registry(**settings) as a, make_registry(**settings) as b:
        ask_for(a, "write", expires_in_s=0.3)
        await a.agent("coder")
        on_b = await approver(b, "b-human")
        events, result = await a.execute("write", agent="agents/coder")
        assert result.error.message == 'the approval of tool "write" expired before anyone answered'
        assert events[-1].approval_resolved.outcome == rpb.APPROVAL_OUTCOME_EXPIRED
        request = (await on_b.read()).request
        assert request.HasField("expire_time")
        withdrawn = (await on_b.read()).withdrawn
        assert (withdrawn.approval_id, withdrawn.outcome) == (
            request.approval_id,
            rpb.APPROVAL_OUTCOME_EXPIRED,
        )
        assert await resolve(b, request.approval_id, ALLOW) == NOT_PENDING
        [(state,)] = rows(
            pg_database, "SELECT state FROM approvals WHERE approval_id = %s", request.approval_id
        )
        assert state == "expired"
        on_b.cancel()


async def test_a_missed_notification_only_delays(
    replicas: tuple[Harness, Harness], pg_database: str
) -> None:
    """An approval a third registry committed without a notification (written here by SQL):
    B's poll finds it, and B's answer is what the store keeps."""
    _, b = replicas
    on_b = await approver(b, "b-human")
    writer = "c" * 32  # a third registry, alive (its lease holds), that asked without notifying
    rows(
        pg_database,
        "INSERT INTO history_writers (id, expires_at) VALUES (%s, now() + interval '1 hour')"
        " RETURNING id",
        writer,
    )
    rows(
        pg_database,
        "INSERT INTO approvals (approval_id, agent, principal, call_id, tool_name,"
        " arguments_json, reason, asked_by, asked_at, state, answered_by)"
        " VALUES ('approval-quiet', 'agents/coder', '', 'c9', 'write', '{}', 'why', %s,"
        " 1.0, 'pending', '') RETURNING position",
        writer,
    )
    request = (await on_b.read()).request
    assert request.approval_id == "approval-quiet"
    await decide(on_b, "approval-quiet", REJECT)
    withdrawn = (await on_b.read()).withdrawn
    assert (withdrawn.approval_id, withdrawn.outcome) == ("approval-quiet", REJECT)
    assert rows(
        pg_database, "SELECT state FROM approvals WHERE approval_id = 'approval-quiet'"
    ) == [("rejected",)]
    on_b.cancel()


async def test_a_replica_that_dies_leaves_its_approval_interrupted_and_its_call_recorded(
    make_registry: Any, pg_database: str, tmp_path: Path
) -> None:
    """A, a real registry process, asks and is killed (SIGKILL: nothing of it runs after). Once
    its writer lease is gone, B interrupts its pending approval (B's approver hears it
    withdrawn, a late answer is refused) and records its waiting call interrupted."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - tool: run_code\n    action: ask\n")
    env = {
        **os.environ,
        "CODEMODE_REGISTRY_HISTORY_STORE": "postgres",
        "CODEMODE_REGISTRY_HISTORY_DSN": pg_database,
        "CODEMODE_REGISTRY_HISTORY_WRITER_LEASE_S": "1",
        "CODEMODE_REGISTRY_APPROVAL_POLL_S": "0.2",
        "CODEMODE_REGISTRY_POLICY_RULES": str(rules),
        "CODEMODE_REGISTRY_TRACE_FILE": "off",
    }
    settings = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "history_writer_lease_s": 1.0,
        "approval_poll_s": 0.2,
    }
    async with (
        running(
            "-m", "registry_service", "--listen", "127.0.0.1:0",
            ready="registry listening on port ", env=env, stderr=tmp_path / "a.stderr",
        ) as a,
        make_registry(**settings) as b,
    ):  # fmt: skip
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{a.rest}")
        stub = rpb_grpc.RegistryServiceStub(channel)
        await stub.CreateAgent(rpb.CreateAgentRequest(agent_id="coder"))
        on_b = await approver(b, "b-human")
        call = stub.ExecuteToolCall(
            rpb.ExecuteToolCallRequest(
                agent="agents/coder",
                call_id="doomed",
                tool_name="run_code",
                arguments_json='{"code":"1"}',
            )
        )
        request = (await on_b.read()).request
        assert (request.call_id, request.tool_name) == ("doomed", "run_code")
        a.proc.send_signal(signal.SIGKILL)
        await a.proc.wait()
        withdrawn = (await on_b.read()).withdrawn
        assert (withdrawn.approval_id, withdrawn.outcome) == (
            request.approval_id,
            rpb.APPROVAL_OUTCOME_CANCELLED,
        )
        [(state,)] = rows(
            pg_database, "SELECT state FROM approvals WHERE approval_id = %s", request.approval_id
        )
        assert state == "interrupted"
        assert await resolve(b, request.approval_id, ALLOW) == NOT_PENDING
        result = await b.settled("agents/coder", "doomed")
        assert result.error_code == "INTERRUPTED"
        call.cancel()
        await channel.close()
        on_b.cancel()
