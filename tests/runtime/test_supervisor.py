"""One worker supervisor (``runtime_service/supervisor.py``) for program runs and plugin hosts:
the same rule holds for both, through the real runtime over gRPC.

Each behaviour runs the same Python code twice -- as a program, and as the body of a plugin
host's tool -- and both must meet the same verdict, each in its own words: a run's terminal
failure, a host's call result and its ``lost`` message. The kernel is the witness (the run's
cgroup counts the CPU of every process and kills at the memory budget); no test asserts on
wall-clock time."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service import run_cgroup
from runtime_service.exit_classification import (
    ExitSigns,
    HeapLimitWatch,
    WorkerExit,
    classify_exit,
)
from runtime_service.worker.framing import EXIT_OUT_OF_MEMORY
from tests.runtime.conftest import (
    connected,
    drive,
    grpc_settings,
    no_child_left,
    serving,
    start_message,
)
from tests.runtime.test_plugin_host import HostStream
from tests.runtime.test_run_cgroup import MEMFD_PROGRAM

pb = runtime_pb2
HOST = run_cgroup.shared_host()
needs_cgroups = pytest.mark.skipif(
    not HOST.available, reason=f"no run cgroups on this host: {HOST.reason}"
)
MIB = 1 << 20

# -- the rule, unit by unit -------------------------------------------------------------------

PYTHON = ExitSigns(out_of_memory_status=EXIT_OUT_OF_MEMORY)
NODE = ExitSigns(heap_limit_line="JavaScript heap out of memory")


def test_the_oom_killer_wins_over_any_status() -> None:
    for status in (None, 0, 7, -signal.SIGKILL):
        verdict = classify_exit(status, NODE, oom_killed=True, heap_limit_reached=False)
        assert verdict == WorkerExit(status, out_of_memory=True, oom_killer=True)


def test_a_language_says_out_of_memory_only_in_its_own_way() -> None:
    said = classify_exit(EXIT_OUT_OF_MEMORY, PYTHON, oom_killed=False, heap_limit_reached=False)
    assert said.out_of_memory and not said.oom_killer
    # Node's sign is an abort after its line, not Python's status.
    node = classify_exit(EXIT_OUT_OF_MEMORY, NODE, oom_killed=False, heap_limit_reached=False)
    assert not node.out_of_memory
    abort = -signal.SIGABRT
    assert classify_exit(abort, NODE, oom_killed=False, heap_limit_reached=True).out_of_memory
    crash = classify_exit(abort, NODE, oom_killed=False, heap_limit_reached=False)
    assert not crash.out_of_memory and crash.signal_name == "SIGABRT"
    assert classify_exit(7, PYTHON, oom_killed=False, heap_limit_reached=False).signal_name is None


def test_the_heap_limit_line_is_found_across_pieces() -> None:
    watch = HeapLimitWatch(NODE)
    for piece in (
        b"FATAL ERROR: Reached heap limit Allocation failed - JavaS",
        b"cript heap ",
        b"out",
    ):
        watch.feed(piece)
    assert not watch.seen
    watch.feed(b" of memory\n")
    assert watch.seen and not watch.watching
    assert not HeapLimitWatch(PYTHON).watching  # a language without the line reads nothing


# -- the same rule for a run and a plugin host -------------------------------------------------

# Two processes spin while the worker itself waits for them: only a meter of every process of
# the run sees the work.
SPINNING_CHILDREN = """\
import os
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while True:
            pass
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""

# The run's processes fill memfds (pages RLIMIT_AS cannot see) far past the budget: only the
# run's cgroup stops them, and whichever process the kernel kills, the worker is ended for it.
HOARDERS = MEMFD_PROGRAM.removesuffix('return "held everything"\n')


def as_host_half(body: str) -> str:
    """``body`` as the execute function of a plugin host's tool ``work``."""
    indented = "".join(f"        {line}\n" for line in body.splitlines())
    return (
        "def plugin(ctx):\n"
        "    def work(args):\n"
        f"{indented}"
        "        return 'never'\n"
        "    harness.register_tool(harness.define_tool(name='work', execute=work))\n"
        "return plugin\n"
    )


@pytest.fixture
async def stub() -> AsyncIterator[runtime_pb2_grpc.RuntimeServiceStub]:
    async with serving(grpc_settings(pool_size=0)) as running, connected(running) as client:
        yield client


async def as_run(
    stub: runtime_pb2_grpc.RuntimeServiceStub, body: str, **budgets: Any
) -> tuple[str, str]:
    """(failure message, its kind's name) of ``body`` run as a program."""
    _, terminal = await drive(stub, start_message(body + "return 'never'\n", **budgets))
    assert terminal.WhichOneof("outcome") == "failure", terminal
    return terminal.failure.message, pb.FailureKind.Name(terminal.failure.kind)


async def as_host(
    stub: runtime_pb2_grpc.RuntimeServiceStub, body: str, **budgets: Any
) -> tuple[str, str]:
    """(call result's error, the host's ``lost`` message) of ``body`` as a host's tool."""
    host = HostStream(stub)
    started = await host.start(as_host_half(body), budgets=pb.RunBudgets(**budgets))
    assert started.WhichOneof("kind") == "started", started
    await host.invoke(1, "work", {})
    result = await host.next_not_log()
    assert result.WhichOneof("kind") == "result", result
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost", lost
    return result.result.error_message, lost.lost.message


@needs_cgroups
@pytest.mark.parametrize("owner", ["run", "host"])
async def test_compute_counts_every_process_of_the_worker(
    owner: str, stub: runtime_pb2_grpc.RuntimeServiceStub
) -> None:
    if owner == "run":
        message, kind = await as_run(stub, SPINNING_CHILDREN, compute_ms=300, wall_ms=60_000)
        assert (kind, message) == ("FAILURE_KIND_TIMEOUT", "compute budget exhausted (300ms busy)")
    else:
        error, lost = await as_host(stub, SPINNING_CHILDREN, compute_ms=300, wall_ms=60_000)
        assert error == "compute budget exhausted (300ms busy)"
        assert lost.startswith("a call ran past its compute budget (300ms busy)"), lost
    await no_child_left()


@needs_cgroups
@pytest.mark.parametrize("owner", ["run", "host"])
async def test_an_oom_kill_in_the_run_ends_the_worker_as_out_of_memory(
    owner: str, stub: runtime_pb2_grpc.RuntimeServiceStub
) -> None:
    budget = 160 * MIB
    if owner == "run":
        message, kind = await as_run(stub, HOARDERS, memory_bytes=budget, wall_ms=120_000)
        assert kind == "FAILURE_KIND_WORKER_EXIT"
        assert message.startswith("run exceeded its memory budget (160 MiB"), message
    else:
        error, lost = await as_host(stub, HOARDERS, memory_bytes=budget, wall_ms=120_000)
        assert error == "the plugin host ended before the call did"
        assert lost == "the plugin host exceeded its memory budget (160 MiB)"
    await no_child_left()
