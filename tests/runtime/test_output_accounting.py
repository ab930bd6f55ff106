"""What a run's output costs the runtime is bounded by its output budget, in both languages.

The runtime runs as its own process (``python -m runtime_service``) so that its peak RSS
(``VmHWM``) is its own, not this test client's. A program floods its budget with one-byte log
lines: each line costs the ledger a fixed overhead besides its JSON text
(``ledger.LOG_LINE_OVERHEAD``), so the number of lines a run can hold -- and what the runtime
holds per line (a string, a queued stream message, a terminal entry) -- is O(its budget).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from codemode_cli.processes import running
from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.worker.ledger import LOG_LINE_OVERHEAD
from tests.runtime.conftest import start_message_in

pb = runtime_pb2
BUDGET = 1 << 20
FLOODS = {
    "python": "while True:\n    print('x', end='')",
    "typescript": "while (true) process.stdout.write('x');",
}


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def reset_peak_rss(pid: int) -> int:
    """Restart ``pid``'s peak-RSS count from its current RSS; return that."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")
    return peak_rss(pid)


@pytest.fixture
async def runtime_process() -> AsyncIterator[tuple[int, runtime_pb2_grpc.RuntimeServiceStub]]:
    env = {
        **os.environ,
        "CODEMODE_RUNTIME_POOL_SIZE": "1",
        "CODEMODE_RUNTIME_TYPESCRIPT_POOL_SIZE": "1",
        "CODEMODE_RUNTIME_TRACE_FILE": "off",
        "CODEMODE_RUNTIME_MAX_OUTPUT_BYTES": str(BUDGET),
        "CODEMODE_RUNTIME_DEFAULT_MAX_OUTPUT_BYTES": str(BUDGET),
    }
    async with (
        running(
            "-m", "runtime_service", "--listen", "127.0.0.1:0",
            ready="runtime listening on port", env=env,
        ) as started,
        grpc.aio.insecure_channel(f"127.0.0.1:{started.rest}") as channel,
    ):  # fmt: skip
        yield started.proc.pid, runtime_pb2_grpc.RuntimeServiceStub(channel)


async def flood(stub: runtime_pb2_grpc.RuntimeServiceStub, language: str) -> tuple[int, Any]:
    """One flood run; the number of streamed log lines and the terminal (nothing else held)."""
    call = stub.Run()
    await call.write(start_message_in(language, FLOODS[language], wall_ms=120_000))
    streamed = 0
    terminal = None
    async for message in call:
        kind = message.WhichOneof("kind")
        if kind == "log":
            streamed += 1
        elif kind == "terminal":
            terminal = message.terminal
            await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK
    assert terminal is not None
    return streamed, terminal


@pytest.mark.parametrize("language", ["python", "typescript"])
async def test_a_flood_of_tiny_log_lines_costs_the_runtime_o_of_its_budget(
    runtime_process: tuple[int, runtime_pb2_grpc.RuntimeServiceStub], language: str
) -> None:
    pid, stub = runtime_process
    await flood(stub, language)  # warm-up: the runtime's first run of a language allocates
    growth = []
    for _ in range(2):
        before = reset_peak_rss(pid)
        streamed, terminal = await flood(stub, language)
        growth.append(peak_rss(pid) - before)
        assert terminal.failure.kind == pb.FAILURE_KIND_OUTPUT_LIMIT, terminal.failure
        assert terminal.failure.message == f"outer output exceeded {BUDGET} bytes"
        # The logs kept fill the budget, each line charged its overhead besides its text.
        lines = len(terminal.logs)
        assert set(terminal.logs) == {"x"}
        assert streamed >= lines
        per_line = 4 + LOG_LINE_OVERHEAD  # '"x"' and its comma
        assert 2 + lines * per_line + len(terminal.failure.message) + 2 <= BUDGET
        assert (lines + 1) * per_line + len(terminal.failure.message) + 4 > BUDGET
    print(f"{language}: peak RSS growth per run {[g >> 10 for g in growth]} KiB")
    assert max(growth) <= 2 * BUDGET, f"peak RSS grew by {max(growth) >> 10} KiB"
