"""Frames of one event-loop turn share a write on the worker channel, in both directions.

Counted, never timed: the Python worker's writes are counted by the program itself (it wraps
``socket.socket.send``/``sendall``, which the worker's channel writes with, as model code
could), the
runtime's writes to the worker by a spy on ``WorkerProcess._write`` (the one place it writes
the channel), the TypeScript worker's by ``strace`` on the real ``node`` process.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest

from runtime_service.outcome import BindingCall, BindingResult, PendingCall
from runtime_service.runtime import Runtime
from runtime_service.worker import framing
from runtime_service.worker_process import WorkerProcess
from tests.runtime.ts_worker import TsWorker

CALLS = 8

# Counts the worker's channel writes from inside the program (the worker writes its channel
# with ``socket.socket.send``/``sendall``; model code may wrap them like any library function).
COUNT_WRITES = """\
import json, socket
_writes = []
_sendall, _send = socket.socket.sendall, socket.socket.send
def _counting_all(self, data, *rest):
    _writes.append(bytes(data))
    return _sendall(self, data, *rest)
def _counting(self, data, *rest):
    sent = _send(self, data, *rest)
    _writes.append(bytes(data[:sent]))
    return sent
socket.socket.sendall, socket.socket.send = _counting_all, _counting
def kinds(data):
    found, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], 'big')
        found.append(json.loads(data[at + 4:at + 4 + size])['t'])
        at += 4 + size
    return found
"""


@pytest.fixture
def runtime_writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every write the runtime makes to a worker channel, as it is made."""
    writes: list[bytes] = []
    original = WorkerProcess._write

    def spy(self: WorkerProcess, data: bytes) -> None:
        writes.append(bytes(data))
        original(self, data)

    monkeypatch.setattr(WorkerProcess, "_write", spy)
    return writes


def frames_of(data: bytes) -> list[dict[str, object]]:
    frames = framing.FrameBuffer().feed(data)
    return [json.loads(frame) for frame in frames]


def reply_writes(writes: list[bytes]) -> list[list[dict[str, object]]]:
    """The runtime's writes that carry replies, each as the frames it carried."""
    grouped = [frames_of(data) for data in writes]
    return [group for group in grouped if group and group[0]["t"] == "reply"]


async def test_a_turn_batch_writes_the_first_frame_at_once_and_the_rest_at_the_turns_end() -> None:
    loop = asyncio.get_running_loop()
    writes: list[bytes] = []
    batch = framing.TurnBatch(writes.append)
    batch.add(b"a", loop)
    assert writes == [b"a"]  # a lone frame waits for nothing
    batch.add(b"b", loop)
    batch.add(b"c", loop)
    assert writes == [b"a"]
    await asyncio.sleep(0)  # the turn ends
    assert writes == [b"a", b"bc"]
    batch.add(b"d", loop)  # a new turn: at once again
    batch.add(b"e", loop)
    batch.now(b"log")  # takes the held frame ahead of it
    assert writes == [b"a", b"bc", b"d", b"elog"]
    await asyncio.sleep(0)
    assert writes == [b"a", b"bc", b"d", b"elog"]  # nothing was left to write


class Latch:
    """Holds every call until ``count`` have arrived, then answers them all in one callback
    (so their replies are ready in the same event-loop turn), in reverse order."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.held: list[tuple[BindingCall, PendingCall]] = []

    def __call__(self, call: BindingCall) -> PendingCall:
        pending = PendingCall()
        self.held.append((call, pending))
        if len(self.held) == self.count:
            for held_call, held in reversed(self.held):
                held.resolve(BindingResult.success({"seq": held_call.seq, **held_call.arguments}))  # type: ignore[dict-item]
        return pending


async def test_a_gather_of_calls_leaves_the_worker_in_two_writes_and_returns_in_two(
    runtime: Runtime, runtime_writes: list[bytes]
) -> None:
    program = COUNT_WRITES + (
        "import asyncio\n"
        f"results = await asyncio.gather(*(tools.echo({{'n': n}}) for n in range({CALLS})))\n"
        "return {'results': results, 'writes': [kinds(w) for w in _writes]}"
    )
    latch = Latch(CALLS)
    run = runtime.create_run(program=program, bindings=["echo"], handler=latch)
    result = await runtime.execute(run)
    assert result.error is None, result.error
    assert isinstance(result.value, dict)
    # Each call got its own result, in the program's order, though answered in reverse.
    assert [item["n"] for item in result.value["results"]] == list(range(CALLS))
    assert [item["seq"] for item in result.value["results"]] == list(range(1, CALLS + 1))
    # The worker: the turn's first call at once, the other seven together at the turn's end.
    assert result.value["writes"] == [["call"], ["call"] * (CALLS - 1)]
    # The runtime: the first reply of the turn at once, the rest in one write, in the order
    # they were resolved (7, 6, ..., 1, then 8, whose answer was ready before the run asked
    # for it): every id once.
    replies = reply_writes(runtime_writes)
    assert [len(group) for group in replies] == [1, CALLS - 1]
    ids = [frame["id"] for group in replies for frame in group]
    assert ids == [*range(CALLS - 1, 0, -1), CALLS]


async def test_sequential_calls_each_leave_at_once(
    runtime: Runtime, runtime_writes: list[bytes]
) -> None:
    # A lone call is written by the ``tools`` call itself, before the program awaits it: the
    # count has moved when the binding returns. Then each reply comes back on its own.
    program = COUNT_WRITES + (
        "seen = []\n"
        "for n in range(20):\n"
        "    before = len(_writes)\n"
        "    pending = tools.echo({'n': n})\n"
        "    seen.append(len(_writes) - before)\n"
        "    assert (await pending)['n'] == n\n"
        "return seen"
    )
    run = runtime.create_run(program=program, bindings=["echo"], handler=_answered)
    result = await runtime.execute(run)
    assert result.error is None, result.error
    assert result.value == [1] * 20
    assert [len(group) for group in reply_writes(runtime_writes)] == [1] * 20


def _answered(call: BindingCall) -> PendingCall:
    pending = PendingCall()
    pending.resolve(BindingResult.success(call.arguments))
    return pending


async def test_a_log_carries_the_held_calls_ahead_of_it(runtime: Runtime) -> None:
    # Frames keep the order they were made in: the calls held in a turn go out ahead of a
    # log printed after them, in the log's write.
    program = COUNT_WRITES + (
        "first = tools.echo({'n': 1})\n"
        "second = tools.echo({'n': 2})\n"
        "third = tools.echo({'n': 3})\n"
        "print('after the calls')\n"
        "writes = [kinds(w) for w in _writes]\n"
        "return [writes, await first, await second, await third]\n"
    )
    logs: list[str] = []
    run = runtime.create_run(
        program=program, bindings=["echo"], handler=_answered, on_log=logs.append
    )
    result = await runtime.execute(run)
    assert result.error is None, result.error
    assert result.value == [[["call"], ["call", "call", "log"]], {"n": 1}, {"n": 2}, {"n": 3}]
    assert logs == ["after the calls"]


async def test_refusals_of_a_call_flood_share_writes(
    runtime: Runtime, runtime_writes: list[bytes]
) -> None:
    # 1,000 forged calls in one write (unknown binding: each refused at once): the refusals
    # of one read leave in two writes, not a thousand, and every id is answered once.
    program = (
        "import os, struct, sys\n"
        "fd = int(sys.argv[2])\n"
        "frames = b''.join(\n"
        "    (lambda p: struct.pack('>I', len(p)) + p)(\n"
        '        b\'{"t":"call","id":%d,"name":"nope","args":[1]}\' % n)\n'
        "    for n in range(1, 1001))\n"
        "os.write(fd, frames)\n"
        "got = 0\n"
        "buffer = b''\n"
        "while got < 1000:\n"
        "    buffer += os.read(fd, 1 << 16)\n"
        "    while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:4], 'big'):\n"
        "        buffer = buffer[4 + int.from_bytes(buffer[:4], 'big'):]\n"
        "        got += 1\n"
        "return got"
    )
    result = await runtime.execute(
        runtime.create_run(program=program, bindings=["echo"], handler=_answered)
    )
    assert result.error is None, result.error
    assert result.value == 1000
    replies = reply_writes(runtime_writes)
    ids = [frame["id"] for group in replies for frame in group]
    assert ids == list(range(1, 1001))
    assert len(replies) < 100, [len(group) for group in replies]


# -- the TypeScript worker ---------------------------------------------------------------------

STRACE = shutil.which("strace")


def channel_writes(trace: Path) -> list[bytes]:
    """The ``write(3, ...)`` calls that wrote something, in an strace log (``-xx -s``: every
    byte in hex, in full)."""
    writes = []
    for line in trace.read_text().splitlines():
        start = line.find('write(3, "')
        if start < 0 or re.search(r"\) += [1-9][0-9]*$", line) is None:
            continue
        text = line[start + len('write(3, "') : line.rfind('", ')]
        writes.append(bytes.fromhex(text.replace("\\x", "")))
    return writes


def test_a_promise_all_leaves_the_typescript_worker_in_two_writes(tmp_path: Path) -> None:
    assert STRACE is not None, "strace counts the TypeScript worker's writes"
    trace = tmp_path / "trace.txt"
    wrapper = [STRACE, "-f", "-qq", "-xx", "-s", "65536", "-e", "trace=write", "-o", str(trace)]
    worker = TsWorker(wrapper=wrapper)
    try:
        worker.ready()
        worker.start(
            f"const all = await Promise.all(Array.from({{ length: {CALLS} }}, (_, n) => "
            "tools.echo({ n })));\n"
            "const one = await tools.echo({ n: 'lone' });\n"
            "return [all.map((v) => v.n), one.n];"
        )
        outcome = worker.drive()
    finally:
        worker.close()
    assert outcome.value == [list(range(CALLS)), "lone"], outcome.frames
    calls = [
        sum(frame["t"] == "call" for frame in frames_of(data))
        for data in channel_writes(trace)
        if b'"t":"call"' in data
    ]
    # Promise.all's eight: the first at once, seven together; the lone call by itself.
    assert calls == [1, CALLS - 1, 1]
