"""Fake workers against the real RuntimeService, over gRPC on loopback.

``test_hostile.py`` sends hostile traffic from programs inside real workers, which can only act
after a real boot. Here the worker process itself is a fake speaking raw protocol: it can
misbehave before its ready message, flood the channel, or close it. The server is the real one
(``start``), with a settings subclass that swaps only the worker loader (each spawn runs the
script file the test last wrote) and shortens the boot timeout; nothing else is stubbed. The
tests assert exactly one terminal message (``drive``), its outcome and text, that no worker
process is left, and, for boot failures, that the next run gets a working worker.

Every test runs for both languages (``host`` is parametrized): the run asks for its language
and gets its worker from that language's pool. A fake worker stands in for either (a
TypeScript worker also starts as Python, ``worker/exec_launch.py``, and only then execs Node);
the real one it hands back to is the language's own (``REAL_WORKERS``), and the programs of
the real-worker tests are written per language.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.config import RuntimeSettings
from runtime_service.languages.typescript import TypeScriptBackend
from runtime_service.pool import WorkerPool
from runtime_service.runtime import RuntimeOptions
from runtime_service.server import RunningRuntime
from tests.runtime.conftest import (
    Answer,
    child_pids,
    connected,
    drive,
    echo_answer,
    grpc_settings,
    never_answer,
    serving,
    start_message_in,
    streamed_logs,
)

pb = runtime_pb2
Stub = runtime_pb2_grpc.RuntimeServiceStub
ABORT = pb.FAILURE_KIND_ABORT
TIMEOUT = pb.FAILURE_KIND_TIMEOUT
WORKER_EXIT = pb.FAILURE_KIND_WORKER_EXIT

# Boot timeout of the fake-worker server. A real worker boots in ~40 ms here, so this leaves a
# wide margin for the real workers these tests also start, and keeps a hung boot short.
BOOT_TIMEOUT_S = 1.0
# The service's own boot timeout: WorkerSpec.ready_timeout_s, not exposed as a setting.
SERVICE_BOOT_TIMEOUT_S = 10.0
SLACK_S = 10.0  # how long a latch may wait on a shared, loaded 2-CPU host (never asserted)

REAL_WORKERS = {
    "python": """\
import sys
sys.path.insert(0, sys.argv[1])
from runtime_service.worker.bootstrap import main
main()
""",
    # Isolates like the Python worker, then execs ``node worker.js`` (the spawn launch).
    "typescript": """\
import sys
sys.path.insert(0, sys.argv[1])
from runtime_service.worker.exec_launch import main
main()
""",
}
LANGUAGES = tuple(REAL_WORKERS)
REAL_WORKER = REAL_WORKERS["python"]  # of the other fake-worker modules (Python only)

# Fake worker helpers. The script runs as the worker's ``-c`` code: sys.argv is
# ["-c", <package root>, <channel fd>, <sandbox config>], exactly as for the real bootstrap.
PRELUDE = """\
import json, os, socket, struct, sys, time
sock = socket.socket(fileno=int(sys.argv[2]))
def raw_frame(payload):
    return struct.pack('>I', len(payload)) + payload
def frame(obj):
    return raw_frame(json.dumps(obj).encode())
def send(obj):
    sock.sendall(frame(obj))
def recv_exact(size):
    data = b''
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError('channel closed')
        data += chunk
    return data
def message_of(payload):
    # A raw frame (runtime_service/worker/framing.py) as the plain frame it stands for.
    if payload[:1] != b'\\0':
        return json.loads(payload)
    (size,) = struct.unpack_from('>I', payload, 1)
    message = json.loads(payload[5:5 + size])
    message['args' if message['t'] == 'call' else 'value'] = [
        {'kind': 'json', 'text': payload[5 + size:].decode()}
    ]
    return message
def recv():
    (size,) = struct.unpack('>I', recv_exact(4))
    return message_of(recv_exact(size))
def recv_within(seconds):
    # The next frame, or None when none arrives in time.
    sock.settimeout(seconds)
    try:
        return recv()
    except TimeoutError:
        return None
    finally:
        sock.settimeout(None)
def ready():
    send({'t': 'ready', 'sandbox': {'network': 'fake'}})
    start = recv()
    assert start['t'] == 'start', start
    return start
def finish(seen):
    # Complete with the JSON text of what the worker saw, then wait to be killed.
    send({'t': 'done', 'value': [json.dumps(seen)]})
    time.sleep(60)
"""


class FakeWorkerSettings(RuntimeSettings):
    """Runtime settings whose workers run the script at ``worker_script`` (read at each spawn)
    and must report ready within ``boot_timeout_s``."""

    worker_script: str
    boot_timeout_s: float = BOOT_TIMEOUT_S

    def runtime_options(self) -> RuntimeOptions:
        options = super().runtime_options()
        loader = f"exec(compile(open({self.worker_script!r}).read(), 'fake-worker', 'exec'))"
        worker = dataclasses.replace(
            options.worker, loader=loader, ready_timeout_s=self.boot_timeout_s
        )
        return dataclasses.replace(options, worker=worker)


@dataclasses.dataclass
class Host:
    running: RunningRuntime
    stub: Stub
    script: Path
    language: str = "python"

    def start(self, program: str, *names: str, **fields: Any) -> runtime_pb2.RunRequest:
        """A start message of ``program`` in this host's language."""
        return start_message_in(self.language, program, *names, **fields)

    @property
    def pool(self) -> WorkerPool:
        """The pool this host's runs take their workers from."""
        return self.running.runtime.pools[self.language]

    @property
    def live_workers(self) -> int:
        return sum(pool.live_workers for pool in self.running.runtime.pools.values())

    def workers_run(self, script: str) -> None:
        """Workers spawned from now on run ``script`` (written atomically: a pool refill may be
        reading it)."""
        staged = self.script.with_suffix(".staged")
        staged.write_text(script)
        os.replace(staged, self.script)

    def fake_workers(self, body: str) -> None:
        self.workers_run(PRELUDE + body)


@contextlib.asynccontextmanager
async def hosting(
    tmp_path: Path, language: str = "python", script: str | None = None, pool_size: int = 0
) -> AsyncIterator[Host]:
    """A real RuntimeService whose workers (of both languages) run ``script`` (the real
    worker of ``language`` by default); pool size 0 unless overridden, so each run spawns its
    worker from the script current at that moment. The start-up probe boots one worker from
    ``script`` too."""
    path = tmp_path / "worker.py"
    path.write_text(REAL_WORKERS[language] if script is None else script)
    values: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "pool_size": pool_size,
        "typescript_pool_size": pool_size,
        "shutdown_grace_s": 0.2,
        "worker_script": str(path),
    }
    settings = FakeWorkerSettings(**values)
    with pytest.MonkeyPatch.context() as patch:
        # A runtime serves TypeScript only with the real loader; this one's loader runs the
        # script for both languages (each spawn names its language in the config it passes).
        patch.setattr(
            TypeScriptBackend,
            "unavailable",
            lambda self, spec: None if self.node(spec) is not None else "no Node",
        )
        async with serving(settings) as running, connected(running) as stub:
            yield Host(running, stub, path, language)


@pytest.fixture(params=LANGUAGES)
async def host(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Host]:
    async with hosting(tmp_path, request.param) as running:
        yield running


def failure(terminal: runtime_pb2.RunTerminal) -> tuple[int, str]:
    assert terminal.WhichOneof("outcome") == "failure", terminal
    return terminal.failure.kind, terminal.failure.message


def success(terminal: runtime_pb2.RunTerminal) -> Any:
    assert terminal.WhichOneof("outcome") == "success", terminal
    return json.loads(terminal.success.value_json)


def seen_by_worker(terminal: runtime_pb2.RunTerminal) -> Any:
    """What a fake worker reported through ``finish``."""
    text = success(terminal)
    assert isinstance(text, str), text
    return json.loads(text)


def binding_calls(seen: list[runtime_pb2.RunResponse]) -> list[tuple[int, str, str]]:
    return [
        (m.binding_call.call_id, m.binding_call.binding_name, m.binding_call.arguments_json)
        for m in seen
        if m.WhichOneof("kind") == "binding_call"
    ]


async def timed_drive(
    stub: Stub, first: runtime_pb2.RunRequest, answer: Answer = echo_answer
) -> tuple[list[runtime_pb2.RunResponse], runtime_pb2.RunTerminal, float]:
    started = time.monotonic()
    seen, terminal = await drive(stub, first, answer)
    return seen, terminal, time.monotonic() - started


async def assert_no_worker_left(host: Host) -> None:
    """Every worker process (and anything it started) is gone shortly after the terminal."""
    deadline = time.monotonic() + SLACK_S
    while child_pids() or host.live_workers:
        assert time.monotonic() < deadline, f"worker processes left behind: {child_pids()}"
        await asyncio.sleep(0.01)


async def assert_next_run_works(host: Host) -> None:
    host.workers_run(REAL_WORKERS[host.language])
    for _attempt in range(3):
        _, terminal = await drive(host.stub, host.start("return 6 * 7"))
        # A real Node worker boots in a few hundred ms of CPU: on a loaded host that can pass
        # the fake workers' 1 s boot timeout, which says nothing of what this checks.
        booted = f"no ready report within {BOOT_TIMEOUT_S:g} s" not in terminal.failure.message
        if booted:
            break
    assert success(terminal) == 42
    await assert_no_worker_left(host)


# -- boot phase: before the worker reports ready -----------------------------------------------

HUNG_BOOT = """\
# Never reports ready; a descendant in the worker's process group must die with it.
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


async def test_junk_before_ready_fails_the_boot_at_once(host: Host) -> None:
    # A worker speaking unparseable bytes before any program ran is broken, not merely hostile:
    # its boot fails on the spot (no waiting for the boot timeout) and the run gets worker-exit.
    host.fake_workers("sock.sendall(raw_frame(b'{{{{{'))\nready()\nfinish('booted anyway')\n")
    seen, terminal = await drive(host.stub, host.start("return 1"))
    kind, message = failure(terminal)
    assert kind == WORKER_EXIT
    # The parse error, not the boot timeout's message: the boot failed on the spot.
    assert message.startswith("worker did not become ready: invalid JSON text: "), message
    assert [m.WhichOneof("kind") for m in seen] == ["terminal"]
    assert list(terminal.logs) == []
    await assert_no_worker_left(host)
    await assert_next_run_works(host)


async def test_messages_before_ready_are_not_replayed_into_the_run(host: Host) -> None:
    # Well-formed frames other than ready are skipped during boot: a log, a call or a done sent
    # before the program was even handed over never reach the run.
    host.fake_workers(
        "send({'t': 'log', 'text': 'before ready'})\n"
        "send({'t': 'call', 'id': 1, 'name': 'echo', 'args': ['before ready']})\n"
        "send({'t': 'done', 'value': ['forged before ready']})\n"
        "send([1, 2])\n"
        "start = ready()\n"
        "finish({'program': start['program'], 'extra': recv_within(0.2)})\n"
    )
    seen, terminal = await drive(host.stub, host.start("return 1", "echo"))
    assert seen_by_worker(terminal) == {"program": "return 1", "extra": None}
    assert [m.WhichOneof("kind") for m in seen] == ["terminal"]
    assert list(terminal.logs) == []
    await assert_no_worker_left(host)


async def test_worker_that_never_reports_ready_ends_at_the_boot_timeout(host: Host) -> None:
    assert grpc_settings().runtime_options().worker.ready_timeout_s == SERVICE_BOOT_TIMEOUT_S
    host.fake_workers(HUNG_BOOT)
    seen, terminal, elapsed = await timed_drive(host.stub, host.start("return 1"))
    kind, message = failure(terminal)
    assert kind == WORKER_EXIT
    assert message.startswith("worker did not become ready"), message
    # The wall-clock budget starts only at the hand-off: the boot timeout alone ends this run
    # (a worker-exit, not a timeout), never before it.
    assert elapsed >= BOOT_TIMEOUT_S
    assert [m.WhichOneof("kind") for m in seen] == ["terminal"]
    await assert_no_worker_left(host)  # the forked descendant included
    await assert_next_run_works(host)


async def test_boot_timeout_message_names_the_timeout(host: Host) -> None:
    host.fake_workers(HUNG_BOOT)
    _, terminal = await drive(host.stub, host.start("return 1"))
    kind, message = failure(terminal)
    assert kind == WORKER_EXIT
    assert re.search(r"\b1(\.0+)? ?s\b|\b1000 ?ms\b", message), message


async def test_cancel_during_a_hung_boot_is_prompt(host: Host) -> None:
    host.fake_workers(HUNG_BOOT)
    call = host.stub.Run()
    await call.write(host.start("return 1"))
    await asyncio.sleep(0.1)
    await call.write(pb.RunRequest(cancel=pb.RunCancel(reason="stop")))
    response = await call.read()
    await call.done_writing()
    assert failure(response.terminal) == (ABORT, "stop")  # not the boot timeout's worker-exit


async def test_caller_deadline_bounds_a_hung_boot(host: Host) -> None:
    host.fake_workers(HUNG_BOOT)
    _, terminal = await drive(host.stub, host.start("return 1", timeout_ms=200))
    assert failure(terminal)[0] == TIMEOUT  # the caller's deadline, not the boot timeout


EXITS_BEFORE_READY = """\
os.write(2, b'fake worker: cannot boot')
os._exit(5)
"""


@pytest.mark.exclusive  # a boot timeout or wall budget over CPU-heavy work
async def test_worker_that_exits_before_ready_is_a_worker_exit(host: Host) -> None:
    host.fake_workers(EXITS_BEFORE_READY)
    seen, terminal = await drive(host.stub, host.start("return 1"))
    kind, message = failure(terminal)
    assert kind == WORKER_EXIT
    # The exit status only if the loop reaped it before it saw the channel end; stderr always.
    assert re.fullmatch(
        r"worker did not become ready: worker exited during boot( \(exit status 5\))?"
        r"; its stderr: fake worker: cannot boot",
        message,
    ), message  # the exit, not the boot timeout, ended the boot
    assert [m.WhichOneof("kind") for m in seen] == ["terminal"]
    await assert_no_worker_left(host)
    await assert_next_run_works(host)


async def test_boot_failure_message_carries_the_workers_stderr(host: Host) -> None:
    host.fake_workers(EXITS_BEFORE_READY)
    _, terminal = await drive(host.stub, host.start("return 1"))
    assert "fake worker: cannot boot" in failure(terminal)[1]


@pytest.mark.parametrize("language", LANGUAGES)
async def test_pool_refill_recovers_from_workers_that_fail_to_boot(
    tmp_path: Path, language: str
) -> None:
    async with hosting(tmp_path, language, PRELUDE + EXITS_BEFORE_READY, pool_size=1) as host:
        pool = host.pool
        _, terminal = await drive(host.stub, host.start("return 1"))
        kind, message = failure(terminal)
        assert kind == WORKER_EXIT
        assert message.startswith("worker did not become ready: worker exited during boot")
        deadline = time.monotonic() + SLACK_S
        while pool.spawn_failures == 0:  # the background refill fails too, and retries
            assert time.monotonic() < deadline, "the pool never tried to refill"
            await asyncio.sleep(0.01)
        assert pool.idle_count == 0
        host.workers_run(REAL_WORKERS[language])
        await asyncio.wait_for(pool.wait_filled(), 1.0 + SLACK_S)  # retries every second
        assert pool.idle_count == 1
        _, terminal = await drive(host.stub, host.start("return 6 * 7"))
        assert success(terminal) == 42


# -- after ready ------------------------------------------------------------------------------


async def test_duplicate_call_id_is_answered_once(host: Host) -> None:
    host.fake_workers(
        "ready()\n"
        "send({'t': 'call', 'id': 7, 'name': 'echo', 'args': ['first']})\n"
        "send({'t': 'call', 'id': 7, 'name': 'echo', 'args': ['second']})\n"
        "reply = recv()\n"
        "send({'t': 'call', 'id': 7, 'name': 'echo', 'args': ['after the reply']})\n"
        "finish({'reply': reply, 'extra': recv_within(0.3)})\n"
    )
    seen, terminal = await drive(host.stub, host.start("return 1", "echo"))
    assert binding_calls(seen) == [(1, "echo", '"first"')]
    assert seen_by_worker(terminal) == {
        "reply": {
            "t": "reply",
            "id": 7,
            "ok": True,
            "value": [{"kind": "object", "keys": ["echo"]}, "first"],
        },
        "extra": None,
    }
    await assert_no_worker_left(host)


async def test_done_before_any_call_is_answered_wins(host: Host) -> None:
    host.fake_workers(
        "ready()\n"
        "for i in (1, 2, 3):\n"
        "    send({'t': 'call', 'id': i, 'name': 'echo', 'args': [i]})\n"
        "send({'t': 'done', 'value': ['early']})\n"
        "send({'t': 'done', 'error': {'kind': 'exception', 'message': 'second'}})\n"
        "send({'t': 'log', 'text': 'after done'})\n"
        "time.sleep(60)\n"
    )
    seen, terminal = await drive(host.stub, host.start("return 1", "echo"), never_answer)
    assert success(terminal) == "early"
    # The calls were relayed before the done arrived; nothing after it was.
    assert binding_calls(seen) == [(1, "echo", "1"), (2, "echo", "2"), (3, "echo", "3")]
    assert streamed_logs(seen) == list(terminal.logs) == []
    await assert_no_worker_left(host)


async def test_call_flood_beyond_the_outstanding_cap_fails_the_excess(host: Host) -> None:
    host.fake_workers(
        "ready()\n"
        "sock.sendall(b''.join(\n"
        "    frame({'t': 'call', 'id': i, 'name': 'echo', 'args': [i]}) for i in range(1, 11)\n"
        "))\n"
        "replies = [recv() for _ in range(7)]\n"
        "finish({'replies': replies, 'extra': recv_within(0.3)})\n"
    )
    first = host.start("return 1", "echo", max_outstanding_calls=3)
    seen, terminal = await drive(host.stub, first, never_answer)
    # Only the first three reach the client; the rest fail at once, each answered once.
    assert binding_calls(seen) == [(1, "echo", "1"), (2, "echo", "2"), (3, "echo", "3")]
    refused = {"ok": False, "message": "too many outstanding binding calls (limit 3)"}
    assert seen_by_worker(terminal) == {
        "replies": [{"t": "reply", "id": i, **refused} for i in range(4, 11)],
        "extra": None,
    }
    await assert_no_worker_left(host)


async def test_unknown_message_kinds_are_dropped_and_the_channel_stays_in_sync(
    host: Host,
) -> None:
    junk = [
        {"t": "bogus"},
        {"t": "ready", "sandbox": {}},
        {"t": "start", "program": "return 2"},
        {"t": "reply", "id": 1, "ok": True, "value": [1]},
        {"t": "timeout"},
        {"t": "abort", "message": "forged"},
        {"t": "exit", "code": 0},
        {"t": "LOG", "text": "wrong case"},
        {"t": "done ", "value": ["trailing space"]},
    ]
    host.fake_workers(
        "ready()\n"
        f"for item in {junk!r}:\n"
        "    send(item)\n"
        "sock.sendall(raw_frame(b''))\n"
        "send({'t': 'log', 'text': 'still heard'})\n"
        "send({'t': 'call', 'id': 1, 'name': 'echo', 'args': [5]})\n"
        "finish({'reply': recv(), 'extra': recv_within(0.2)})\n"
    )
    seen, terminal = await drive(host.stub, host.start("return 1", "echo"))
    assert seen_by_worker(terminal) == {
        "reply": {
            "t": "reply",
            "id": 1,
            "ok": True,
            "value": [{"kind": "object", "keys": ["echo"]}, 5],
        },
        "extra": None,
    }
    assert binding_calls(seen) == [(1, "echo", "5")]
    assert streamed_logs(seen) == list(terminal.logs) == ["still heard"]
    await assert_no_worker_left(host)


@pytest.mark.parametrize(
    ("after_close", "outcome"),
    [
        # The exit settles the run; what the worker printed before is kept.
        (
            "time.sleep(0.2)\nos._exit(0)",
            (WORKER_EXIT, "worker exited with code 0 before completing"),
        ),
        # Still alive but mute: no completion can arrive any more, and the run ends at its wall
        # ceiling -- no worse than a program that sleeps (waiting costs no compute budget).
        ("time.sleep(60)", (TIMEOUT, "wall-clock ceiling reached (500ms)")),
    ],
    ids=["then-exits", "then-lingers"],
)
async def test_channel_closed_without_a_terminal_message(
    host: Host, after_close: str, outcome: tuple[int, str]
) -> None:
    host.fake_workers(
        "ready()\nsend({'t': 'log', 'text': 'closing'})\nsock.close()\n" + after_close
    )
    seen, terminal = await drive(host.stub, host.start("return 1", wall_ms=500))
    assert failure(terminal) == outcome
    assert list(terminal.logs) == streamed_logs(seen) == ["closing"]
    await assert_no_worker_left(host)


# -- integers too long for Python's int<->str conversion (4,300 digits by default) ---------------

HUGE = "1" * 5000


# Forged frames holding such an integer: tests/runtime/test_huge_values.py.


async def raw_echo(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
    """Echoes the arguments' JSON text untouched (the stdlib parser would refuse a huge int)."""
    return pb.CallResult(call_id=call.call_id, value_json=f'{{"echo":{call.arguments_json}}}')


async def huge_answer(call: runtime_pb2.BindingCall) -> runtime_pb2.CallResult:
    return pb.CallResult(call_id=call.call_id, value_json=HUGE)


# What the program makes of a binding call: its (typed) failure, or whether the value came back.
OUTCOME_OF_CALL = {
    "python": """\
try:
    value = await tools.echo({argument})
except ToolCallError as exc:
    return 'ToolCallError: ' + exc.message
except Exception as exc:
    return 'untyped ' + type(exc).__name__
return 'exact' if {same} else 'changed'
""",
    "typescript": """\
let value;
try {{
  value = await tools.echo({argument});
}} catch (exc) {{
  if (exc instanceof ToolCallError) return 'ToolCallError: ' + exc.message;
  return 'untyped ' + (exc as Error).name;
}}
return {same} ? 'exact' : 'changed';
""",
}
# 10 ** 5000 sent, and whether the echo brought it back.
HUGE_ARGUMENT = {
    "python": {"argument": "10 ** 5000", "same": "value == {'echo': 10 ** 5000}"},
    "typescript": {"argument": "10n ** 5000n", "same": "value.echo === 10n ** 5000n"},
}
# 1 sent, and whether the reply was the 5000-digit integer.
HUGE_REPLY = {
    "python": {"argument": "1", "same": f"value == int('1' * {len(HUGE)})"},
    "typescript": {"argument": "1", "same": f"value === BigInt('1'.repeat({len(HUGE)}))"},
}


@pytest.mark.exclusive  # a boot timeout or wall budget over CPU-heavy work
async def test_program_passing_a_huge_integer_gets_a_typed_failure_or_the_value(
    host: Host,
) -> None:
    program = OUTCOME_OF_CALL[host.language].format(**HUGE_ARGUMENT[host.language])
    _, terminal = await drive(host.stub, host.start(program, "echo"), raw_echo)
    outcome = success(terminal)
    assert outcome == "exact" or outcome.startswith("ToolCallError: "), outcome


@pytest.mark.exclusive  # a boot timeout or wall budget over CPU-heavy work
async def test_client_result_with_a_huge_integer_reaches_the_program(host: Host) -> None:
    program = OUTCOME_OF_CALL[host.language].format(**HUGE_REPLY[host.language])
    if host.language == "python":
        # The program compares against an int it cannot build from text either: lift the limit.
        program = "import sys\nsys.set_int_max_str_digits(0)\n" + program
    first = host.start(program, "echo", wall_ms=10_000)
    _, terminal = await drive(host.stub, first, huge_answer)
    assert terminal.WhichOneof("outcome") == "success", terminal
    outcome = success(terminal)
    assert outcome == "exact" or outcome.startswith("ToolCallError: "), outcome
