"""Replies a worker leaves unread are bounded: the runtime stops reading a worker that holds
it to more than ``_BACKLOG_PAUSE_BYTES`` of them, and a genuine worker, which takes in what
the runtime sends while a write of its own waits, never deadlocks on that.

Counted and by outcome, never timed: the runtime's backlog is read by a spy on
``WorkerProcess._write`` (the one place it writes the channel) after every write.
"""

from __future__ import annotations

import pytest

from runtime_service import worker_process
from runtime_service.outcome import BindingCall, BindingResult, PendingCall
from runtime_service.runtime import Runtime
from runtime_service.worker_process import WorkerProcess

PAUSE = 1 << 20  # the threshold for these tests (16 MiB in service): reached sooner
BIG = 4 * PAUSE  # one reply larger than the threshold
LINES = 5_000


@pytest.fixture
def peak_backlog(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The largest backlog of unsent bytes to any worker, after each write (at ``PAUSE``)."""
    monkeypatch.setattr(worker_process, "_BACKLOG_PAUSE_BYTES", PAUSE)
    peak = [0]
    original = WorkerProcess._write

    def spy(self: WorkerProcess, data: bytes) -> None:
        original(self, data)
        peak[0] = max(peak[0], len(self._out))

    monkeypatch.setattr(WorkerProcess, "_write", spy)
    return peak


def _answered(call: BindingCall) -> PendingCall:
    pending = PendingCall()
    if call.name == "big":
        pending.resolve(BindingResult.success("x" * BIG))
    else:
        pending.resolve(BindingResult.success(call.arguments))
    return pending


async def test_a_flood_of_calls_that_never_reads_holds_the_runtime_to_the_bound(
    runtime: Runtime, peak_backlog: list[int]
) -> None:
    # Two million forged calls (unknown binding: each refused at once) written without ever
    # reading a reply: without the bound the runtime held ~160 MiB of refusals. Now it stops
    # reading at the bound, the worker's write waits, and the run ends at its wall-clock
    # budget.
    program = (
        "import os, struct, sys\n"
        "fd = int(sys.argv[2])\n"
        "frame = lambda n: (lambda p: struct.pack('>I', len(p)) + p)(\n"
        '    b\'{"t":"call","id":%d,"name":"nope","args":[1]}\' % n)\n'
        "for chunk in range(20):\n"
        "    os.write(fd, b''.join(frame(chunk * 100_000 + n) for n in range(1, 100_001)))\n"
    )
    run = runtime.create_run(
        program=program, bindings=["echo"], handler=_answered, budgets={"wall_ms": 5_000}
    )
    result = await runtime.execute(run)
    assert result.error is not None and result.error.kind == "timeout", result.error
    # It reached the bound (the pause was needed) and stayed within one read's refusals of it
    # (64 KiB of calls: ~120 KiB of refusals).
    assert PAUSE < peak_backlog[0] <= PAUSE + (256 << 10), peak_backlog[0]


@pytest.mark.parametrize(
    ("language", "program"),
    [
        (
            "python",
            "pending = tools.big({})\n"
            f"for n in range({LINES}):\n"
            "    print('y' * 1000)\n"
            "return len(await pending)",
        ),
        (
            "typescript",
            "const pending = tools.big({});\n"
            f"for (let n = 0; n < {LINES}; n++) console.log('y'.repeat(1000));\n"
            "return (await pending).length;",
        ),
    ],
)
async def test_a_worker_that_writes_while_a_large_reply_waits_completes(
    runtime: Runtime, peak_backlog: list[int], language: str, program: str
) -> None:
    # The program asks for a 4 MiB value and, before it reads anything, writes 5 MB of logs:
    # the runtime stops reading it while the value waits, the worker's log writes cannot go
    # on -- and the worker takes the value in meanwhile, so both sides go on.
    logs: list[str] = []
    run = runtime.create_run(
        program=program,
        bindings=["big"],
        handler=_answered,
        language=language,
        on_log=logs.append,
        budgets={"max_output_bytes": 16 << 20},
    )
    result = await runtime.execute(run)
    assert result.error is None, result.error
    assert result.value == BIG
    assert len(logs) == LINES
    assert peak_backlog[0] > PAUSE  # the runtime did pause
