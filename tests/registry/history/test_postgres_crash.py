"""PostgreSQL crashes under load (an immediate shutdown: what its WAL buffers held is lost) and
recovers, seen through gRPC: every call whose caller saw success has its result record (the
registry answers only once the record is durable, whatever the server's synchronous_commit),
and every other call that left a start record is closed once the server is back (interrupted,
or its own result when its batch committed as the connection was lost)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.records import INTERRUPTED, TOOL_CALL, TOOL_RESULT
from tests.postgres_server import PostgresServer
from tests.registry.history.test_full_disk import call_request, health_of, history, outcome, until

CALLERS = 16  # concurrent callers, each making one call after another
CRASH_AFTER = 200  # successes before the crash: the load is well under way


async def test_a_crash_loses_no_record_of_a_call_its_caller_saw_succeed(
    make_registry: Any, postgres: PostgresServer, pg_database: str
) -> None:
    server_default = postgres.admin("SHOW synchronous_commit")[0][0]
    assert server_default == "off"  # the test cluster commits without waiting for its WAL
    settings = {"history_store": "postgres", "history_dsn": pg_database}
    async with make_registry(**settings) as h:

        async def note(invocation: Any) -> Any:
            return {"noted": invocation.call_id}

        h.registry.register_tool("note", note)
        agent = await h.agent("loaded")
        succeeded: list[str] = []
        failed: list[str] = []
        crashed, recovered = asyncio.Event(), asyncio.Event()
        enough = asyncio.Event()

        async def caller(n: int) -> None:
            for k in range(10_000):
                call_id = f"c{n}-{k}"
                got = await outcome(h, call_request(agent, call_id))
                if isinstance(got, grpc.aio.AioRpcError):
                    failed.append(call_id)
                else:
                    assert not got.is_error, got
                    succeeded.append(call_id)
                    if len(succeeded) >= CRASH_AFTER:
                        enough.set()
                if recovered.is_set() and not isinstance(got, grpc.aio.AioRpcError):
                    return  # a call that worked after the recovery: this caller is done

        callers = [asyncio.create_task(caller(n)) for n in range(CALLERS)]
        try:
            await asyncio.wait_for(enough.wait(), 120)
            await asyncio.to_thread(postgres.crash)  # the calls go on meanwhile
            crashed.set()
        finally:
            await asyncio.to_thread(postgres.resume)
        await until(lambda: health_of(h), health_pb2.HealthCheckResponse.SERVING, 60)
        recovered.set()
        await asyncio.wait_for(asyncio.gather(*callers), 120)
        # One more call after every caller ended: what the failed writes owe is written.
        assert not (await outcome(h, call_request(agent, "last"))).is_error

        records = await history(h, agent)
        while len(page := await history_after(h, agent, records[-1].seq)) > 0:
            records += page
    assert crashed.is_set() and failed, "the crash failed no call: it missed the load"
    by_call: dict[str, list[Any]] = {}
    for record in records:
        by_call.setdefault(record.call_id, []).append(record)
    lost = [
        c for c in succeeded if [r.kind for r in by_call.get(c, [])] != [TOOL_CALL, TOOL_RESULT]
    ]
    assert not lost, f"{len(lost)} calls whose callers saw success lack records: {lost[:5]}"
    assert all(not by_call[c][1].is_error for c in succeeded)
    # Nothing is left open: every call that has a start record has its end.
    open_calls = [
        c for c, rs in by_call.items() if [r.kind for r in rs] != [TOOL_CALL, TOOL_RESULT]
    ]
    assert not open_calls, [(c, [r.kind for r in by_call[c]]) for c in open_calls[:5]]
    for call_id in failed:
        if call_id in by_call:  # its start was written: closed as interrupted (or, in doubt,
            end = by_call[call_id][1]  # committed as the connection went: its own result)
            assert end.error_code in (INTERRUPTED, ""), end


async def history_after(h: Any, agent: str, seq: int) -> list[Any]:
    page = await h.stub.ListHistory(
        rpb.ListHistoryRequest(agent=agent, page_size=1000, page_token=str(seq))
    )
    return list(page.records)
