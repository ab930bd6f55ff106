"""`history_statement_timeout_s`: a statement stuck behind a lock another session holds ends
with a clear error (HISTORY_UNAVAILABLE naming the setting) instead of a hang, for a catalog
change and for a call's history write, over gRPC; once the lock is gone the registry works."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from registry_service.history.postgres.connect import _with_defaults
from tests.registry.conftest import echo_tool, error_info_of

# Bounds a hang, not a duration: without the timeout the call would never end.
_HANG_S = 120


@pytest.fixture
def lock_table(pg_database: str) -> Iterator[Any]:
    """`lock(table)` takes an exclusive lock on `table` in another session, held until
    `release()` (or the end of the test)."""
    conn = psycopg.connect(pg_database)

    class Locker:
        def lock(self, table: str) -> None:
            conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")

        def release(self) -> None:
            conn.rollback()

    try:
        yield Locker()
    finally:
        conn.rollback()
        conn.close()


async def stuck(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call, _HANG_S)
    return caught.value


async def test_a_statement_stuck_on_a_lock_fails_clearly_instead_of_hanging(
    make_registry: Any, pg_database: str, lock_table: Any
) -> None:
    async with make_registry(
        history_store="postgres", history_dsn=pg_database, history_statement_timeout_s=0.5
    ) as h:
        echo_tool(h.registry, "read")
        await h.stub.CreateAgent(rpb.CreateAgentRequest(agent_id="a", agent=scope_pb2.Agent()))

        lock_table.lock("catalog_scopes")
        error = await stuck(
            h.stub.CreateAgent(rpb.CreateAgentRequest(agent_id="b", agent=scope_pb2.Agent()))
        )
        info = error_info_of(error)
        assert error.code() is grpc.StatusCode.UNAVAILABLE, error
        assert info is not None and info.reason == "HISTORY_UNAVAILABLE", error
        assert "history_statement_timeout_s (0.5 s)" in (error.details() or ""), error
        lock_table.release()

        lock_table.lock("history_records")
        request = rpb.ExecuteToolCallRequest(
            agent="agents/a", call_id="c1", tool_name="read", arguments_json="{}"
        )

        async def execute() -> list[rpb.ExecuteToolCallResponse]:
            return [event async for event in h.stub.ExecuteToolCall(request)]

        error = await stuck(execute())
        assert error.code() is grpc.StatusCode.UNAVAILABLE, error
        assert "history_statement_timeout_s" in (error.details() or ""), error
        lock_table.release()

        # Nothing is stuck behind it: the next change and call work.
        made = await h.stub.CreateAgent(
            rpb.CreateAgentRequest(agent_id="b", agent=scope_pb2.Agent())
        )
        assert made.agent.agent_id
        events = [
            e
            async for e in h.stub.ExecuteToolCall(
                rpb.ExecuteToolCallRequest(
                    agent="agents/b", call_id="c2", tool_name="read", arguments_json="{}"
                )
            )
        ]
        assert events[-1].result.is_error is False


def test_the_dsn_options_keep_their_own_statement_timeout() -> None:
    """The setting is a session default: `options` in the DSN come after it, and win."""
    assert "statement_timeout=250" in _with_defaults("dbname=x", 0.25)
    both = _with_defaults("dbname=x options='-c statement_timeout=9000'", 0.25)
    assert both.index("statement_timeout=250") < both.index("statement_timeout=9000")
