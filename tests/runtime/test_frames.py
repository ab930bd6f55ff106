"""Worker frames are bounded by the run's budgets and decoded without freezing the runtime.

Over real gRPC (``RuntimeService.Run`` on loopback) with real worker processes: fake workers
that speak raw protocol send frames no genuine worker could (a 200 MiB log, completion or
call), real programs return and print values right at their output budget, and a probe run
measures how long the runtime's event loop stalls while it decodes a large allowed frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.worker.ledger import LOG_LINE_OVERHEAD
from tests.runtime.conftest import drive, serving, start_message, streamed_logs
from tests.runtime.test_hostile_worker import (
    REAL_WORKER,
    SERVICE_BOOT_TIMEOUT_S,
    FakeWorkerSettings,
    Host,
    assert_no_worker_left,
    binding_calls,
    failure,
    seen_by_worker,
    success,
)

pb = runtime_pb2
OUTPUT_LIMIT = pb.FAILURE_KIND_OUTPUT_LIMIT
FRAME_BYTES = 200 << 20

# A fake worker that announces a FRAME_BYTES frame starting with ``HEAD`` and streams the rest
# of it in 1 MiB chunks (never holding it), then says what it saw: it gets that far only if the
# runtime read the whole frame without ending the run.
HUGE_FRAME = """\
ready()
head = HEAD
sock.sendall(struct.pack('>I', FRAME_BYTES) + head)
left = FRAME_BYTES - len(head)
chunk = b'x' * (1 << 20)
try:
    while left > 0:
        sock.sendall(chunk[:left])
        left -= len(chunk)
except OSError:
    time.sleep(60)  # the runtime hung up: it is about to kill us
AFTER
"""


def huge_frame_worker(head: bytes, after: str) -> str:
    body = HUGE_FRAME.replace("HEAD", repr(head)).replace("FRAME_BYTES", str(FRAME_BYTES))
    return body.replace("AFTER", after)


def reset_peak_rss() -> int:
    """Restart this process's peak-RSS count (VmHWM) from its current RSS; return that."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    return peak_rss()


def peak_rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


@contextlib.asynccontextmanager
async def hosting(tmp_path: Path, **overrides: Any) -> AsyncIterator[Host]:
    """``test_hostile_worker.hosting`` with a client that takes terminals as large as the
    runtime sends (its 96 MiB default message limit).

    Workers have the service's own boot timeout: these tests run real workers too, and a real
    worker's boot on a loaded host can take longer than the fake-worker server's 1 s (its run
    then failed ``worker did not become ready``, not the outcome under test)."""
    path = tmp_path / "worker.py"
    path.write_text(REAL_WORKER)
    values: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "pool_size": 0,
        "shutdown_grace_s": 0.2,
        "worker_script": str(path),
        "boot_timeout_s": SERVICE_BOOT_TIMEOUT_S,
    }
    settings = FakeWorkerSettings(**{**values, **overrides})
    options = [("grpc.max_receive_message_length", settings.max_message_bytes)]
    async with (
        serving(settings) as running,
        grpc.aio.insecure_channel(running.address, options=options) as channel,
    ):
        yield Host(running, runtime_pb2_grpc.RuntimeServiceStub(channel), path)


# -- (a) frames no genuine worker could send under the run's budgets ---------------------------


@pytest.mark.parametrize(
    ("output_budget", "head", "peak_bound"),
    [
        # The announced size alone proves it: refused after its first bytes.
        (1 << 20, b'{"t":"log","text":"', 16 << 20),
        (1 << 20, b'{"t":"done","value":["', 16 << 20),
        # The default 64 MiB budget: text content is refused once a budget's worth arrived.
        # (The run keeps the log's 64 MiB prefix, and its terminal carries it to the client in
        # this same process: that, not the frame, is most of this growth.)
        (64 << 20, b'{"t":"log","text":"', 512 << 20),
        (64 << 20, b'{"t":"done","value":["', 120 << 20),
    ],
    ids=["log-1MiB", "done-1MiB", "log-64MiB", "done-64MiB"],
)
async def test_an_output_frame_over_the_budget_ends_the_run_unread(
    tmp_path: Path, output_budget: int, head: bytes, peak_bound: int
) -> None:
    async with hosting(
        tmp_path, max_output_bytes=output_budget, default_max_output_bytes=output_budget
    ) as host:
        host.fake_workers(huge_frame_worker(head, "finish('read it all')"))
        before = reset_peak_rss()
        seen, terminal = await drive(host.stub, start_message("return 1", wall_ms=60_000))
        grown = peak_rss() - before
        await assert_no_worker_left(host)
    print(f"peak RSS grew by {grown >> 20} MiB for a {FRAME_BYTES >> 20} MiB frame")
    assert failure(terminal) == (OUTPUT_LIMIT, f"outer output exceeded {output_budget} bytes")
    logs = list(terminal.logs)
    if b'"log"' in head:
        # The log keeps its fitting prefix, as any overflowing log does.
        (prefix,) = logs
        assert set(prefix) == {"x"}
        assert len(json.dumps(logs)) + len(terminal.failure.message) + 2 <= output_budget
        assert len(prefix) > output_budget - 100 - LOG_LINE_OVERHEAD
    else:
        assert logs == []
    assert streamed_logs(seen) == []
    assert grown < peak_bound, f"peak RSS grew by {grown >> 20} MiB"


async def test_a_call_frame_over_the_message_limit_fails_that_call_unread(
    tmp_path: Path,
) -> None:
    # The runtime cannot relay arguments over its message limit: the call fails at once, the
    # rest of the frame is skipped unread, and the run goes on (the worker reads its answer).
    limits = {
        "max_message_bytes": 2 << 20,
        "max_output_bytes": 1 << 20,
        "default_max_output_bytes": 1 << 20,
    }
    async with hosting(tmp_path, **limits) as host:
        host.fake_workers(
            huge_frame_worker(
                b'{"t":"call","id":1,"name":"echo","args":["',
                "send({'t': 'call', 'id': 2, 'name': 'echo', 'args': [2]})\n"
                "finish([recv(), recv()])",
            )
        )
        before = reset_peak_rss()
        seen, terminal = await drive(host.stub, start_message("return 1", "echo", wall_ms=60_000))
        grown = peak_rss() - before
        await assert_no_worker_left(host)
    print(f"peak RSS grew by {grown >> 20} MiB for a {FRAME_BYTES >> 20} MiB frame")
    refused, answered = seen_by_worker(terminal)
    assert refused == {
        "t": "reply",
        "id": 1,
        "ok": False,
        "message": f"binding arguments are too large to send: more than {2 << 20} bytes of "
        f"JSON, over the runtime's limit (max_message_bytes {2 << 20})",
    }
    assert answered["id"] == 2 and answered["ok"] is True
    assert binding_calls(seen) == [(1, "echo", "2")]  # the refused call never reached us
    assert grown < 16 << 20, f"peak RSS grew by {grown >> 20} MiB"


# -- (b) genuine output at the budget: outcomes unchanged ---------------------------------------

CAP = 3 << 20  # frames near it are over frame_decoding.LARGE_FRAME_BYTES: decoded off the loop


def at_cap_programs() -> list[tuple[str, str, object, list[str]]]:
    """(program, id, expected success value or None for output-limit, expected logs)."""
    n = CAP - 2 - 2  # the value '"v...v"' beside the empty logs array '[]'
    k = (CAP - 2 - 4) // 4  # 'é' costs 2 bytes, 4 for each pair, plus 4 for '[]' and quotes
    line = CAP - 4 - LOG_LINE_OVERHEAD
    return [
        (f"return 'v' * {n}", "string-at-cap", "v" * n, []),
        (f"return 'v' * {n + 1}", "string-over-cap", None, []),
        (f"return 'éé' * {k}", "non-ascii-at-cap", "éé" * k, []),
        # A log line costs its overhead besides its text.
        (f"print('p' * {line})", "log-at-cap", None, ["p" * line]),
    ]


@pytest.mark.parametrize(
    ("program", "expected", "logs"),
    [pytest.param(p, v, logs, id=i) for p, i, v, logs in at_cap_programs()],
)
async def test_output_at_the_budget_keeps_its_outcome(
    tmp_path: Path, program: str, expected: object, logs: list[str]
) -> None:
    async with hosting(tmp_path, max_output_bytes=CAP, default_max_output_bytes=CAP) as host:
        _, terminal = await drive(host.stub, start_message(program, wall_ms=60_000))
    if expected is not None or logs:  # the failure's text, not the whole terminal, if not
        assert terminal.WhichOneof("outcome") == "success", terminal.failure
    if expected is not None:
        assert success(terminal) == expected
    elif logs:
        assert terminal.WhichOneof("outcome") == "success"
        assert not terminal.success.HasField("value_json")
        assert list(terminal.logs) == logs
    else:
        assert failure(terminal) == (OUTPUT_LIMIT, f"outer output exceeded {CAP} bytes")


async def test_a_log_one_byte_over_the_budget_keeps_its_fitting_prefix(tmp_path: Path) -> None:
    async with hosting(tmp_path, max_output_bytes=CAP, default_max_output_bytes=CAP) as host:
        host.workers_run(REAL_WORKER)
        line = CAP - 3 - LOG_LINE_OVERHEAD
        _, terminal = await drive(host.stub, start_message(f"print('p' * {line})"))
    message = f"outer output exceeded {CAP} bytes"
    assert failure(terminal) == (OUTPUT_LIMIT, message)
    assert list(terminal.logs) == ["p" * (CAP - 2 - 2 - len(message) - 2 - LOG_LINE_OVERHEAD)]


async def test_container_heavy_value_at_the_budget_is_not_refused(tmp_path: Path) -> None:
    # Empty lists cost the ledger 3 bytes each ("[]" and a comma) but spell 28 on the wire:
    # the bound must not mistake such a frame (about 9x its ledger size) for an oversized one.
    cap = 256 << 10
    count = (cap - 2 - 2) // 3
    async with hosting(tmp_path, max_output_bytes=cap, default_max_output_bytes=cap) as host:
        host.workers_run(REAL_WORKER)
        _, terminal = await drive(host.stub, start_message(f"return [[]] * {count}"))
    assert success(terminal) == [[]] * count


# -- (c) decoding a large allowed frame does not freeze the runtime -----------------------------

# 600,000 strings of 98 characters: a 60 MB frame whose value costs 60 MB of the default
# 64 MiB budget (seconds of codec work, which froze the runtime for as long before).
ITEMS = 600_000
BIG_DONE = f"""\
ready()
send({{'t': 'log', 'text': 'sending'}})
body = b','.join([b'"' + b'a' * 98 + b'"'] * {ITEMS})
head = b'{{"t":"done","value":[{{"kind":"array","length":{ITEMS}}},'
sock.sendall(raw_frame(head + body + b']}}'))
time.sleep(60)
"""


class LoopLag:
    """Samples how late the event loop runs a 5 ms timer: its worst stall so far."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, loop.time() - started - 0.005)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._sample())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


class CallbackCpu:
    """The most CPU time (of the event loop's thread: ``time.thread_time``, which another
    process's load does not inflate) any one event-loop callback used while active."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.what = ""
        self._saved: Any = None

    def __enter__(self) -> CallbackCpu:
        # What the whole suite left on the heap is frozen out of the collector: otherwise a full
        # collection that a callback's allocation happens to trigger walks every object earlier
        # tests left behind, and its cost (nothing of the code measured) lands in that callback.
        gc.collect()
        gc.freeze()
        self._saved = original = asyncio.events.Handle._run

        def timed(handle: asyncio.events.Handle) -> None:
            began = time.thread_time()
            try:
                original(handle)
            finally:
                spent = time.thread_time() - began
                if spent > self.worst:
                    self.worst, self.what = spent, repr(handle)[:200]

        asyncio.events.Handle._run = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.events.Handle._run = self._saved  # type: ignore[method-assign]
        gc.unfreeze()


def assert_few_linear_passes_per_callback(cpu: CallbackCpu, kept: str) -> None:
    """No event-loop callback used more CPU than a few C-speed passes over the kept text.

    What is left on the loop is of that kind (the reader's counts and copies, the terminal's
    message), and a loaded machine slows those passes and the loop's callbacks alike; the work
    that decoding threads do instead costs 60 to 120 such passes.
    """
    passes = max(linear_passes_cpu(kept), linear_passes_cpu(kept))
    bound = max(0.15, 4 * passes)
    print(
        f"worst event-loop callback: {cpu.worst * 1000:.0f} ms of CPU ({cpu.what}); "
        f"one set of linear passes: {passes * 1000:.0f} ms"
    )
    assert cpu.worst < bound, f"{cpu.worst * 1000:.0f} ms of CPU in one callback: {cpu.what}"


def linear_passes_cpu(text: str) -> float:
    """CPU time of this thread for one encode, decode, copy and count over ``text``."""
    began = time.thread_time()
    data = text.encode()
    data.decode()
    bytes(bytearray(data)).count(b"\\u")
    return time.thread_time() - began


@pytest.mark.parametrize("char", ["x", "é"], ids=["ascii", "non-ascii"])
async def test_a_huge_log_line_is_measured_and_cut_off_the_event_loop(
    tmp_path: Path, char: str
) -> None:
    # A legitimate program prints one line far over its 16 MiB output budget: the worker sends
    # the part that fits (a 16 MiB frame), and the runtime measures, charges and -- at the end
    # -- cuts it to the budget. Each of those steps ran on the event loop, 0.3 s (ASCII) to
    # 1.9 s (other text) of CPU in one callback, while no other run's frame could be read. Now
    # no callback of the loop uses more than a small bounded share of that (decoding threads
    # do the work), measured as CPU time of the loop's thread, not wall time.
    budget = 16 << 20
    async with hosting(tmp_path) as host:
        host.workers_run(REAL_WORKER)
        program = f"print({char!r} * {70 << 20})"
        with CallbackCpu() as cpu:
            _, terminal = await drive(
                host.stub, start_message(program, max_output_bytes=budget, wall_ms=120_000)
            )
    assert failure(terminal) == (OUTPUT_LIMIT, f"outer output exceeded {budget} bytes")
    (kept,) = terminal.logs
    assert set(kept) == {char} and len(kept.encode()) > budget - 1024 - LOG_LINE_OVERHEAD
    assert_few_linear_passes_per_callback(cpu, kept)


# A fake worker announcing a FRAME_BYTES log frame whose text is all 6-byte escapes (each a
# 2-byte character in the ledger): the fitting prefix the runtime keeps is tens of MiB of JSON to
# parse, and a cut inside an escape makes it parse again.
ESCAPED_LOG = HUGE_FRAME.replace(
    "chunk = b'x' * (1 << 20)", "chunk = b'\\\\u00e9' * ((1 << 20) // 6)"
)


async def test_a_hostile_log_frame_over_the_budget_is_cut_off_the_event_loop(
    tmp_path: Path,
) -> None:
    budget = 16 << 20
    worker = (
        ESCAPED_LOG.replace("HEAD", repr(b'{"t":"log","text":"'))
        .replace("FRAME_BYTES", str(FRAME_BYTES))
        .replace("AFTER", "finish('read it all')")
    )
    async with hosting(tmp_path, max_output_bytes=budget, default_max_output_bytes=budget) as host:
        host.fake_workers(worker)
        with CallbackCpu() as cpu:
            _, terminal = await drive(host.stub, start_message("return 1", wall_ms=120_000))
        await assert_no_worker_left(host)
    assert failure(terminal) == (OUTPUT_LIMIT, f"outer output exceeded {budget} bytes")
    (kept,) = terminal.logs
    assert set(kept) == {"é"} and len(kept.encode()) > budget - 1024 - LOG_LINE_OVERHEAD
    assert_few_linear_passes_per_callback(cpu, kept)


async def test_probe_runs_complete_while_a_large_frame_is_decoded(tmp_path: Path) -> None:
    # Probe runs (``return 1``), one after the other, from when the large frame is on its way
    # until the large run's terminal arrives: before the fix the loop was frozen while the
    # runtime decoded it, and no probe could finish first. The probes' workers boot while the
    # other CPU decodes: on a loaded host that takes more than the fake workers' usual 1 s.
    async with hosting(tmp_path, boot_timeout_s=SERVICE_BOOT_TIMEOUT_S) as host:
        host.fake_workers(BIG_DONE)
        call = host.stub.Run()
        await call.write(start_message("return 1", wall_ms=120_000))
        started = asyncio.Event()

        async def big_run() -> runtime_pb2.RunTerminal:
            async for message in call:
                kind = message.WhichOneof("kind")
                if kind == "log":
                    started.set()
                elif kind == "terminal":
                    await call.done_writing()
                    terminal: runtime_pb2.RunTerminal = message.terminal
                    return terminal
            raise AssertionError("no terminal")

        probes_first = 0
        while_decoding = 0.0
        with LoopLag() as lag:
            big = asyncio.ensure_future(big_run())
            await started.wait()  # its worker read its script and is sending the frame
            host.workers_run(REAL_WORKER)
            while not big.done():
                _, probe = await drive(host.stub, start_message("return 1"))
                assert success(probe) == 1
                if not big.done():
                    probes_first += 1
                    while_decoding = lag.worst
            terminal = await big
        await assert_no_worker_left(host)
    print(
        f"{probes_first} probe runs finished before the large run's terminal; worst event-loop "
        f"stall while they ran: {while_decoding * 1000:.0f} ms, over the whole run (the "
        f"60 MB terminal's transfer included): {lag.worst * 1000:.0f} ms"
    )
    assert success(terminal) == ["a" * 98] * ITEMS
    # The ordering is the assertion: unfixed, the loop was frozen for the whole decode and no
    # probe finished first. The stall figure is printed, never asserted (wall-clock on a shared,
    # loaded host is noise: 0.2-0.9 s fixed at load 12-17, 1.9-2.0 s unfixed).
    assert probes_first >= 1
