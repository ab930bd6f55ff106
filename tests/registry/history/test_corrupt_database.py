"""A history database damaged past its header (every page after the first overwritten) gives
clear errors, DATA_LOSS with ErrorInfo HISTORY_CORRUPT, on every history-touching RPC, and the
gRPC health service says NOT_SERVING; the rest of the registry keeps serving, except changes to
the catalog, which is stored in the same database: they fail the same way and change nothing.
Damaged while stopped (found at start) and while running (found by the first read of a damaged
page)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.server import SERVICE_NAME
from tests.registry.conftest import Harness, echo_tool, error_info_of
from tests.registry.history.conftest import corrupt_sqlite_file
from tests.registry.history.test_full_disk import call_request, health_of, outcome, until

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def assert_corrupt(error: Any) -> None:
    assert isinstance(error, grpc.aio.AioRpcError), f"expected a failed RPC, got {error!r}"
    assert error.code() == grpc.StatusCode.DATA_LOSS, (error.code(), error.details())
    info = error_info_of(error)
    assert info is not None and info.reason == "HISTORY_CORRUPT", info


async def rpc_error(call: Any) -> Any:
    try:
        response = await call
    except grpc.aio.AioRpcError as error:
        return error
    return response


async def fill(h: Harness, agent: str, calls: int) -> None:
    for n in range(calls):
        assert not (await outcome(h, call_request(agent, f"c{n}", "echo"))).is_error


async def assert_history_rpcs_fail_clearly(h: Harness, agent: str) -> None:
    assert_corrupt(await outcome(h, call_request(agent, "after", "echo")))
    assert_corrupt(await rpc_error(h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))))
    assert_corrupt(
        await rpc_error(h.stub.GetRecordContent(rpb.GetRecordContentRequest(agent=agent, seq=1)))
    )
    with pytest.raises(grpc.aio.AioRpcError) as watched:
        async for _ in h.stub.WatchHistory(rpb.WatchHistoryRequest(agent=agent), timeout=60):
            pass
    assert_corrupt(watched.value)


async def assert_the_rest_still_serves(h: Harness, *, catalog_read: bool = True) -> None:
    # Calls without an agent write no history, and the catalog is read from memory...
    assert not (await outcome(h, call_request("", "free", "echo"))).is_error
    assert (await h.stub.ListAgents(rpb.ListAgentsRequest())).agents
    # ...but it is stored in the damaged database: a change fails clearly and is not made.
    assert_corrupt(await rpc_error(h.stub.CreateAgent(rpb.CreateAgentRequest(agent_id="newcomer"))))
    missing = await rpc_error(h.stub.GetAgent(rpb.GetAgentRequest(name="agents/newcomer")))
    if catalog_read:
        assert isinstance(missing, grpc.aio.AioRpcError)
        assert missing.code() == grpc.StatusCode.NOT_FOUND
    else:  # the stored catalog was never read: whether it exists cannot be told
        assert_corrupt(missing)


async def test_damaged_while_stopped_is_reported_at_start(
    make_registry: Any, tmp_path: Path
) -> None:
    path = tmp_path / "history.sqlite3"
    # Declared in the settings: known at start even when the stored catalog cannot be read.
    writer = [{"id": "writer"}]
    async with make_registry(history_path=str(path), agents=writer) as h:
        echo_tool(h.registry)
        await fill(h, "agents/writer", 30)
    corrupt_sqlite_file(path)

    async with make_registry(history_path=str(path), agents=writer) as h:
        echo_tool(h.registry)
        agent = "agents/writer"
        assert await health_of(h) == NOT_SERVING
        assert await health_of(h, SERVICE_NAME) == NOT_SERVING
        await assert_history_rpcs_fail_clearly(h, agent)
        await assert_the_rest_still_serves(h, catalog_read=False)
        assert await health_of(h) == NOT_SERVING  # for good: damage does not heal


async def test_agents_made_over_the_api_are_answered_corrupt_not_missing(
    make_registry: Any, tmp_path: Path
) -> None:
    """An agent created over the API lives in the damaged database's catalog: after a restart
    the registry cannot read it, and answers HISTORY_CORRUPT for it, not AGENT_NOT_FOUND."""
    path = tmp_path / "history.sqlite3"
    async with make_registry(history_path=str(path)) as h:
        echo_tool(h.registry)
        agent = await h.agent("made")
        await fill(h, agent, 30)
    corrupt_sqlite_file(path)

    async with make_registry(history_path=str(path)) as h:
        echo_tool(h.registry)
        assert await health_of(h) == NOT_SERVING
        await assert_history_rpcs_fail_clearly(h, agent)
        assert_corrupt(await rpc_error(h.stub.GetAgent(rpb.GetAgentRequest(name=agent))))
        assert_corrupt(
            await rpc_error(h.stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent)))
        )


async def test_damaged_while_running_is_reported_at_the_first_damaged_read(
    make_registry: Any, tmp_path: Path
) -> None:
    path = tmp_path / "history.sqlite3"
    async with make_registry(history_path=str(path)) as h:
        echo_tool(h.registry)
        agent = await h.agent("writer")
        await fill(h, agent, 30)
        assert await health_of(h) == health_pb2.HealthCheckResponse.SERVING
        # Everything into the main file (so no page is read from the WAL), then damage it.
        other = sqlite3.connect(path)
        other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        other.close()
        corrupt_sqlite_file(path)

        assert_corrupt(await rpc_error(h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))))
        await until(lambda: health_of(h), NOT_SERVING)
        await assert_history_rpcs_fail_clearly(h, agent)
        await assert_the_rest_still_serves(h)
