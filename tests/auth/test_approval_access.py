"""The unary approver RPCs with authentication on, approvals in this process and in a real
PostgreSQL store: bob, who may approve only for his agent, neither lists nor resolves alice's
approval (its id answers NOT_FOUND exactly like an id that never existed) and changes nothing;
a principal without `approve` anywhere is refused; alice lists and answers her own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.policy import Ask, PreDecision
from registry_service.server import start
from tests.auth.certs import Authority
from tests.auth.conftest import ALICE_TOKEN, AuthRegistry, Signer, auth_settings
from tests.postgres_server import pg_database, postgres
from tests.registry.conftest import echo_tool, error_info_of

__all__ = ["pg_database", "postgres"]


@pytest.fixture(params=["memory", "store"])
async def approvals_registry(
    request: pytest.FixtureRequest, tmp_path: Path, authority: Authority, signer: Signer
) -> AsyncIterator[AuthRegistry]:
    store: dict[str, Any] = {}
    if request.param == "store":
        dsn = request.getfixturevalue("pg_database")
        store = {"history_store": "postgres", "history_dsn": dsn, "approval_poll_s": 0.2}
    running = await start(auth_settings(tmp_path, authority, signer, **store))
    assert running.registry.approvals.in_store == (request.param == "store")

    async def ask(e: Any, d: PreDecision) -> PreDecision:
        return Ask("writes") if e.name == "write" else d

    running.registry.catalog.hooks("").pre_execute.append(ask)
    echo_tool(running.registry, "write")
    harness = AuthRegistry(running, authority, signer, tmp_path)
    try:
        yield harness
    finally:
        await harness.close()
        await running.stop(0)


async def _refusal(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    return caught.value.code(), "" if info is None else info.reason


async def test_bob_cannot_list_or_resolve_alices_approval(
    approvals_registry: AuthRegistry, signer: Signer
) -> None:
    h = approvals_registry
    alice, alice_md = h.stub(bearer=ALICE_TOKEN)
    bob, bob_md = h.stub(bearer=signer.token("bob"))
    admin, admin_md = h.stub(cert="spiffe://codemode/admin")
    # Without a store a request waits only while an approver that may answer it is connected.
    keeper = alice.Approve(metadata=alice_md)
    await keeper.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="keeper")))
    assert (await keeper.read()).WhichOneof("message") == "opened"

    request = rpb.ExecuteToolCallRequest(
        agent="agents/alice", call_id="a-1", tool_name="write", arguments_json='{"secret":1}'
    )
    responses = alice.ExecuteToolCall(request, metadata=alice_md, timeout=60)
    call = asyncio.ensure_future(_last(responses))
    approval_id = (await keeper.read()).request.approval_id

    listed = await bob.ListPendingApprovals(rpb.ListPendingApprovalsRequest(), metadata=bob_md)
    assert list(listed.approvals) == [] and listed.next_page_token == ""
    unknown = await _refusal(
        bob.ResolveApproval(
            rpb.ResolveApprovalRequest(
                approval_id="approval-0123", outcome=rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
            ),
            metadata=bob_md,
        )
    )
    assert unknown == (grpc.StatusCode.NOT_FOUND, "APPROVAL_NOT_FOUND")
    for outcome in (rpb.APPROVAL_OUTCOME_ALLOWED_ONCE, rpb.APPROVAL_OUTCOME_REJECTED):
        stolen = bob.ResolveApproval(
            rpb.ResolveApprovalRequest(approval_id=approval_id, outcome=outcome), metadata=bob_md
        )
        assert await _refusal(stolen) == unknown  # reveals nothing
    for rpc in (
        admin.ListPendingApprovals(rpb.ListPendingApprovalsRequest(), metadata=admin_md),
        admin.ResolveApproval(
            rpb.ResolveApprovalRequest(
                approval_id=approval_id, outcome=rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
            ),
            metadata=admin_md,
        ),
    ):
        assert (await _refusal(rpc))[0] is grpc.StatusCode.PERMISSION_DENIED
    assert not call.done()  # nothing of it was answered

    mine = await alice.ListPendingApprovals(rpb.ListPendingApprovalsRequest(), metadata=alice_md)
    [pending] = mine.approvals
    assert (pending.approval_id, pending.agent, pending.arguments_json) == (
        approval_id,
        "agents/alice",
        '{"secret":1}',
    )
    await alice.ResolveApproval(
        rpb.ResolveApprovalRequest(approval_id=approval_id, outcome=rpb.APPROVAL_OUTCOME_REJECTED),
        metadata=alice_md,
    )
    final = await call
    assert final.result.error.message == 'the user rejected tool "write"'
    # Answered: bob still learns nothing, alice is told it is no longer pending.
    late = rpb.ResolveApprovalRequest(
        approval_id=approval_id, outcome=rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
    )
    assert await _refusal(bob.ResolveApproval(late, metadata=bob_md)) == unknown
    assert await _refusal(alice.ResolveApproval(late, metadata=alice_md)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "APPROVAL_NOT_PENDING",
    )
    keeper.cancel()


async def _last(responses: Any) -> rpb.ExecuteToolCallResponse:
    last: rpb.ExecuteToolCallResponse | None = None
    async for response in responses:
        last = response
    assert last is not None
    return last
