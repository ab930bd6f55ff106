"""A registry on PostgreSQL whose server stops under it (stopped for real, then started again),
seen through gRPC: calls fail at once with UNAVAILABLE HISTORY_UNAVAILABLE (not at their
deadline), health says NOT_SERVING, and once the server is back the registry serves again by
itself (its probe reconnects) with a consistent history: the call cut off is closed once, as
interrupted."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from registry_service.domain.records import INTERRUPTED, TOOL_CALL, TOOL_RESULT
from registry_service.server import SERVICE_NAME
from tests.postgres_server import PostgresServer
from tests.registry.conftest import error_info_of
from tests.registry.history.test_full_disk import (
    CALLS,
    call_request,
    health_of,
    history,
    outcome,
    until,
)


def assert_unavailable(error: Any) -> None:
    assert isinstance(error, grpc.aio.AioRpcError), f"expected a failed RPC, got {error!r}"
    assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
    info = error_info_of(error)
    assert info is not None and info.reason == "HISTORY_UNAVAILABLE", info


async def test_a_lost_server_fails_calls_at_once_and_the_registry_recovers(
    make_registry: Any, postgres: PostgresServer, pg_database: str
) -> None:
    settings = {"history_store": "postgres", "history_dsn": pg_database}
    async with make_registry(**settings) as h:
        ran: list[str] = []
        entered, release = asyncio.Event(), asyncio.Event()

        async def note(invocation: Any) -> Any:
            ran.append(invocation.call_id)
            return {"noted": invocation.call_id}

        async def slow(invocation: Any) -> Any:
            entered.set()
            await release.wait()
            return {"slow": True}

        h.registry.register_tool("note", note)
        h.registry.register_tool("slow", slow)
        agent = await h.agent("writer")
        assert not (await outcome(h, call_request(agent, "warm"))).is_error
        mid = asyncio.create_task(outcome(h, call_request(agent, "mid", "slow")))
        await asyncio.wait_for(entered.wait(), 30)

        postgres.halt()
        try:
            release.set()
            calls = [outcome(h, call_request(agent, f"lost-{n}")) for n in range(CALLS)]
            failed = await asyncio.wait_for(asyncio.gather(mid, *calls), 60)
            for error in failed:
                assert_unavailable(error)
            assert ran == ["warm"]  # no tool body ran without its start record
            await until(lambda: health_of(h), health_pb2.HealthCheckResponse.NOT_SERVING)
            assert await health_of(h, SERVICE_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            postgres.resume()

        # No call needed: the registry probes the store and serves again by itself.
        await until(lambda: health_of(h), health_pb2.HealthCheckResponse.SERVING)
        again = [outcome(h, call_request(agent, f"again-{n}")) for n in range(CALLS)]
        results = await asyncio.wait_for(asyncio.gather(*again), 60)
        assert all(not r.is_error for r in results), results

        records = await history(h, agent)
        seqs = [r.seq for r in records]
        assert seqs == sorted(set(seqs))
        by_call: dict[str, list[str]] = {}
        for record in records:
            by_call.setdefault(record.call_id, []).append(record.kind)
        assert set(by_call) == {"warm", "mid", *(f"again-{n}" for n in range(CALLS))}
        assert all(kinds == [TOOL_CALL, TOOL_RESULT] for kinds in by_call.values())
        [mid_end] = [r for r in records if r.call_id == "mid" and r.kind == TOOL_RESULT]
        assert mid_end.is_error and mid_end.error_code == INTERRUPTED
