"""A full disk under the history database, for real (a tmpfs filled to its last byte), seen
through gRPC: every call fails at once with UNAVAILABLE HISTORY_UNAVAILABLE (not at its
deadline), nothing is written half, health says NOT_SERVING, and once space returns the
registry serves again by itself with a consistent history. Direct calls, and a run_code call
whose disk fills between two nested calls."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.records import (
    DISPATCH,
    DISPATCH_START,
    INTERRUPTED,
    TOOL_CALL,
    TOOL_RESULT,
)
from registry_service.server import SERVICE_NAME
from tests.codemode.conftest import make_stack
from tests.registry.conftest import Harness, error_info_of
from tests.registry.history.disk import require, small_disk

__all__ = ["make_stack"]  # the fixture, imported for the run_code test

CALLS = 7
LONG_DEADLINE_S = 600.0  # far beyond the test's own bounded waits: a hang cannot pass


async def health_of(h: Harness, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(h.channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service))
    return int(response.status)


async def until(read: Callable[[], Awaitable[Any]], wanted: Any, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while (seen := await read()) != wanted:
        assert time.monotonic() < deadline, f"still {seen!r}, not {wanted!r}"
        await asyncio.sleep(0.05)


async def history(h: Harness, agent: str) -> list[Any]:
    page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, page_size=1000))
    return list(page.records)


def call_request(agent: str, call_id: str, tool: str = "note") -> rpb.ExecuteToolCallRequest:
    return rpb.ExecuteToolCallRequest(
        agent=agent, call_id=call_id, tool_name=tool, arguments_json="{}"
    )


async def outcome(h: Harness, request: rpb.ExecuteToolCallRequest) -> Any:
    """The call's result, or the RPC error it ended with."""
    try:
        events = [e async for e in h.stub.ExecuteToolCall(request, timeout=LONG_DEADLINE_S)]
    except grpc.aio.AioRpcError as error:
        return error
    return events[-1].result


def assert_unavailable(error: Any) -> None:
    assert isinstance(error, grpc.aio.AioRpcError), f"expected a failed RPC, got {error!r}"
    assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
    info = error_info_of(error)
    assert info is not None and info.reason == "HISTORY_UNAVAILABLE", info
    assert "full" in (error.details() or ""), error.details()  # SQLite's own words travel


async def test_a_full_disk_fails_calls_at_once_and_the_registry_recovers(
    make_registry: Any, tmp_path: Path
) -> None:
    with small_disk(tmp_path / "disk") as maybe_disk:
        disk = require(maybe_disk)
        async with make_registry(history_path=str(disk.root / "history.sqlite3")) as h:
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
            # A call whose start is written before the disk fills, and its end after.
            mid = asyncio.create_task(outcome(h, call_request(agent, "mid", "slow")))
            await asyncio.wait_for(entered.wait(), 30)

            disk.fill()
            release.set()
            calls = [outcome(h, call_request(agent, f"full-{n}")) for n in range(CALLS)]
            # Bounded: calls that hang to their (long) deadline fail the test here.
            failed = await asyncio.wait_for(asyncio.gather(mid, *calls), 60)
            for error in failed:
                assert_unavailable(error)
            assert ran == ["warm"]  # no tool body ran without its start record
            await until(lambda: health_of(h), health_pb2.HealthCheckResponse.NOT_SERVING)
            assert await health_of(h, SERVICE_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING
            # Nothing half: the warm call whole, the mid call's start, no record of the rest.
            assert [(r.call_id, r.kind) for r in await history(h, agent)] == [
                ("warm", TOOL_CALL),
                ("warm", TOOL_RESULT),
                ("mid", TOOL_CALL),
            ]

            disk.free()
            # No call needed: the registry probes the store and serves again by itself.
            await until(lambda: health_of(h), health_pb2.HealthCheckResponse.SERVING)
            again = [outcome(h, call_request(agent, f"again-{n}")) for n in range(CALLS)]
            results = await asyncio.wait_for(asyncio.gather(*again), 60)
            assert all(not r.is_error for r in results), results

            records = await history(h, agent)
            seqs = [r.seq for r in records]
            assert seqs == sorted(set(seqs))
            # Every call that started is closed once: the mid call by an INTERRUPTED result
            # (its caller saw the failure, not the tool's value).
            by_call: dict[str, list[str]] = {}
            for record in records:
                by_call.setdefault(record.call_id, []).append(record.kind)
            assert set(by_call) == {"warm", "mid", *(f"again-{n}" for n in range(CALLS))}
            assert all(kinds == [TOOL_CALL, TOOL_RESULT] for kinds in by_call.values())
            [mid_end] = [r for r in records if r.call_id == "mid" and r.kind == TOOL_RESULT]
            assert mid_end.is_error and mid_end.error_code == INTERRUPTED


PROGRAM = """
await tools.step({"n": 1})
await tools.step({"n": 2})
return "done"
"""


async def test_a_disk_filling_during_a_run_fails_the_run_at_once(
    make_stack: Any, tmp_path: Path
) -> None:
    with small_disk(tmp_path / "disk") as maybe_disk:
        disk = require(maybe_disk)
        async with make_stack(history_path=str(disk.root / "history.sqlite3")) as h:
            steps: list[int] = []

            async def step(invocation: Any) -> Any:
                n = invocation.arguments["n"]
                steps.append(n)
                if n == 1:
                    disk.fill()  # the first nested call's settle record finds no space
                return {"n": n}

            h.registry.register_tool("step", step)
            agent = await h.code_agent()
            request = rpb.ExecuteToolCallRequest(
                agent=agent,
                call_id="run-1",
                tool_name="run_code",
                arguments_json=jsonvalue.dumps({"code": PROGRAM, "description": "steps"}),
            )
            error = await asyncio.wait_for(outcome(h, request), 60)
            assert_unavailable(error)
            disk.free()
            await until(lambda: health_of(h), health_pb2.HealthCheckResponse.SERVING)
            records = await history(h, agent)
            # Every call that was started is closed: the nested call whose settle record was
            # lost and the outer call, INTERRUPTED. (The second nested call's start record
            # failed, so it left none: nothing half.)
            assert [(r.call_id, r.kind, r.error_code) for r in records] == [
                ("run-1", TOOL_CALL, ""),
                ("run-1:code:1", DISPATCH_START, ""),
                ("run-1:code:1", DISPATCH, INTERRUPTED),
                ("run-1", TOOL_RESULT, INTERRUPTED),
            ]


BIG_START = """
await tools.fill({})
await tools.step({"pad": "x" * 1_000_000})
return "never"
"""


async def test_a_run_whose_nested_record_finds_no_space_ends_with_the_stores_code(
    make_stack: Any, tmp_path: Path
) -> None:
    """The run's outer result is written (it fits in the WAL's pages the last checkpoint left
    free) though a nested call's start record, a large one, found no space: the call ends with
    UNAVAILABLE HISTORY_UNAVAILABLE, and its result record carries that code, not an empty
    one."""
    with small_disk(tmp_path / "disk") as maybe_disk:
        disk = require(maybe_disk)
        path = disk.root / "history.sqlite3"
        async with make_stack(history_path=str(path)) as h:

            async def fill(invocation: Any) -> Any:
                disk.fill()
                return {}

            async def step(invocation: Any) -> Any:
                return {}

            h.registry.register_tool("fill", fill)
            h.registry.register_tool("step", step)
            agent = await h.code_agent()
            # A WAL of about a hundred kB, all of it checkpointed: the next writes reuse its
            # pages from the start, needing no new space until they outgrow it.
            for n in range(2):
                warm = rpb.ExecuteToolCallRequest(
                    agent=agent,
                    call_id=f"warm-{n}",
                    tool_name="run_code",
                    arguments_json=jsonvalue.dumps(
                        {"code": f"return {'x' * 20_000!r}", "description": "warm"}
                    ),
                )
                assert not (await outcome(h, warm)).is_error
            with contextlib.closing(sqlite3.connect(path)) as other:
                [(busy, _, _)] = other.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
            assert busy == 0
            request = rpb.ExecuteToolCallRequest(
                agent=agent,
                call_id="run-1",
                tool_name="run_code",
                arguments_json=jsonvalue.dumps({"code": BIG_START, "description": "big"}),
            )
            error = await asyncio.wait_for(outcome(h, request), 60)
            assert_unavailable(error)
            [end] = [
                r for r in await history(h, agent) if r.call_id == "run-1" and r.kind == TOOL_RESULT
            ]
            assert end.is_error and end.error_code == "HISTORY_UNAVAILABLE", end
            disk.free()
