"""Cancelling a run_code call, or letting its deadline pass, over real gRPC: the Run stream is
cancelled, the runtime kills the worker, the in-flight nested call sees the abort and settles,
the queued one is abandoned, and only then is the outer result recorded: `ABORTED`."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import grpc
import pytest

from codemode_wire.api.registry.v1 import history_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.policy import Ask, PreDecision
from runtime_service.sandbox_uids import live_processes_of
from tests.codemode.conftest import Stack
from tests.codemode.fake_runtime import FakeRuntime, registry_on
from tests.registry.conftest import Harness

PROGRAM = (
    "import asyncio, os\n"
    "await asyncio.gather(tools.hang({'uid': os.getuid()}), tools.queued({}))\n"
    "return 'unreachable'"
)


def request(agent: str, code: str) -> rpb.ExecuteToolCallRequest:
    return rpb.ExecuteToolCallRequest(
        agent=agent,
        call_id="call-1",
        tool_name="run_code",
        arguments_json=json.dumps({"code": code, "description": "stopped"}),
    )


async def outer_result_record(h: Harness, agent: str) -> list[history_pb2.HistoryRecord]:
    """The agent's records once the outer result is written (it is written last)."""
    async with asyncio.timeout(20):
        while True:
            page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
            records = list(page.records)
            if records and records[-1].kind == "tool/result":
                return records
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("how", ["cancel", "deadline"])
async def test_a_stopped_call_kills_its_worker_and_aborts_its_nested_call(
    stack: Stack, how: str
) -> None:
    started = asyncio.Event()
    workers: list[int] = []
    ran: list[str] = []

    async def hang(inv: Any) -> Any:
        workers.append(inv.arguments["uid"])
        started.set()
        await inv.signal.wait()
        return "finished anyway"  # too late: the call was aborted

    async def queued(inv: Any) -> Any:
        ran.append("queued")

    stack.registry.register_tool("hang", hang)  # not concurrency-safe: `queued` waits behind it
    stack.registry.register_tool("queued", queued)
    agent = await stack.code_agent()
    call = stack.stub.ExecuteToolCall(
        request(agent, PROGRAM), timeout=4 if how == "deadline" else None
    )

    async def consume() -> list[Any]:
        return [message async for message in call]

    consumer = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 20)
    if how == "cancel":
        call.cancel()
    with pytest.raises((grpc.aio.AioRpcError, asyncio.CancelledError)) as stopped:
        await asyncio.wait_for(consumer, 20)
    if how == "deadline":
        assert isinstance(stopped.value, grpc.aio.AioRpcError)
        assert stopped.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED

    records = await outer_result_record(stack, agent)
    (uid,) = workers
    # The runtime reports a run's end only after its worker is gone: no process of the run's
    # own uid is left on the host (the worker runs in a pid namespace of its own, so its pid
    # means nothing here).
    assert uid != os.getuid(), "needs a sandbox uid (root)"
    assert not live_processes_of(uid)
    outer = records[-1]
    assert (outer.call_id, outer.is_error, outer.error_code) == ("call-1", True, "ABORTED")
    assert outer.content[0].text.text == "Error: tool call aborted"
    nested = [(r.kind, r.call_id, r.tool_name, r.error_code) for r in records[1:-1]]
    assert nested == [
        ("tool/code-dispatch-start", "call-1:code:1", "hang", ""),
        ("tool/code-dispatch", "call-1:code:1", "hang", "ABORTED"),
    ]  # the queued call was abandoned: no records, never ran
    assert ran == []


async def test_a_call_aborted_before_run_code_starts_opens_no_run() -> None:
    runtime = FakeRuntime()
    async with registry_on(runtime) as (h, _clock, agent):

        async def ask(e: Any, d: PreDecision) -> PreDecision:
            return Ask("runs code") if e.name == "run_code" else d

        h.registry.catalog.hooks("").pre_execute.append(ask)
        approver = h.stub.Approve()
        await approver.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="slow")))
        assert (await approver.read()).WhichOneof("message") == "opened"
        try:
            call = h.stub.ExecuteToolCall(request(agent, "return 1"))
            pending = (await asyncio.wait_for(approver.read(), 20)).request
            assert pending.tool_name == "run_code"
            call.cancel()  # while the approval is pending: run_code's body never starts
            withdrawn = (await asyncio.wait_for(approver.read(), 20)).withdrawn
            assert withdrawn.approval_id == pending.approval_id
            records = await outer_result_record(h, agent)
        finally:
            approver.cancel()
    outer = records[-1]
    assert (outer.is_error, outer.error_code) == (True, "ABORTED_BEFORE_DISPATCH")
    assert [r.kind for r in records] == ["tool/call", "tool/result"]
    assert runtime.starts == []  # no Run was opened
