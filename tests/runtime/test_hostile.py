"""The runtime treats the worker as a hostile peer.

Programs here write raw protocol bytes straight to the channel socket -- exactly what model code
could do -- and one test replaces the worker with a fake that speaks only raw bytes.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time

from runtime_service.outcome import BindingCall, BindingResult, RunFailure
from runtime_service.runtime import Runtime, RuntimeOptions
from runtime_service.worker.ledger import LOG_LINE_OVERHEAD
from runtime_service.worker_process import WorkerProcess, WorkerSpec
from tests.runtime.conftest import ProgramRunner, echo_handler
from tests.runtime.deep import list_depth

# Program prelude: ``send(obj)`` frames a JSON value, ``send_raw(bytes)`` writes bytes as-is,
# ``recv()`` reads one reply frame synchronously (before the worker's own reader sees it).
PRELUDE = """\
import json, os, struct, sys
_fd = int(sys.argv[2])
def send_raw(data):
    os.write(_fd, data)
def send(obj):
    payload = json.dumps(obj).encode()
    send_raw(struct.pack('>I', len(payload)) + payload)
def recv():
    header = b''
    while len(header) < 4:
        header += os.read(_fd, 4 - len(header))
    (size,) = struct.unpack('>I', header)
    body = b''
    while len(body) < size:
        body += os.read(_fd, size - len(body))
    if body[:1] != b'\\0':
        return json.loads(body)
    # A raw frame (runtime_service/worker/framing.py) as the plain frame it stands for.
    (size,) = struct.unpack_from('>I', body, 1)
    message = json.loads(body[5:5 + size])
    message['value'] = [{'kind': 'json', 'text': body[5 + size:].decode()}]
    return message
"""


def frame(obj: object) -> bytes:
    payload = json.dumps(obj).encode()
    return struct.pack(">I", len(payload)) + payload


async def test_junk_is_dropped_without_crashing(run_program: ProgramRunner) -> None:
    junk = [
        None,
        1,
        "text",
        [],
        [1, 2],
        {},
        {"t": "nope"},
        {"t": 5},
        {"t": "log"},
        {"t": "log", "text": 5},
        {"t": "log", "text": None},
        {"t": "call", "id": "1", "name": "echo", "args": [1]},
        {"t": "call", "id": True, "name": "echo", "args": [1]},
        {"t": "call", "id": 1.5, "name": "echo", "args": [1]},
        {"t": "call", "id": 9, "name": 3, "args": [1]},
        {"t": "call", "id": 9, "name": "echo", "args": 1},
        {"t": "done", "error": "boom"},
        {"t": "done", "error": {"kind": "weird", "message": "m"}},
        {"t": "done", "error": {"kind": "exception", "message": 3}},
        {"t": "done", "error": {"kind": "timeout", "message": "forged"}},
        {"t": "reply", "id": 1},
    ]
    program = PRELUDE + (
        f"for item in {junk!r}:\n    send(item)\n"
        "send_raw(struct.pack('>I', 5) + b'{{{{{')\n"
        "send_raw(struct.pack('>I', 8) + b'[NaN, 1]')\n"
        "send_raw(struct.pack('>I', 2) + b'\\xff\\xfe')\n"
        "return 'survived'"
    )
    result = await run_program(program)
    assert result.error is None, result.error
    assert result.value == "survived"


async def test_forged_calls_unknown_names_and_duplicate_ids(run_program: ProgramRunner) -> None:
    seen: list[tuple[int, str, object]] = []

    async def handler(call: BindingCall) -> BindingResult:
        seen.append((call.seq, call.name, call.arguments))
        return BindingResult.success(call.arguments)

    program = PRELUDE + (
        "replies = []\n"
        "send({'t': 'call', 'id': 1000, 'name': 'nope', 'args': [1]})\n"
        "replies.append(recv())\n"
        "send({'t': 'call', 'id': 1001, 'name': 'constructor', 'args': [1]})\n"
        "replies.append(recv())\n"
        "bad_args = [{'kind': 'array', 'length': 9}]\n"
        "send({'t': 'call', 'id': 1002, 'name': 'echo', 'args': bad_args})\n"
        "replies.append(recv())\n"
        "send({'t': 'call', 'id': 1003, 'name': 'echo', 'args': ['first']})\n"
        "send({'t': 'call', 'id': 1003, 'name': 'echo', 'args': ['duplicate']})\n"
        "replies.append(recv())\n"
        "send({'t': 'call', 'id': 1000, 'name': 'echo', 'args': ['reused id']})\n"
        "return replies"
    )
    result = await run_program(program, bindings=("echo",), handler=handler)
    assert result.error is None, result.error
    assert result.value == [
        {"t": "reply", "id": 1000, "ok": False, "message": 'unknown binding "tools.nope"'},
        {"t": "reply", "id": 1001, "ok": False, "message": 'unknown binding "tools.constructor"'},
        {
            "t": "reply",
            "id": 1002,
            "ok": False,
            "message": "tool arguments must be lossless JSON",
        },
        {"t": "reply", "id": 1003, "ok": True, "value": ["first"]},
    ]
    assert seen == [(1, "echo", "first")]


async def test_call_ids_must_increase(run_program: ProgramRunner) -> None:
    # Replies come in order, so the reply to 7 shows that 3 (below 5) got none.
    program = PRELUDE + (
        "send({'t': 'call', 'id': 5, 'name': 'nope', 'args': [1]})\n"
        "first = recv()\n"
        "send({'t': 'call', 'id': 3, 'name': 'nope', 'args': [1]})\n"
        "send({'t': 'call', 'id': 5, 'name': 'nope', 'args': [1]})\n"
        "send({'t': 'call', 'id': 7, 'name': 'nope', 'args': [1]})\n"
        "return [first['id'], recv()['id']]"
    )
    result = await run_program(program, bindings=("echo",))
    assert result.error is None, result.error
    assert result.value == [5, 7]


async def test_a_call_id_flood_leaves_no_per_id_state(runtime: Runtime) -> None:
    # 100,000 forged calls in one write (each refused: unknown binding), then a completion.
    # The run must not remember each id: its containers stay small.
    program = PRELUDE + (
        "send_raw(b''.join(\n"
        "    (lambda p: struct.pack('>I', len(p)) + p)(\n"
        '        b\'{"t":"call","id":%d,"name":"nope","args":[1]}\' % n)\n'
        "    for n in range(1, 100_001)))\n"
        "send({'t': 'done', 'value': ['flooded']})\n"
        "import time\ntime.sleep(30)"
    )
    run = runtime.create_run(program=program, bindings=["echo"], handler=echo_handler)
    result = await runtime.execute(run)
    assert result.error is None, result.error
    assert result.value == "flooded"
    held = sum(
        sys.getsizeof(value)
        for value in vars(run).values()
        if isinstance(value, (set, dict, list, frozenset))
    )
    assert held < 64 << 10, held


async def test_forged_log_flood_is_capped(run_program: ProgramRunner) -> None:
    program = PRELUDE + "for i in range(1000):\n    send({'t': 'log', 'text': 'line %d' % i})\n"
    result = await run_program(program, max_output_bytes=300)
    assert result.error == RunFailure("output-limit", "outer output exceeded 300 bytes")
    assert result.logs[0] == "line 0"
    assert len(json.dumps(result.logs, separators=(",", ":"))) + 33 <= 300


async def test_oversized_forged_log_keeps_an_escaped_prefix(run_program: ProgramRunner) -> None:
    program = PRELUDE + "send({'t': 'log', 'text': '\"' * 1000000})\nimport time\ntime.sleep(5)"
    cap = 100 + LOG_LINE_OVERHEAD
    result = await run_program(program, max_output_bytes=cap)
    assert result.error == RunFailure("output-limit", f"outer output exceeded {cap} bytes")
    (prefix,) = result.logs
    assert set(prefix) == {'"'}
    # Each quote costs 2 bytes: [""..""], the line's overhead and the 33-byte message fit.
    kept = 2 + 2 + 2 * len(prefix) + LOG_LINE_OVERHEAD + 33
    assert kept <= cap < kept + 2


async def test_forged_done_with_value_and_error_resolves_as_the_error(
    run_program: ProgramRunner,
) -> None:
    program = PRELUDE + (
        "send({'t': 'done', 'value': [1], 'error': {'kind': 'exception', 'message': 'forged'}})\n"
        "import time\ntime.sleep(5)\nreturn 2"
    )
    result = await run_program(program)
    assert result.error == RunFailure("exception", "forged")


async def test_forged_done_wins_if_first(run_program: ProgramRunner) -> None:
    program = PRELUDE + "send({'t': 'done', 'value': ['forged']})\nreturn 'real'"
    assert (await run_program(program)).value == "forged"


async def test_forged_deep_completion_is_decoded_iteratively(run_program: ProgramRunner) -> None:
    program = PRELUDE + (
        "tokens = [{'kind': 'array', 'length': 1}] * 3000 + [{'kind': 'array', 'length': 0}]\n"
        "send({'t': 'done', 'value': tokens})\nimport time\ntime.sleep(5)"
    )
    result = await run_program(program)
    assert result.error is None
    assert list_depth(result.value) == 3000


async def test_forged_oversized_value_and_error_text_are_recapped(
    run_program: ProgramRunner,
) -> None:
    value = PRELUDE + "send({'t': 'done', 'value': ['v' * 5000]})\nimport time\ntime.sleep(5)"
    result = await run_program(value, max_output_bytes=300)
    assert result.error == RunFailure("output-limit", "outer output exceeded 300 bytes")
    error = PRELUDE + (
        "send({'t': 'done', 'error': {'kind': 'invalid-output', 'message': 'e' * 5000}})\n"
        "import time\ntime.sleep(5)"
    )
    result = await run_program(error, max_output_bytes=300)
    assert result.error == RunFailure("output-limit", "outer output exceeded 300 bytes")


async def test_forged_output_limit_is_honoured(run_program: ProgramRunner) -> None:
    program = PRELUDE + "print('kept')\nsend({'t': 'output-limit'})\nimport time\ntime.sleep(5)"
    result = await run_program(program, max_output_bytes=1000)
    assert result.error == RunFailure("output-limit", "outer output exceeded 1000 bytes")
    assert result.logs == ["kept"]


async def test_forged_invalid_completion_is_invalid_output(run_program: ProgramRunner) -> None:
    for tokens in ("[1, 2]", "[]", "{'kind': 'array', 'length': 1}", "'x'"):
        program = PRELUDE + f"send({{'t': 'done', 'value': {tokens}}})\nimport time\ntime.sleep(5)"
        result = await run_program(program)
        assert result.error == RunFailure(
            "invalid-output", "program completion must be lossless JSON"
        ), tokens


async def test_forged_negative_zero_is_refused_not_read_as_zero(
    run_program: ProgramRunner,
) -> None:
    seen: list[object] = []

    async def handler(call: BindingCall) -> BindingResult:
        seen.append(call.arguments)
        return BindingResult.success(call.arguments)

    # json.dumps never writes "-0": the frames are written by hand.
    program = PRELUDE + (
        "def send_text(text):\n"
        "    send_raw(struct.pack('>I', len(text)) + text.encode())\n"
        'send_text(\'{"t":"call","id":1000,"name":"echo","args":[-0]}\')\n'
        "reply = recv()\n"
        'send_text(\'{"t":"call","id":1001,"name":"echo","args":[{"kind":"array","length":1},-0]}\')\n'
        "replies = [reply, recv()]\n"
        "if replies == [{'t': 'reply', 'id': i, 'ok': False,"
        " 'message': 'tool arguments must be lossless JSON'} for i in (1000, 1001)]:\n"
        '    send_text(\'{"t":"done","value":[-0]}\')\n'
        "import time\ntime.sleep(5)\nreturn replies"
    )
    result = await run_program(program, bindings=("echo",), handler=handler)
    assert result.error == RunFailure("invalid-output", "program completion must be lossless JSON")
    assert seen == []


async def test_forged_frames_mid_stream_cannot_desync_the_channel(
    run_program: ProgramRunner,
) -> None:
    # A frame whose header claims more bytes than ever arrive stalls only that worker's channel:
    # the run still ends (here at the wall ceiling), and the host keeps serving other runs.
    program = PRELUDE + "send_raw(struct.pack('>I', 100))\nsend_raw(b'x' * 10)\nreturn 1"
    result = await run_program(program, wall_ms=500)
    assert result.error is not None and result.error.kind in ("timeout", "worker-exit")
    assert (await run_program("return 2")).value == 2


FAKE_WORKER = """\
import json, os, socket, struct, sys
sock = socket.socket(fileno=int(sys.argv[2]))
def send(obj):
    payload = json.dumps(obj).encode()
    sock.sendall(struct.pack('>I', len(payload)) + payload)
send({'t': 'ready', 'sandbox': {'network': 'fake'}})
sock.recv(1 << 20)
sock.sendall(b'\\x00\\x00\\x00\\x03abc' + os.urandom(64) + b'\\x00\\x00\\x00\\x02[]')
sock.close()
os.write(1, 'tail-after-garbage \\u00e9'.encode())
os._exit(3)
"""


async def test_fake_worker_speaking_garbage_ends_as_worker_exit() -> None:
    runtime = Runtime(RuntimeOptions(pool_size=0, worker=WorkerSpec(loader=FAKE_WORKER)))
    try:
        run = runtime.create_run(program="return 1", bindings=[], handler=echo_handler)
        result = await runtime.execute(run)
    finally:
        await runtime.dispose()
    assert result.error == RunFailure("worker-exit", "worker exited with code 3 before completing")
    assert result.logs == ["tail-after-garbage é"]


async def test_a_completion_sent_just_before_the_exit_still_wins(
    run_program: ProgramRunner,
) -> None:
    # The exit is handled only after everything the worker sent is read (no grace timer).
    # The handler blocks the runtime's loop while the worker sends a completion larger than
    # one read and exits, so both are pending together when the loop wakes up.
    async def handler(call: BindingCall) -> BindingResult:
        time.sleep(0.3)  # noqa: ASYNC251 - blocking the loop is the point
        return BindingResult.success(None)

    program = PRELUDE + (
        "send({'t': 'call', 'id': 1, 'name': 'block', 'args': [1]})\n"
        "import time\ntime.sleep(0.05)\n"
        "send({'t': 'done', 'value': ['x' * 150000]})\nos._exit(3)"
    )
    result = await run_program(program, bindings=("block",), handler=handler)
    assert result.error is None, result.error
    assert result.value == "x" * 150_000


async def test_a_failing_log_listener_ends_the_run_at_once(runtime: Runtime) -> None:
    # A host-side failure while handling worker output is one clear outcome, not a lost
    # completion and a wait for the wall-clock ceiling.
    def on_log(text: str) -> None:
        raise RuntimeError("listener broke")

    run = runtime.create_run(
        program="print('one')\nprint('two')\nreturn 1",
        bindings=[],
        handler=echo_handler,
        budgets={"wall_ms": 30_000},
        on_log=on_log,
    )
    started = time.monotonic()
    result = await runtime.execute(run)
    assert result.error == RunFailure(
        "invalid-output", "the runtime could not handle the worker's output (RuntimeError)"
    )
    assert result.logs == ["one"]
    assert time.monotonic() - started < 10


BURST_WORKER = """\
import json, os, socket, struct, sys
sock = socket.socket(fileno=int(sys.argv[2]))
def frame(obj):
    payload = json.dumps(obj).encode()
    return struct.pack('>I', len(payload)) + payload
sock.sendall(frame({'t': 'ready', 'sandbox': {}}))
sock.recv(1 << 20)
sock.sendall(b''.join(frame({'n': n}) for n in range(3)))
sock.recv(1 << 20)
"""


async def test_a_failing_frame_handler_loses_no_other_frame() -> None:
    worker = await WorkerProcess.spawn(WorkerSpec(loader=BURST_WORKER))
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
    received: list[object] = []
    all_read = loop.create_future()

    def on_frame(payload: object) -> None:  # a frame's bytes (or an oversized verdict)
        assert isinstance(payload, bytes)
        received.append(json.loads(payload)["n"])
        if len(received) == 3:
            all_read.set_result(None)
        if len(received) == 1:
            raise ValueError("first frame")

    try:
        worker.listen(on_frame, lambda: None, lambda fd, data: None)
        worker.send({"t": "go"})
        await asyncio.wait_for(all_read, 10)
    finally:
        loop.set_exception_handler(None)
        await worker.kill()
        await worker.closed
    assert received == [0, 1, 2]
    assert [str(exc) for exc in reported] == ["first frame"]
