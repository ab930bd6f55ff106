"""Integers longer than the channel carries (``flatwire.MAX_INT_DIGITS``, 4,300 digits).

A program may lift the interpreter's limit (``sys.set_int_max_str_digits(0)``) and build such
an integer; the runtime never lifts its own (longer int<->str conversions are quadratic). A
completion holding one is ``invalid-output`` at once, and a binding call holding one fails at
once with a ``ToolCallError`` the program can catch -- whether the worker refuses to send it
(its own check) or a modified worker sends the frame anyway (the runtime's). Over real gRPC.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2
from runtime_service.config import RuntimeSettings
from tests.runtime.conftest import connected, drive, serving, start_message
from tests.runtime.test_hostile_worker import (
    assert_no_worker_left,
    binding_calls,
    failure,
    hosting,
    success,
)

pb = runtime_pb2
INVALID_OUTPUT = pb.FAILURE_KIND_INVALID_OUTPUT
TOO_LONG = (
    "an integer has more than 4300 digits, the most the runtime's channel carries "
    "(send it as a string)"
)
LOSSY_COMPLETION = f"program completion must be lossless JSON: {TOO_LONG}"
LOSSY_ARGUMENTS = f"tool arguments must be lossless JSON: {TOO_LONG}"
LIFT = "import sys\nsys.set_int_max_str_digits(0)\n"
# Wall ceilings long enough that a run that hangs (the bug) ends as a timeout, not as this.
WALL_MS = 20_000


def settings() -> RuntimeSettings:
    return RuntimeSettings(listen="127.0.0.1:0", pool_size=1, shutdown_grace_s=0.2)


@pytest.mark.parametrize("lift", [LIFT, ""], ids=["limit-lifted", "default-limit"])
async def test_a_completion_with_a_huge_integer_is_invalid_output(lift: str) -> None:
    program = lift + "print('kept')\nreturn {'n': [10 ** 5000]}"
    async with serving(settings()) as running, connected(running) as stub:
        _, terminal = await drive(stub, start_message(program, wall_ms=WALL_MS))
    assert failure(terminal) == (INVALID_OUTPUT, LOSSY_COMPLETION)
    assert list(terminal.logs) == ["kept"]


# The first call's arguments hold the integer; the run goes on and its next call is answered.
CALLS = """\
try:
    await tools.echo({'n': 10 ** 5000})
    first = 'sent'
except ToolCallError as exc:
    first = [exc.toolName, exc.message]
return [first, await tools.echo({'n': 1})]
"""


@pytest.mark.parametrize("lift", [LIFT, ""], ids=["limit-lifted", "default-limit"])
async def test_a_call_with_a_huge_integer_fails_and_the_run_goes_on(lift: str) -> None:
    async with serving(settings()) as running, connected(running) as stub:
        seen, terminal = await drive(stub, start_message(lift + CALLS, "echo", wall_ms=WALL_MS))
    assert success(terminal) == [["echo", LOSSY_ARGUMENTS], {"echo": {"n": 1}}]
    assert binding_calls(seen) == [(1, "echo", '{"n":1}')]


HUGE = "1" * 5000
# Small frames are decoded on the event loop, large ones (over 1 MiB) on a decoding thread.
PADDING = {"small": "", "large": "p" * (2 << 20)}


@pytest.mark.parametrize("size", ["small", "large"])
async def test_forged_frames_with_a_huge_integer_fail_clearly(tmp_path: Path, size: str) -> None:
    # A modified worker sends the frames anyway: the call is answered with the failure (the
    # worker reads it), a later call still works, and the completion is invalid-output.
    pad = json.dumps(PADDING[size])
    call = (
        f'{{"t":"call","id":1,"name":"echo","args":[{{"kind":"array","length":2}},{pad},{HUGE}]}}'
    )
    done = f'{{"t":"done","value":[{{"kind":"array","length":2}},{pad},{HUGE}]}}'
    async with hosting(tmp_path) as host:
        host.fake_workers(
            "ready()\n"
            f"sock.sendall(raw_frame({call.encode()!r}))\n"
            "refused = recv()\n"
            "send({'t': 'call', 'id': 2, 'name': 'echo', 'args': ['after']})\n"
            "answered = recv()\n"
            "send({'t': 'log', 'text': json.dumps([refused, answered])})\n"
            f"sock.sendall(raw_frame({done.encode()!r}))\n"
            "time.sleep(60)\n"
        )
        seen, terminal = await drive(host.stub, start_message("return 1", "echo", wall_ms=WALL_MS))
        await assert_no_worker_left(host)
    assert failure(terminal) == (INVALID_OUTPUT, LOSSY_COMPLETION)
    refused, answered = json.loads(terminal.logs[0])
    assert refused == {"t": "reply", "id": 1, "ok": False, "message": LOSSY_ARGUMENTS}
    assert answered["id"] == 2 and answered["ok"] is True
    assert binding_calls(seen) == [(1, "echo", '"after"')]
