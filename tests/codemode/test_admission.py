"""Admission control through real gRPC (and a real runtime for `run_code`): per-agent and
global limits on calls per second, concurrent runs and nested calls in flight. Over a limit
the call is RESOURCE_EXHAUSTED with RetryInfo and nothing of it starts (no history record)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc_status import rpc_status

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.grpc_status import retry_delay
from tests.codemode.conftest import value_of
from tests.registry.conftest import Harness, echo_tool, error_info_of


async def _call(harness: Harness, agent: str, call_id: str, tool: str = "echo", **args: Any) -> Any:
    request = rpb.ExecuteToolCallRequest(
        agent=agent,
        call_id=call_id,
        tool_name=tool,
        arguments_json=jsonvalue.dumps(args),
        progress_events=rpb.PROGRESS_EVENTS_NONE,
    )
    try:
        [response] = [r async for r in harness.stub.ExecuteToolCall(request, timeout=60)]
    except grpc.aio.AioRpcError as error:
        return error
    return response.result


def _refusal(error: Any, limit: str) -> float:
    """Checks an admission refusal; returns its RetryInfo delay."""
    assert isinstance(error, grpc.aio.AioRpcError), error
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info_of(error)
    assert info is not None and info.reason == "ADMISSION_LIMIT"
    assert info.metadata["limit"] == limit
    status = rpc_status.from_call(error)
    assert status is not None
    delay = retry_delay(status)
    assert delay is not None and delay > 0
    return delay


async def _call_ids(harness: Harness, agent: str) -> set[str]:
    page = await harness.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, page_size=1000))
    return {r.call_id for r in page.records}


async def test_calls_per_second_per_agent(make_registry: Any) -> None:
    limits = {"calls_per_second": 0.01, "burst": 2}  # two now, the next in 100 s
    async with make_registry(agent_limits=limits) as harness:
        echo_tool(harness.registry)
        a, b = await harness.agent("a"), await harness.agent("b")
        assert not (await _call(harness, a, "1")).is_error
        assert not (await _call(harness, a, "2")).is_error
        delay = _refusal(await _call(harness, a, "3"), "calls_per_second")
        assert 50 < delay <= 100  # the next token is due in about 100 s
        assert await _call_ids(harness, a) == {"1", "2"}  # nothing of call 3 exists
        assert not (await _call(harness, b, "1")).is_error  # b has its own bucket


async def test_calls_per_second_global(make_registry: Any) -> None:
    async with make_registry(limits={"calls_per_second": 0.01, "burst": 1}) as harness:
        echo_tool(harness.registry)
        a, b = await harness.agent("a"), await harness.agent("b")
        assert not (await _call(harness, a, "1")).is_error
        _refusal(await _call(harness, b, "1"), "calls_per_second")
        assert await _call_ids(harness, b) == set()


def _blocking_tool(harness: Harness) -> tuple[asyncio.Event, list[str]]:
    release = asyncio.Event()
    entered: list[str] = []

    async def body(invocation: Any) -> Any:
        entered.append(invocation.call_id)
        await release.wait()
        return {"ok": True}

    harness.registry.register_tool("hold", body, description="waits", concurrency_safe=True)
    return release, entered


async def _until(predicate: Any) -> None:
    for _ in range(3000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_concurrent_runs_per_agent(make_stack: Any) -> None:
    async with make_stack(agent_limits={"max_concurrent_runs": 1}) as stack:
        release, entered = _blocking_tool(stack)
        a, b = await stack.code_agent("a"), await stack.code_agent("b")
        first = asyncio.create_task(stack.run_code("return await tools.hold({})", agent=a))
        await _until(lambda: len(entered) == 1)  # a's run is in flight
        _refusal(
            await _call(stack, a, "call-2", "run_code", code="return 1", description="d"),
            "max_concurrent_runs",
        )
        assert "call-2" not in await _call_ids(stack, a)
        # Another agent is not held back by a's limit.
        _, other = await stack.run_code("return 2", agent=b)
        assert value_of(other)["result"] == 2
        release.set()
        _, result = await first
        assert value_of(result)["result"] == {"ok": True}
        # The slot is free again.
        _, again = await stack.run_code("return 3", agent=a, call_id="call-3")
        assert value_of(again)["result"] == 3
        assert stack.registry.admission.in_flight() == (0, 0)


async def test_nested_calls_in_flight(make_stack: Any) -> None:
    program = (
        "import asyncio\n"
        "async def one():\n"
        "    try:\n"
        "        return await tools.hold({})\n"
        "    except Exception as exc:\n"
        "        return str(exc)\n"
        "return await asyncio.gather(one(), one(), one())"
    )
    async with make_stack(agent_limits={"max_nested_in_flight": 2}) as stack:
        release, entered = _blocking_tool(stack)
        agent = await stack.code_agent("a")
        run = asyncio.create_task(stack.run_code(program, agent=agent))
        await _until(lambda: len(entered) == 2)
        release.set()
        _, result = await run
        answers = value_of(result)["result"]
        refused = [a for a in answers if isinstance(a, str)]
        assert answers.count({"ok": True}) == 2, answers
        assert len(refused) == 1 and "max_nested_in_flight" in refused[0], answers
        # Only the two dispatched nested calls have records (besides the outer call).
        page = await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, page_size=100))
        nested = {r.call_id for r in page.records if r.call_id != "call-1"}
        assert len(nested) == 2, nested
        assert stack.registry.admission.in_flight() == (0, 0)


@pytest.mark.parametrize("where", ["agent", "preset"])
async def test_declared_limits_override_the_default(make_registry: Any, where: str) -> None:
    tight = {"calls_per_second": 0.01, "burst": 1}
    declared: dict[str, Any] = {"presets": [{"id": "p"}], "agents": [{"id": "a", "preset": "p"}]}
    if where == "agent":
        declared["agents"][0]["limits"] = tight
    else:
        declared["presets"][0]["limits"] = tight
    async with make_registry(agent_limits={"calls_per_second": 100}, **declared) as harness:
        echo_tool(harness.registry)
        b = await harness.agent("b")
        assert not (await _call(harness, "agents/a", "1")).is_error
        _refusal(await _call(harness, "agents/a", "2"), "calls_per_second")
        for n in range(3):
            assert not (await _call(harness, b, str(n))).is_error
