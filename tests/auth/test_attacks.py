"""The threat model's attacks, replayed with credentials that do not cover the victim: each must
fail to do harm. (Calls, history reads, restrictions and deletes are in test_access_matrix.)"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.grpc_status import error_info
from registry_service.config import RegistrySettings
from registry_service.domain.policy import Ask, PreDecision
from registry_service.server import start
from tests.auth.conftest import AuthRegistry
from tests.registry.conftest import echo_tool, error_info_of


async def _connect(stub: Any, metadata: Any) -> Any:
    call = stub.Connect(metadata=metadata)
    await call.write(rpb.ConnectRequest(open=rpb.OpenProvider(provider_name="p")))
    assert (await call.read()).WhichOneof("message") == "opened"
    return call


async def _register(call: Any, scope: str, name: str) -> Any:
    tool = tool_pb2.Tool(name=name, description="steals arguments")
    request = rpb.RegisterTools(request_id=name, scope=scope, tools=[tool])
    await call.write(rpb.ConnectRequest(register=request))
    return (await call.read()).registered


async def test_registering_into_another_agents_scope_is_refused(
    auth_registry: AuthRegistry, principals: dict[str, Any]
) -> None:
    catalog = auth_registry.running.registry.catalog
    bob = await _connect(*principals["bob"])
    ack = await _register(bob, "agents/alice", "steal")
    assert ack.status.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    info = error_info(ack.status)
    assert info is not None and info.metadata["resource"] == "agents/alice"
    assert "steal" not in catalog.view("agents/alice").visible
    # The stream goes on: bob may still register into his own scope.
    ack = await _register(bob, "agents/bob", "mine")
    assert ack.status.code == 0
    assert "mine" in catalog.view("agents/bob").visible
    assert "mine" not in catalog.view("agents/alice").visible
    bob.cancel()


async def test_a_stream_without_the_permission_cannot_attach(
    principals: dict[str, Any],
) -> None:
    stub, metadata = principals["admin"]  # manage only: neither register nor approve
    for open_call in (stub.Connect, stub.Approve):
        call = open_call(metadata=metadata)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        info = error_info_of(caught.value)
        assert info is not None and info.metadata["resource"] == "any scope"


async def _approver(stub: Any, metadata: Any) -> Any:
    call = stub.Approve(metadata=metadata)
    await call.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="ui")))
    assert (await call.read()).WhichOneof("message") == "opened"
    return call


async def _decide(call: Any, approval_id: str, outcome: Any) -> None:
    decision = rpb.ApprovalDecision(approval_id=approval_id, outcome=outcome)
    await call.write(rpb.ApproveRequest(decision=decision))


async def _call(caller: Any, agent: str, call_id: str) -> rpb.ExecuteToolCallResponse:
    stub, metadata = caller
    request = rpb.ExecuteToolCallRequest(
        agent=agent, call_id=call_id, tool_name="write", arguments_json='{"secret":1}'
    )
    responses = [r async for r in stub.ExecuteToolCall(request, metadata=metadata, timeout=30)]
    last: rpb.ExecuteToolCallResponse = responses[-1]
    return last


async def test_approvals_reach_and_are_answered_only_by_the_agents_approvers(
    auth_registry: AuthRegistry, principals: dict[str, Any]
) -> None:
    registry = auth_registry.running.registry

    async def ask(e: Any, d: PreDecision) -> PreDecision:
        return Ask("writes") if e.name == "write" else d

    registry.catalog.hooks("").pre_execute.append(ask)
    echo_tool(registry, "write")
    bob_approver = await _approver(*principals["bob"])
    alice_approver = await _approver(*principals["alice"])
    alice_call = asyncio.create_task(_call(principals["alice"], "agents/alice", "a-1"))
    request = (await alice_approver.read()).request
    assert request.agent == "agents/alice"
    # Bob answers alice's request by its id (guessed, or leaked): ignored like a late answer.
    await _decide(bob_approver, request.approval_id, rpb.APPROVAL_OUTCOME_ALLOWED_ONCE)
    # Bob's own request: the first thing his approver sees (never alice's request), and once
    # he answered it his earlier answer was read too (one reader, in order).
    bob_call = asyncio.create_task(_call(principals["bob"], "agents/bob", "b-1"))
    first = await bob_approver.read()
    assert first.WhichOneof("message") == "request", first
    assert first.request.agent == "agents/bob"
    await _decide(bob_approver, first.request.approval_id, rpb.APPROVAL_OUTCOME_ALLOWED_ONCE)
    bob_result = (await bob_call).result
    assert not bob_result.is_error and bob_result.value_json == '{"echo":{"secret":1}}'
    assert not alice_call.done()
    await _decide(alice_approver, request.approval_id, rpb.APPROVAL_OUTCOME_REJECTED)
    final = await alice_call
    assert final.result.error.message == 'the user rejected tool "write"'
    bob_approver.cancel()
    alice_approver.cancel()


async def test_an_agent_without_its_own_approver_gets_unavailable_not_anothers(
    auth_registry: AuthRegistry, principals: dict[str, Any]
) -> None:
    registry = auth_registry.running.registry

    async def ask(e: Any, d: PreDecision) -> PreDecision:
        return Ask("writes") if e.name == "write" else d

    registry.catalog.hooks("").pre_execute.append(ask)
    echo_tool(registry, "write")
    bob_approver = await _approver(*principals["bob"])  # connected, but not alice's
    final = await _call(principals["alice"], "agents/alice", "a-2")
    assert final.result.is_error, final
    assert "approv" in final.result.error.message.lower(), final
    bob_approver.cancel()


def _exposed(tmp_path: Any, **extra: Any) -> RegistrySettings:
    return RegistrySettings(listen="0.0.0.0:0", history_path=":memory:", trace_file="off", **extra)


async def test_an_open_registry_on_a_public_address_warns_loudly(
    caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    with caplog.at_level(logging.WARNING):
        running = await start(_exposed(tmp_path))
        await running.stop(0)
    warnings = [r.getMessage() for r in caplog.records if "SECURITY WARNING" in r.getMessage()]
    assert len(warnings) == 1 and "NO AUTHENTICATION" in warnings[0]


async def test_loopback_open_registry_stays_quiet(caplog: pytest.LogCaptureFixture) -> None:
    settings = RegistrySettings(listen="127.0.0.1:0", history_path=":memory:", trace_file="off")
    with caplog.at_level(logging.WARNING):
        running = await start(settings)
        try:
            # The README's default: no credentials, everything works.
            async with grpc.aio.insecure_channel(running.address) as channel:
                from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc

                stub = rpb_grpc.RegistryServiceStub(channel)
                await stub.CreateAgent(rpb.CreateAgentRequest(agent_id="a"), timeout=10)
                await stub.ListHistory(rpb.ListHistoryRequest(agent="agents/a"), timeout=10)
        finally:
            await running.stop(0)
    assert not [r for r in caplog.records if "SECURITY WARNING" in r.getMessage()]


async def test_the_python_client_sends_a_bearer_token() -> None:
    """A loopback registry taking static tokens (no TLS): the client's `bearer_token` goes
    with every call, unary and streaming; without it the same calls are UNAUTHENTICATED."""
    from codemode_client import RegistryClient
    from codemode_client.errors import PermissionDenied, Unauthenticated
    from tests.auth.conftest import sha256

    token = "ci-token-0123456789"
    settings = RegistrySettings(
        listen="127.0.0.1:0",
        history_path=":memory:",
        trace_file="off",
        auth={"tokens": [{"principal": "ci", "sha256": sha256(token)}]},
        grants=[
            {"principals": ["token:ci"], "permissions": ["execute"], "resources": ["agents/ci"]}
        ],
        agents=[{"id": "ci"}, {"id": "other"}],
    )
    running = await start(settings)
    echo_tool(running.registry)
    try:
        async with RegistryClient(running.address, bearer_token=token) as client:
            assert "echo" in [t.name for t in await client.list_tools("agents/ci")]
            result = await client.call("echo", {"x": 1}, agent="agents/ci")
            assert result.value == {"echo": {"x": 1}}
            with pytest.raises(PermissionDenied):
                await client.history("agents/other")
        async with RegistryClient(running.address) as anonymous:
            with pytest.raises(Unauthenticated):
                await anonymous.list_tools("agents/ci")
    finally:
        await running.stop(0)
