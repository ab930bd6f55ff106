"""The runtime's side: a `run_program` span per run, continuing `RunStart.trace_context`, named
as the parent in every `BindingCall.trace_context`; run metrics by terminal kind and budget."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from codemode_wire.api.common.v1 import trace_pb2
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc
from runtime_service.config import RuntimeSettings
from runtime_service.server import start
from tests.telemetry.conftest import Captured

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


@pytest.fixture
async def stub(captured: Captured) -> AsyncIterator[runtime_pb2_grpc.RuntimeServiceStub]:
    running = await start(
        RuntimeSettings(listen="127.0.0.1:0", pool_size=1),
        tracer_provider=captured.runtime.tracer_provider,
        meter_provider=captured.runtime.meter_provider,
    )
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            yield runtime_pb2_grpc.RuntimeServiceStub(channel)
    finally:
        await running.stop(0)


def start_message(
    program: str, *names: str, traceparent: str = "", **budgets: int
) -> pb.RunRequest:
    return pb.RunRequest(
        start=pb.RunStart(
            program=program,
            language="python",
            binding_names=list(names),
            token=b"parent-token",
            budgets=pb.RunBudgets(**budgets),
            trace_context=trace_pb2.TraceContext(traceparent=traceparent),
        )
    )


async def drive(
    stub: runtime_pb2_grpc.RuntimeServiceStub, first: pb.RunRequest
) -> tuple[list[pb.BindingCall], pb.RunTerminal]:
    """Runs one program, answering every binding call with its arguments."""
    call = stub.Run()
    await call.write(first)
    calls: list[pb.BindingCall] = []
    async for message in call:
        kind = message.WhichOneof("kind")
        if kind == "binding_call":
            calls.append(message.binding_call)
            result = pb.CallResult(
                call_id=message.binding_call.call_id,
                value_json=message.binding_call.arguments_json,
            )
            await call.write(pb.RunRequest(call_result=result))
        elif kind == "terminal":
            await call.done_writing()
            return calls, message.terminal
    raise AssertionError("stream ended without a terminal message")


async def test_binding_calls_carry_the_run_span(
    stub: runtime_pb2_grpc.RuntimeServiceStub, captured: Captured
) -> None:
    program = "a = await tools.echo({'n': 1})\nb = await tools.echo({'n': 2})\nreturn [a, b]"
    caller = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
    calls, terminal = await drive(stub, start_message(program, "echo", traceparent=caller))
    assert json.loads(terminal.success.value_json) == [{"n": 1}, {"n": 2}]

    spans = await captured.wait_for(lambda s: any(x.name == "run_program" for x in s))
    (run,) = [s for s in spans if s.name == "run_program"]
    assert run.kind is SpanKind.INTERNAL
    assert f"{run.context.trace_id:032x}" == TRACE_ID
    assert run.parent is not None and f"{run.parent.span_id:016x}" == CALLER_SPAN
    expected = f"00-{TRACE_ID}-{run.context.span_id:016x}-01"
    assert [c.trace_context.traceparent for c in calls] == [expected, expected]
    assert (run.attributes or {})["codemode.run.terminal_kind"] == "ok"
    assert (run.attributes or {})["codemode.run.bindings"] == 1
    assert [e.name for e in run.events] == ["worker_handoff", "terminal"]
    assert run.status.status_code is StatusCode.UNSET

    runtime = captured.runtime
    assert runtime.total("codemode.runtime.worker.handoff", "count") == [1]
    assert runtime.by("codemode.runtime.runs.terminal", "codemode.run.terminal_kind") == {"ok": 1}


async def test_budget_kill_without_caller_context(
    stub: runtime_pb2_grpc.RuntimeServiceStub, captured: Captured
) -> None:
    _calls, terminal = await drive(stub, start_message("while True:\n    pass", compute_ms=200))
    assert terminal.failure.kind == pb.FAILURE_KIND_TIMEOUT

    spans = await captured.wait_for(
        lambda s: (
            any(x.name == "run_program" for x in s) and any(x.kind is SpanKind.SERVER for x in s)
        )
    )
    (run,) = [s for s in spans if s.name == "run_program"]
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    # No RunStart context: the run continues the gRPC server span's trace.
    assert run.parent is not None and run.parent.span_id == server.context.span_id
    assert server.name.endswith("RuntimeService/Run")
    attributes = run.attributes or {}
    assert attributes["codemode.run.terminal_kind"] == "timeout"
    assert attributes["codemode.budget"] == "compute"
    assert run.status.status_code is StatusCode.ERROR

    runtime = captured.runtime
    assert runtime.by("codemode.runtime.budget_kills", "codemode.budget") == {"compute": 1}
    kind = "codemode.run.terminal_kind"
    assert runtime.by("codemode.runtime.run.duration", kind, "count") == {"timeout": 1}
    assert runtime.total("codemode.runtime.runs.active") == [0]


async def test_refused_run_ends_its_span(
    stub: runtime_pb2_grpc.RuntimeServiceStub, captured: Captured
) -> None:
    request = start_message("return 1")
    request.start.language = "cobol"
    call = stub.Run()
    await call.write(request)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    spans = await captured.wait_for(lambda s: any(x.name == "run_program" for x in s))
    (run,) = [s for s in spans if s.name == "run_program"]
    assert (run.attributes or {})["codemode.run.terminal_kind"] == "invalid-run"
    assert run.status.status_code is StatusCode.ERROR
    assert captured.runtime.total("codemode.runtime.runs.active") == [0]
