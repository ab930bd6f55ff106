"""Text that leaves the runtime over gRPC is always valid UTF-8.

Log lines and failure messages travel in protobuf string fields, which cannot hold a lone
surrogate: the runtime replaces each one with U+FFFD where worker text enters the host (and
charges the replacement). Completion values are lossless JSON instead: a lone surrogate in a
string stays, escaped as ``\\udxxx`` in ``value_json``, and reads back unchanged.

Also here, over the same server: a run whose caller's deadline has already passed ends as a
timeout without taking a worker.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from codemode_wire import jsonvalue
from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.config import RuntimeSettings
from runtime_service.server import RunningRuntime, start
from runtime_service.worker.ledger import LOG_LINE_OVERHEAD
from tests.runtime.conftest import child_pids
from tests.runtime.test_hostile import PRELUDE

pb = runtime_pb2
# Every run here ends long before this; a hang shows up as a failed wait, not a stuck suite.
_RUN_TIMEOUT_S = 15.0


@pytest.fixture
async def server() -> AsyncIterator[RunningRuntime]:
    running = await start(RuntimeSettings(listen="127.0.0.1:0", pool_size=1, shutdown_grace_s=0.2))
    try:
        yield running
    finally:
        await running.stop(0)
    assert child_pids(fork_servers=True) == []


@pytest.fixture
async def stub(server: RunningRuntime) -> AsyncIterator[runtime_pb2_grpc.RuntimeServiceStub]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield runtime_pb2_grpc.RuntimeServiceStub(channel)


async def run(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
    program: str,
    *names: str,
    time_left: Duration | None = None,
    **budgets: int,
) -> tuple[list[str], pb.RunTerminal]:
    """Run ``program`` (binding calls answered with their arguments); return the streamed log
    lines and the terminal message, checking that exactly one terminal ends the stream."""
    start_message = pb.RunRequest(
        start=pb.RunStart(
            program=program,
            language="python",
            binding_names=list(names),
            budgets=pb.RunBudgets(wall_ms=20_000, **budgets),
            timeout=time_left,
        )
    )

    async def drive() -> tuple[list[str], list[pb.RunTerminal]]:
        call = stub.Run()
        await call.write(start_message)
        logs: list[str] = []
        terminals: list[pb.RunTerminal] = []
        async for message in call:
            kind = message.WhichOneof("kind")
            if kind == "log":
                logs.append(message.log.text)
            elif kind == "binding_call":
                result = pb.CallResult(
                    call_id=message.binding_call.call_id,
                    value_json=message.binding_call.arguments_json,
                )
                await call.write(pb.RunRequest(call_result=result))
            elif kind == "terminal":
                terminals.append(message.terminal)
                await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        return logs, terminals

    logs, terminals = await asyncio.wait_for(drive(), _RUN_TIMEOUT_S)
    assert len(terminals) == 1, terminals
    return logs, terminals[0]


async def test_print_of_a_lone_surrogate(stub: runtime_pb2_grpc.RuntimeServiceStub) -> None:
    logs, terminal = await run(stub, "print('\\ud800')\nprint('after')\nreturn 'done'")
    assert logs == ["\ufffd", "after"]
    assert list(terminal.logs) == logs
    assert json.loads(terminal.success.value_json) == "done"


async def test_exception_message_with_a_lone_surrogate(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    _, terminal = await run(stub, "raise ValueError('bad \\udcff name')")
    assert terminal.failure.kind == pb.FAILURE_KIND_EXCEPTION
    assert terminal.failure.message.endswith("ValueError: bad \ufffd name")


async def test_surrogateescape_filename(stub: runtime_pb2_grpc.RuntimeServiceStub) -> None:
    program = "name = b'caf\\xff.txt'.decode('utf-8', 'surrogateescape')\nprint(name)"
    logs, terminal = await run(stub, program)
    assert logs == ["caf\ufffd.txt"]
    assert list(terminal.logs) == logs


async def test_mixed_text_keeps_valid_characters(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    program = "text = 'é😀\\ud800é😀'\nprint(text)\nreturn text"
    logs, terminal = await run(stub, program)
    assert logs == ["é😀\ufffdé😀"]
    assert list(terminal.logs) == logs
    # The value is lossless JSON: the surrogate is escaped in the text and reads back as is.
    assert "\\ud800" in terminal.success.value_json
    assert jsonvalue.loads(terminal.success.value_json) == "é😀\ud800é😀"


async def test_forged_log_and_error_with_lone_surrogates(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    # Sent as one write: the frames after the bad log reach the host in the same read.
    program = PRELUDE + (
        "def frame(obj):\n"
        "    payload = json.dumps(obj).encode()\n"
        "    return struct.pack('>I', len(payload)) + payload\n"
        "send_raw(frame({'t': 'log', 'text': 'x\\udfff'}) + frame({'t': 'log', 'text': 'y'})"
        " + frame({'t': 'done', 'error': {'kind': 'exception', 'message': '\\ud800!'}}))\n"
        "import time\ntime.sleep(30)"
    )
    logs, terminal = await run(stub, program)
    assert logs == ["x\ufffd", "y"]
    assert list(terminal.logs) == logs
    assert terminal.failure.kind == pb.FAILURE_KIND_EXCEPTION
    assert terminal.failure.message == "\ufffd!"


async def test_replacement_is_what_the_output_budget_charges(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    # '["\ufffd"]' is 7 bytes (U+FFFD is 3 in UTF-8); the escaped surrogate would be 10 (each
    # plus the line's overhead).
    program = PRELUDE + "send({'t': 'log', 'text': '\\ud800'})"
    logs, terminal = await run(stub, program, max_output_bytes=8 + LOG_LINE_OVERHEAD)
    assert logs == ["\ufffd"]
    assert terminal.WhichOneof("outcome") == "success"
    assert list(terminal.logs) == ["\ufffd"]


async def test_forged_raw_surrogate_bytes_are_junk(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    # Frames are ASCII JSON. Raw (not escaped) surrogates could hold a high+low pair as two
    # code points, which no JSON text can carry: such a frame is dropped like other junk.
    program = PRELUDE + (
        "def send_bytes(body):\n"
        "    send_raw(struct.pack('>I', len(body)) + body)\n"
        "pair = '\\ud83d\\ude00'.encode('utf-8', 'surrogatepass')\n"
        'send_bytes(b\'{"t":"done","value":["\' + pair + b\'"]}\')\n'
        'send_bytes(b\'{"t":"log","text":"\' + pair + b\'"}\')\n'
        "return 'real'"
    )
    logs, terminal = await run(stub, program)
    assert logs == []
    assert json.loads(terminal.success.value_json) == "real"


@pytest.mark.parametrize(
    "time_left",
    [Duration(), Duration(nanos=900_000), Duration(seconds=-3)],
    ids=["zero", "under-a-millisecond", "negative"],
)
async def test_an_expired_deadline_times_out_without_a_worker(
    server: RunningRuntime, stub: runtime_pb2_grpc.RuntimeServiceStub, time_left: Duration
) -> None:
    pool = server.runtime.pool
    await pool.wait_filled()
    before = child_pids()
    logs, terminal = await run(stub, "return 1", time_left=time_left)
    assert logs == []
    assert terminal.failure.kind == pb.FAILURE_KIND_TIMEOUT
    assert terminal.failure.message == "deadline passed before the run started"
    assert (pool.idle_count, pool.live_workers) == (1, 1)
    assert child_pids() == before  # the idle worker is still the same process
    # A deadline with time left still runs the program.
    _, terminal = await run(stub, "return 1", time_left=Duration(seconds=30))
    assert json.loads(terminal.success.value_json) == 1


async def test_the_worker_charges_a_lone_surrogate_as_the_runtime_does(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    # 15 lone surrogates become 15 U+FFFD, 3 bytes each: 2 ("[]") + 47 fits in 64 bytes (plus the
    # line's overhead); charged as 6-byte escapes (what the worker did before it applied the same
    # rule) it would not.
    logs, terminal = await run(
        stub, "print('\\ud800' * 15)", max_output_bytes=64 + LOG_LINE_OVERHEAD
    )
    assert logs == ["\ufffd" * 15]
    assert terminal.WhichOneof("outcome") == "success", terminal
