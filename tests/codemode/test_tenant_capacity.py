"""One agent cannot use up the code runtime for the others, with the registry's default
settings, through real gRPC and a real runtime.

- Admission limits are on by default: 320 concurrent `run_code` calls of one agent leave
  another agent's run working; the flood's excess is refused as retryable capacity
  (RESOURCE_EXHAUSTED with RetryInfo), never failed as a program error.
- A runtime with no sandbox free is capacity too: `run_code` ends RESOURCE_EXHAUSTED
  `CODE_RUNTIME_EXHAUSTED` with the runtime's retry delay (and is recorded so), not
  `CODE_RUN_FAILED worker-exit`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc_status import rpc_status

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.grpc_status import retry_delay
from tests.codemode.conftest import value_of
from tests.registry.conftest import Harness, error_info_of

RUNTIME_DELAY_S = 2.5


async def _run_code(harness: Harness, agent: str, call_id: str, code: str) -> Any:
    """The result, or the RPC error, of one `run_code` call (no client retries)."""
    request = rpb.ExecuteToolCallRequest(
        agent=agent,
        call_id=call_id,
        tool_name="run_code",
        arguments_json=jsonvalue.dumps({"code": code, "description": "tenant test"}),
        progress_events=rpb.PROGRESS_EVENTS_NONE,
    )
    try:
        [response] = [r async for r in harness.stub.ExecuteToolCall(request, timeout=120)]
    except grpc.aio.AioRpcError as error:
        return error
    return response.result


def _capacity_refusal(error: grpc.aio.AioRpcError) -> tuple[str, float]:
    """(reason, RetryInfo delay) of a retryable capacity refusal."""
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error
    info = error_info_of(error)
    assert info is not None and info.domain == "codemode.registry", info
    status = rpc_status.from_call(error)
    assert status is not None
    delay = retry_delay(status)
    assert delay is not None and delay > 0, error
    return info.reason, delay


async def _until(predicate: Any) -> None:
    for _ in range(3000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_one_agent_flooding_run_code_leaves_another_agent_working(make_stack: Any) -> None:
    # Registry defaults; the runtime holds 32 sandboxes (a private uid range), the registry's
    # default share of them for all its agents together.
    runtime = {"worker_uid_base": 63_730, "worker_uid_count": 32}
    async with make_stack(runtime_settings=runtime) as stack:
        a, b = await stack.code_agent("a"), await stack.code_agent("b")
        flood = [asyncio.create_task(_run_code(stack, a, f"a-{n}", "return 1")) for n in range(320)]
        await _until(
            lambda: (
                stack.registry.admission.in_flight(a)[0] > 0 or all(task.done() for task in flood)
            )
        )
        bystander = await _run_code(stack, b, "b-1", "return 2")
        outcomes = await asyncio.gather(*flood)
        assert not isinstance(bystander, grpc.aio.AioRpcError), bystander
        assert value_of(bystander)["result"] == 2
        program_errors = [o.error.code for o in outcomes if not isinstance(o, Exception)
                          and o.is_error]  # fmt: skip
        assert program_errors == [], program_errors[:5]
        refusals = [_capacity_refusal(o) for o in outcomes if isinstance(o, Exception)]
        reasons = {reason for reason, _ in refusals}
        assert "ADMISSION_LIMIT" in reasons, "the flood was not limited"
        assert reasons <= {"ADMISSION_LIMIT", "CODE_RUNTIME_EXHAUSTED"}, reasons
        assert stack.registry.admission.in_flight() == (0, 0)


async def test_run_code_on_a_full_runtime_is_retryable_capacity(make_stack: Any) -> None:
    runtime = {
        "worker_uid_base": 63_720,
        "worker_uid_count": 1,  # one sandbox: the first agent's run holds it
        "typescript_pool_size": 0,
        "capacity_retry_delay_s": RUNTIME_DELAY_S,
    }
    async with make_stack(pool_size=0, runtime_settings=runtime) as stack:
        release = asyncio.Event()
        entered: list[str] = []

        async def hold(invocation: Any) -> Any:
            entered.append(invocation.call_id)
            await release.wait()
            return {"ok": True}

        stack.registry.register_tool("hold", hold, description="waits", concurrency_safe=True)
        a, b = await stack.code_agent("a"), await stack.code_agent("b")
        first = asyncio.create_task(_run_code(stack, a, "a-1", "return await tools.hold({})"))
        await _until(lambda: entered)
        refused = await _run_code(stack, b, "b-1", "return 1")
        assert isinstance(refused, grpc.aio.AioRpcError), refused.error
        assert _capacity_refusal(refused) == ("CODE_RUNTIME_EXHAUSTED", RUNTIME_DELAY_S)
        assert "capacity" in refused.details() and "did not run" in refused.details()
        record = await stack.settled(b, "b-1")
        assert record.is_error and record.error_code == "CODE_RUNTIME_EXHAUSTED", record
        release.set()
        assert value_of(await first)["result"] == {"ok": True}
