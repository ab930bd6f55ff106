"""Every terminal outcome and budget through the RuntimeService API (real gRPC on loopback, real
workers): exactly one terminal message, with the kind and text the in-process tests assert."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import grpc
import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.config import ConfigError, RuntimeSettings, load_settings, terminal_headroom
from runtime_service.runtime import RuntimeOptions
from runtime_service.worker import framing
from runtime_service.worker.ledger import LOG_LINE_OVERHEAD
from tests.runtime.conftest import (
    connected,
    drive,
    grpc_settings,
    never_answer,
    serving,
    start_message,
    streamed_logs,
)

pb = runtime_pb2
Stub = runtime_pb2_grpc.RuntimeServiceStub
TIMEOUT = pb.FAILURE_KIND_TIMEOUT
WORKER_EXIT = pb.FAILURE_KIND_WORKER_EXIT
INVALID_OUTPUT = pb.FAILURE_KIND_INVALID_OUTPUT
OUTPUT_LIMIT = pb.FAILURE_KIND_OUTPUT_LIMIT


def failure(terminal: runtime_pb2.RunTerminal) -> tuple[int, str]:
    assert terminal.WhichOneof("outcome") == "failure", terminal
    return terminal.failure.kind, terminal.failure.message


def success_json(terminal: runtime_pb2.RunTerminal) -> str:
    assert terminal.WhichOneof("outcome") == "success", terminal
    return terminal.success.value_json


# -- timeouts and worker exits (logs admitted before the end are kept) -------------------------


@pytest.mark.parametrize(
    ("program", "limits", "message"),
    [
        # Ceilings of seconds, not milliseconds: on a loaded host a 300 ms ceiling could end the
        # run before its first line was printed (the outcome is the same; the logs were not).
        ("await tools.wait({})", {"wall_ms": 3000}, "wall-clock ceiling reached (3000ms)"),
        ("import time\ntime.sleep(30)", {"wall_ms": 3000}, "wall-clock ceiling reached (3000ms)"),
        # The caller's deadline (RunStart.timeout) lowers the wall ceiling.
        ("await tools.wait({})", {"timeout_ms": 2000}, "wall-clock ceiling reached (2000ms)"),
    ],
    ids=["unanswered-call", "sleeping", "deadline"],
)
async def test_wall_ceiling(stub: Stub, program: str, limits: dict[str, int], message: str) -> None:
    first = start_message(f"print('before')\n{program}", "wait", **limits)
    seen, terminal = await drive(stub, first, never_answer)
    assert failure(terminal) == (TIMEOUT, message)
    assert list(terminal.logs) == streamed_logs(seen) == ["before"]


@pytest.mark.parametrize(
    ("program", "message"),
    [
        ("import os\nos._exit(7)", "worker exited with code 7 before completing"),
        (
            "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
            "worker killed by signal SIGSEGV before completing",
        ),
        (
            "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
            "worker killed by signal SIGKILL before completing",
        ),
        ("x = b'x' * (1 << 30)", "worker exceeded its memory budget (96 MiB)"),
        (
            "x = []\nwhile True:\n    x.append(' ' * 100000)",
            "worker exceeded its memory budget (96 MiB)",
        ),
    ],
    ids=["exit-code", "sigsegv", "sigkill", "one-big-allocation", "growing-list"],
)
async def test_worker_exit(stub: Stub, program: str, message: str) -> None:
    first = start_message(f"print('x')\n{program}", memory_bytes=96 << 20, wall_ms=10_000)
    seen, terminal = await drive(stub, first)
    assert failure(terminal) == (WORKER_EXIT, message)
    assert list(terminal.logs) == streamed_logs(seen) == ["x"]


# -- completion values and the output cap --------------------------------------------------


@pytest.mark.parametrize(
    "value", ["float('nan')", "float('-inf')", "-0.0", "{1, 2}", "(1, 2)", "{1: 2}"]
)
async def test_lossy_completion_is_invalid_output(stub: Stub, value: str) -> None:
    _, terminal = await drive(stub, start_message(f"print('kept')\nreturn {value}"))
    assert failure(terminal) == (INVALID_OUTPUT, "program completion must be lossless JSON")
    assert list(terminal.logs) == ["kept"]
    # Integers beyond the channel's digit limit: tests/runtime/test_huge_values.py.


# With a 96-byte cap the logs array ["x...x"] (4 + n bytes and the line's overhead of 32)
# fits exactly at n = 60, the value "x...x" (2 + n bytes) with the empty logs array (2 bytes) at
# n = 92. Over the cap, the failure message takes 32 bytes and what is kept of the logs fits
# the other 64.
@pytest.mark.parametrize(
    ("case", "logs", "value_json", "logs_over"),
    [
        (("print('x' * {n})", 60), ["x" * 60], None, ["x" * 28]),
        (("return 'x' * {n}", 92), [], f'"{"x" * 92}"', []),
    ],
    ids=["log", "value"],
)
async def test_output_cap_is_exact(
    stub: Stub, case: tuple[str, int], logs: list[str], value_json: str | None, logs_over: list[str]
) -> None:
    assert LOG_LINE_OVERHEAD == 32
    program, n = case
    seen, terminal = await drive(stub, start_message(program.format(n=n), max_output_bytes=96))
    assert terminal.WhichOneof("outcome") == "success", terminal.failure
    assert list(terminal.logs) == streamed_logs(seen) == logs
    value = terminal.success.value_json if terminal.success.HasField("value_json") else None
    assert value == value_json
    over = start_message(program.format(n=n + 1), max_output_bytes=96)
    _, terminal = await drive(stub, over)
    assert failure(terminal) == (OUTPUT_LIMIT, "outer output exceeded 96 bytes")
    assert list(terminal.logs) == logs_over


# -- binding calls ---------------------------------------------------------------------------


async def test_outstanding_call_cap(stub: Stub) -> None:
    # Nothing is answered until the third call has been refused (its failure is logged), so
    # two calls are outstanding when it is made, whatever the timing.
    program = (
        "first, second, third = tools.t(1), tools.t(2), tools.t(3)\n"
        "try:\n    await third\nexcept ToolCallError as exc:\n    print(str(exc))\n"
        "return [await first, await second]"
    )
    call = stub.Run()
    await call.write(start_message(program, "t", max_outstanding_calls=2))
    calls: list[runtime_pb2.BindingCall] = []
    while (message := await call.read()).WhichOneof("kind") != "log":
        calls.append(message.binding_call)
    assert message.log.text == "too many outstanding binding calls (limit 2)"
    assert [(c.call_id, c.arguments_json) for c in calls] == [(1, "1"), (2, "2")]
    for relayed in calls:
        result = pb.CallResult(call_id=relayed.call_id, value_json=f"[{relayed.arguments_json}]")
        await call.write(pb.RunRequest(call_result=result))
    message = await call.read()
    assert success_json(message.terminal) == "[[1],[2]]"
    assert list(message.terminal.logs) == ["too many outstanding binding calls (limit 2)"]
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF


async def test_pending_call_does_not_consume_compute(stub: Stub) -> None:
    async def late_answer(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
        await asyncio.sleep(0.6)
        return pb.CallResult(call_id=call.call_id, value_json='"late"')

    started = time.monotonic()
    first = start_message("return await tools.t(1)", "t", compute_ms=300)
    _, terminal = await drive(stub, first, late_answer)
    assert success_json(terminal) == '"late"'
    assert time.monotonic() - started >= 0.6


@pytest.mark.parametrize(
    "value_json",
    [
        "NaN",
        "[1, Infinity]",
        "1e400",
        "-0.0",
        '{"a": 1, "a": 2}',
        "[1,]",
        "not json",
        "",
        pytest.param("1" * 5000, id="5000-digit-int"),  # beyond int_max_str_digits
    ],
)
async def test_lossy_call_result_is_a_typed_failure(stub: Stub, value_json: str) -> None:
    async def lossy(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
        return pb.CallResult(call_id=call.call_id, value_json=value_json)

    program = (
        "try:\n    await tools.t(1)\nexcept ToolCallError as e:\n    return [e.toolName, str(e)]"
    )
    _, terminal = await drive(stub, start_message(program, "t", wall_ms=1_500), lossy)
    assert success_json(terminal) == '["t","binding resolution must be lossless JSON"]'


async def test_hundred_thousand_deep_values_cross_the_stream(stub: Stub) -> None:
    depth = 100_000
    program = (
        "value = []\ncursor = value\n"
        f"for _ in range({depth}):\n    child = []\n    cursor.append(child)\n    cursor = child\n"
        "reply = await tools.echo(value)\n"
        "levels, node = 0, reply\nwhile node:\n    node, levels = node[0], levels + 1\n"
        "print(levels)\nreturn reply"
    )
    relayed: list[str] = []
    reply = "[" * (depth + 2) + "]" * (depth + 2)  # one level deeper than the arguments

    async def answer(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
        relayed.append(call.arguments_json)
        return pb.CallResult(call_id=call.call_id, value_json=reply)

    _, terminal = await drive(stub, start_message(program, "echo"), answer)
    assert relayed == ["[" * (depth + 1) + "]" * (depth + 1)]
    assert list(terminal.logs) == [str(depth + 1)]
    assert success_json(terminal) == reply


@pytest.mark.parametrize(
    "argument",
    [
        "float('nan')",
        "-0.0",
        "(1, 2)",
        "{1: 2}",
        "object()",
        "{'a': {1}}",
        pytest.param("10**5000", id="5000-digit-int"),  # beyond int_max_str_digits
    ],
)
async def test_unsendable_arguments_raise_a_tool_call_error(stub: Stub, argument: str) -> None:
    program = (
        f"try:\n    tools.t({argument})\n"
        "except ToolCallError as exc:\n    return [exc.toolName, str(exc)]"
    )
    seen, terminal = await drive(stub, start_message(program, "t"))
    name, message = json.loads(success_json(terminal))
    assert name == "t"
    assert message.startswith("tool arguments must be lossless JSON")
    assert [m for m in seen if m.WhichOneof("kind") == "binding_call"] == []


# -- message-size limits ---------------------------------------------------------------------


def test_message_limit_must_hold_a_terminal_at_the_output_cap() -> None:
    cap = 1 << 20
    needed = cap + terminal_headroom(cap)
    budgets: dict[str, Any] = {"max_output_bytes": cap, "default_max_output_bytes": cap}
    assert load_settings(None, max_message_bytes=needed, **budgets).max_message_bytes == needed
    with pytest.raises(ConfigError) as caught:
        load_settings(None, max_message_bytes=needed - 1, **budgets)
    assert str(caught.value).startswith(
        f"max_message_bytes ({needed - 1}) must be at least {needed}: "
        f"max_output_bytes ({cap}) plus {needed - cap} bytes of framing"
    )
    with pytest.raises(ConfigError, match="max_message_bytes"):
        load_settings(max_message_bytes=64 << 20)  # the default output cap is 64 MiB
    load_settings()  # the defaults hold together


async def test_a_terminal_at_the_output_cap_fits_the_tightest_message_limit() -> None:
    # Log entries of 16 KiB are where protobuf framing outgrows the ledger's JSON accounting
    # (a 3-byte length prefix): 15 of them (each with its line's overhead) and a value make
    # exactly the output cap.
    cap = 256 << 10
    settings = grpc_settings(
        max_output_bytes=cap,
        default_max_output_bytes=cap,
        max_message_bytes=cap + terminal_headroom(cap),
    )
    logs_bytes = 2 + 15 * (16384 + 2 + LOG_LINE_OVERHEAD) + 14
    value_chars = cap - logs_bytes - 2
    program = "for _ in range(15):\n    print('x' * 16384)\nreturn 'v' * {n}"
    async with serving(settings) as running, connected(running) as stub:
        _, terminal = await drive(stub, start_message(program.format(n=value_chars)))
        assert list(terminal.logs) == ["x" * 16384] * 15
        assert success_json(terminal) == f'"{"v" * value_chars}"'
        _, terminal = await drive(stub, start_message(program.format(n=value_chars + 1)))
        assert failure(terminal) == (OUTPUT_LIMIT, f"outer output exceeded {cap} bytes")


async def test_binding_arguments_over_the_message_limit_fail_only_that_call() -> None:
    settings = grpc_settings(
        max_output_bytes=16 << 10, default_max_output_bytes=16 << 10, max_message_bytes=64 << 10
    )
    program = (
        "try:\n    await tools.t('x' * 100000)\n"
        "except ToolCallError as exc:\n    return [exc.toolName, str(exc)]"
    )
    async with serving(settings) as running, connected(running) as stub:
        _, terminal = await drive(stub, start_message(program, "t", wall_ms=5_000))
    name, message = json.loads(success_json(terminal))
    assert name == "t" and str(64 << 10) in message


def test_frame_cap_admits_what_the_default_message_limit_can_carry() -> None:
    # See framing.MAX_FRAME_BYTES: string content costs at most 3x its JSON text on the wire.
    assert 3 * RuntimeSettings().max_message_bytes <= framing.MAX_FRAME_BYTES


# A fake worker: ready, then a frame one byte over the cap (streamed, never held in memory
# here), then a log frame, then exit 3.
OVERSIZED_FRAME_WORKER = f"""\
import json, os, socket, struct, sys
sock = socket.socket(fileno=int(sys.argv[2]))
def send(obj):
    payload = json.dumps(obj).encode()
    sock.sendall(struct.pack('>I', len(payload)) + payload)
send({{'t': 'ready', 'sandbox': {{}}}})
sock.recv(1 << 20)
left = {framing.MAX_FRAME_BYTES + 1}
sock.sendall(struct.pack('>I', left))
chunk = b'x' * (1 << 20)
while left > 0:
    sock.sendall(chunk[:left])
    left -= len(chunk)
send({{'t': 'log', 'text': 'after the oversized frame'}})
os._exit(3)
"""


class FakeWorkerSettings(RuntimeSettings):
    """Runtime settings whose workers run ``OVERSIZED_FRAME_WORKER`` instead of the bootstrap."""

    def runtime_options(self) -> RuntimeOptions:
        options = super().runtime_options()
        worker = dataclasses.replace(options.worker, loader=OVERSIZED_FRAME_WORKER)
        return dataclasses.replace(options, worker=worker)


def _reset_peak_rss() -> int:
    """Restart this process's peak-RSS count (VmHWM) from its current RSS; return that."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


async def test_oversized_frame_is_discarded_unread_and_the_run_ends_as_worker_exit() -> None:
    settings = FakeWorkerSettings(listen="127.0.0.1:0", pool_size=0, shutdown_grace_s=0.2)
    async with serving(settings) as running, connected(running) as stub:
        before = _reset_peak_rss()
        seen, terminal = await drive(stub, start_message("return 1", wall_ms=20_000))
        grown = _peak_rss_bytes() - before
    assert failure(terminal) == (WORKER_EXIT, "worker exited with code 3 before completing")
    # The channel stays in step past the skipped frame, and nothing of it was held.
    assert list(terminal.logs) == streamed_logs(seen) == ["after the oversized frame"]
    assert grown < framing.MAX_FRAME_BYTES // 8, f"peak RSS grew by {grown >> 20} MiB"
