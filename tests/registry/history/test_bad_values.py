"""One tenant's values that no history store can hold fail only that tenant's own calls, seen
through gRPC on a real PostgreSQL (whose text holds no NUL): an agent's calls with a NUL in
their call id, an over-long one, and a provider's tool error whose code holds a NUL, while
another agent makes 100 calls at once. Every call of the other agent succeeds and is recorded,
and health says SERVING throughout."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from codemode_client import ToolFailed, ToolProvider
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.convert import PROVIDER_ERROR_CODE_INVALID
from registry_service.domain.records import TOOL_CALL, TOOL_RESULT
from tests.registry.conftest import Harness, error_info_of
from tests.registry.history.test_full_disk import call_request, health_of, history, outcome

SERVING = health_pb2.HealthCheckResponse.SERVING
BYSTANDER_CALLS = 100


def assert_refused(error: Any, reason: str) -> None:
    assert isinstance(error, grpc.aio.AioRpcError), f"expected a failed RPC, got {error!r}"
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    info = error_info_of(error)
    assert info is not None and info.reason == reason, info


async def follow_health(h: Harness, seen: list[int]) -> None:
    stub = health_pb2_grpc.HealthStub(h.channel)
    async for response in stub.Watch(health_pb2.HealthCheckRequest(service="")):
        seen.append(int(response.status))


async def test_values_no_store_can_hold_fail_only_their_own_calls(
    make_registry: Any, pg_database: str
) -> None:
    settings = {"history_store": "postgres", "history_dsn": pg_database}
    async with make_registry(**settings) as h:

        async def note(invocation: Any) -> Any:
            return {"noted": invocation.call_id}

        h.registry.register_tool("note", note)
        provider = ToolProvider(h.channel, "careless")

        @provider.tool(description="Fails with a code no store can hold")
        async def careless(args: Any, ctx: Any) -> Any:
            raise ToolFailed("it failed", "BAD\x00CODE")

        async with provider:
            attacker = await h.agent("attacker")
            bystander = await h.agent("bystander")
            statuses: list[int] = []
            watching = asyncio.create_task(follow_health(h, statuses))
            try:
                others = [
                    outcome(h, call_request(bystander, f"b-{n}")) for n in range(BYSTANDER_CALLS)
                ]
                nul_ids = [outcome(h, call_request(attacker, f"a\x00{n}")) for n in range(20)]
                long_ids = [
                    outcome(h, call_request(attacker, "x" * 600 + str(n))) for n in range(5)
                ]
                nul_names = [
                    outcome(h, call_request(attacker, f"t-{n}", "n\x00te")) for n in range(5)
                ]
                bad_codes = [
                    outcome(h, call_request(attacker, f"code-{n}", "careless")) for n in range(20)
                ]
                done = await asyncio.wait_for(
                    asyncio.gather(*others, *nul_ids, *long_ids, *nul_names, *bad_codes), 120
                )
                with_nul = h.stub.ListHistory(
                    rpb.ListHistoryRequest(agent=attacker, call_id="\x00")
                )
                try:
                    await with_nul
                    raise AssertionError("a history filter holding a NUL was not refused")
                except grpc.aio.AioRpcError as refused:
                    assert_refused(refused, "INVALID_CALL_ID")
            finally:
                watching.cancel()

        results = done[:BYSTANDER_CALLS]
        assert all(not r.is_error for r in results), [r for r in results if r.is_error][:3]
        rest = done[BYSTANDER_CALLS:]
        for failed in rest[:25]:
            assert_refused(failed, "INVALID_CALL_ID")
        for failed in rest[25:30]:
            assert_refused(failed, "INVALID_TOOL_NAME")
        for result in rest[30:]:  # the provider's tool error, under a code that can be stored
            assert result.is_error and result.error.code == PROVIDER_ERROR_CODE_INVALID, result
        # Everything of the bystander is recorded, and the attacker's provider errors too.
        kinds: dict[str, list[str]] = {}
        for record in await history(h, bystander):
            kinds.setdefault(record.call_id, []).append(record.kind)
        assert kinds == {f"b-{n}": [TOOL_CALL, TOOL_RESULT] for n in range(BYSTANDER_CALLS)}
        ends = [r for r in await history(h, attacker) if r.kind == TOOL_RESULT]
        assert sorted(r.call_id for r in ends) == sorted(f"code-{n}" for n in range(20))
        assert {r.error_code for r in ends} == {PROVIDER_ERROR_CODE_INVALID}
        assert statuses and set(statuses) == {SERVING}, statuses
        assert await health_of(h) == SERVING
