"""RuntimeService over a real grpc.aio server on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc_status import rpc_status

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from codemode_wire.grpc_status import error_info
from runtime_service.server import RunningRuntime
from tests.runtime.conftest import can_isolate, child_pids, drive, start_message

pb = runtime_pb2


async def test_capabilities_are_honest(stub: runtime_pb2_grpc.RuntimeServiceStub) -> None:
    caps = await stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert list(caps.languages) == ["python", "typescript"]
    assert caps.default_budgets.compute_ms == 60_000
    assert caps.max_budgets.max_output_bytes == 64 << 20
    assert any(
        item.startswith("network: own empty network namespace") for item in caps.isolation.enforced
    )
    topics = ("filesystem:", "processes:", "privileges:", "system calls:")
    for topic in topics:  # each protection is listed exactly once, on one side or the other
        sides = [
            any(item.startswith(topic) for item in caps.isolation.enforced),
            any(item.startswith(topic) for item in caps.isolation.not_enforced),
        ]
        assert sides.count(True) == 1, topic
        if can_isolate():
            assert sides[0], topic
    assert any(item.startswith("kernel:") for item in caps.isolation.not_enforced)
    if can_isolate():
        # Forked workers start from the fork server's root template, and say so.
        (filesystem,) = [m for m in caps.isolation.mechanisms if m.name == "filesystem"]
        assert filesystem.detail.endswith("(root: template (pivot_root))"), filesystem.detail


async def test_run_relays_binding_calls_and_logs(stub: runtime_pb2_grpc.RuntimeServiceStub) -> None:
    program = (
        "print('hello')\na = await tools.read({'n': 1})\n"
        "b = await tools['my-tool'](2)\nreturn [a, b]"
    )
    seen, terminal = await drive(stub, start_message(program, "read", "my-tool"))
    calls = [m.binding_call for m in seen if m.WhichOneof("kind") == "binding_call"]
    assert [(c.call_id, c.binding_name, c.token) for c in calls] == [
        (1, "read", b"parent-token"),
        (2, "my-tool", b"parent-token"),
    ]
    assert [m.log.text for m in seen if m.WhichOneof("kind") == "log"] == ["hello"]
    assert list(terminal.logs) == ["hello"]
    assert terminal.WhichOneof("outcome") == "success"
    assert json.loads(terminal.success.value_json) == [{"echo": {"n": 1}}, {"echo": 2}]


async def test_no_value_and_failures(stub: runtime_pb2_grpc.RuntimeServiceStub) -> None:
    _, terminal = await drive(stub, start_message("x = 1"))
    assert terminal.WhichOneof("outcome") == "success"
    assert not terminal.success.HasField("value_json")
    _, terminal = await drive(stub, start_message("while True:\n    pass", compute_ms=200))
    assert terminal.failure.kind == pb.FAILURE_KIND_TIMEOUT
    assert terminal.failure.message == "compute budget exhausted (200ms busy)"


async def test_tool_error_reaches_the_program(stub: runtime_pb2_grpc.RuntimeServiceStub) -> None:
    call = stub.Run()
    await call.write(
        start_message(
            "try:\n    await tools.t(1)\n"
            "except ToolCallError as e:\n    return [e.toolName, str(e)]",
            "t",
        )
    )
    message = await call.read()
    await call.write(
        pb.RunRequest(
            call_result=pb.CallResult(call_id=message.binding_call.call_id, error_message="denied")
        )
    )
    terminal = (await call.read()).terminal
    assert json.loads(terminal.success.value_json) == ["t", "denied"]


async def test_cancel_message_aborts(stub: runtime_pb2_grpc.RuntimeServiceStub) -> None:
    call = stub.Run()
    await call.write(start_message("print('started')\nawait tools.wait({})", "wait"))
    while (await call.read()).WhichOneof("kind") != "binding_call":
        pass
    await call.write(pb.RunRequest(cancel=pb.RunCancel(reason="user-cancel")))
    terminal = (await call.read()).terminal
    assert terminal.failure.kind == pb.FAILURE_KIND_ABORT
    assert terminal.failure.message == "user-cancel"
    assert list(terminal.logs) == ["started"]


async def test_invalid_requests_are_invalid_argument(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    for first in (
        start_message("return 1", compute_ms=10**9),
        start_message("return 1", max_output_bytes=3),
        pb.RunRequest(start=pb.RunStart(program="1", language="cobol")),
        pb.RunRequest(cancel=pb.RunCancel(reason="x")),
    ):
        call = stub.Run()
        await call.write(first)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = rpc_status.from_call(caught.value)
        assert status is not None
        info = error_info(status)
        assert info is not None and info.domain == "codemode.runtime"


async def test_client_cancellation_kills_the_worker(
    server: RunningRuntime, stub: runtime_pb2_grpc.RuntimeServiceStub
) -> None:
    call = stub.Run()
    await call.write(start_message("await tools.wait({})", "wait"))
    await call.read()
    call.cancel()
    for _ in range(100):
        if server.runtime.live_runs == 0:
            break
        await asyncio.sleep(0.02)
    assert server.runtime.live_runs == 0
    await server.runtime.pool.wait_filled()
    assert len(child_pids()) == server.runtime.pool.idle_count


async def test_shutdown_aborts_live_runs_with_runtime_disposed(
    server: RunningRuntime, stub: runtime_pb2_grpc.RuntimeServiceStub
) -> None:
    call = stub.Run()
    await call.write(start_message("await tools.wait({})", "wait"))
    await call.read()
    stopping = asyncio.create_task(server.stop(0.1))
    terminal = (await call.read()).terminal
    await stopping
    assert terminal.failure.kind == pb.FAILURE_KIND_ABORT
    assert terminal.failure.message == "runtime disposed"
    assert child_pids(fork_servers=True) == []
