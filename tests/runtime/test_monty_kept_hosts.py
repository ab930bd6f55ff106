"""Kept Monty hosts (``runtime_service/kept_hosts.py``) through the real ``RuntimeService.Run``
API on loopback: one sandboxed bridge + ``monty`` process serves one tenant's runs one after
the other, each on a fresh interpreter state, and never another tenant's.

- reuse: a tenant's second run is served by the same host (same process), and sees nothing of
  the first (globals, functions, module attributes, caches, exceptions);
- isolation: another tenant never gets that host; a run without a tenant gets a host used
  once;
- recycling: after ``kept_host_runs`` runs, after a timeout, an out-of-memory end, a cancel
  and a crash of the ``monty`` process (killed mid-run), and when idle; the next run of the
  same tenant works, other tenants' hosts are untouched;
- capacity: a tenant holds at most ``kept_hosts_per_tenant`` hosts; idle kept hosts give
  their sandbox up to a run that finds none free.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from runtime_service.languages import monty as monty_backend
from runtime_service.languages import register
from runtime_service.server import RunningRuntime
from runtime_service.worker_process import WorkerProcess, WorkerSpec
from tests.runtime.conftest import connected, echo_answer, grpc_settings, serving, start_message_in
from tests.runtime.language_corpus import corpus

NAME = monty_backend.NAME

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pydantic_monty") is None,
    reason="the pydantic-monty package is not installed (scripts/bootstrap installs it)",
)


@pytest.fixture
def monty_registered() -> Iterator[None]:
    why = monty_backend.BACKEND.unavailable(WorkerSpec())
    assert why is None, why
    unregister = register(monty_backend.BACKEND)
    try:
        yield
    finally:
        unregister()


class Served:
    def __init__(self, running: RunningRuntime, stub: corpus.Stub) -> None:
        self.running = running
        self.stub = stub

    @property
    def kept(self) -> Any:
        return self.running.runtime.kept

    def hosts(self, tenant: str) -> list[WorkerProcess]:
        return list(self.kept.workers(NAME, tenant))

    def pids(self, tenant: str) -> list[int]:
        return [worker.pid for worker in self.hosts(tenant)]

    async def run(
        self,
        source: str,
        tenant: str,
        expect: dict[str, object] | None = None,
        budgets: dict[str, int] | None = None,
    ) -> corpus.Seen:
        case = corpus.Case("kept", dict(expect or {}), dict(budgets or {}))
        seen = await corpus.run_case(self.stub, NAME, case, source, tenant=tenant)
        if expect is not None:
            assert corpus.check(case, seen) == [], (seen.outcome, seen.message, seen.value_json)
        return seen

    async def ok(self, tenant: str) -> None:
        await self.run("return 1", tenant, {"outcome": "success", "value_json": "1"})


@contextlib.asynccontextmanager
async def served(**settings: Any) -> AsyncIterator[Served]:
    configured = grpc_settings(languages=["python", NAME], **settings)
    async with serving(configured) as running, connected(running) as stub:
        yield Served(running, stub)


@pytest.fixture
async def runtime(monty_registered: None) -> AsyncIterator[Served]:
    async with served() as it:
        yield it


FIRST = """
import asyncio
global leaked
leaked = 41
def helper():
    return 'helper'
cache = {}
def remember(key, store=cache):
    store[key] = True
    return len(store)
remember('a')
try:
    asyncio.leaked = 1
except Exception:
    pass
try:
    raise ValueError('from the first run')
except ValueError as exc:
    kept = exc
print('first')
return leaked
"""

SECOND = """
import asyncio
seen = []
for name in ('leaked', 'helper', 'cache', 'remember', 'kept', 'exc'):
    try:
        eval_me = {'leaked': lambda: leaked, 'helper': lambda: helper, 'cache': lambda: cache,
                   'remember': lambda: remember, 'kept': lambda: kept, 'exc': lambda: exc}
        eval_me[name]()
        seen.append(name)
    except NameError:
        pass
if hasattr(asyncio, 'leaked'):
    seen.append('asyncio.leaked')
return seen
"""


async def test_a_tenants_runs_share_one_host_and_each_starts_fresh(runtime: Served) -> None:
    await runtime.run(FIRST, "agent-a", {"outcome": "success", "value_json": "41"})
    [pid] = runtime.pids("agent-a")
    seen = await runtime.run(SECOND, "agent-a", {"outcome": "success", "value_json": "[]"})
    assert seen.logs == []
    assert runtime.pids("agent-a") == [pid]  # the same process served both runs
    # What Monty refused in one run (an exception ending it) leaves nothing either.
    await runtime.run("raise KeyError('boom')", "agent-a", {"outcome": "exception"})
    await runtime.run(SECOND, "agent-a", {"outcome": "success", "value_json": "[]"})
    assert runtime.pids("agent-a") == [pid]


async def test_the_corpus_passes_on_one_kept_host(runtime: Served) -> None:
    ran, failures = await corpus.conformance(runtime.stub, NAME, tenant="agent-corpus")
    assert failures == {}
    assert ran
    assert len(runtime.pids("agent-corpus")) == 1


async def test_a_host_is_never_shared_between_tenants(runtime: Served) -> None:
    await runtime.run(FIRST, "agent-a", {"outcome": "success", "value_json": "41"})
    await runtime.run(SECOND, "agent-b", {"outcome": "success", "value_json": "[]"})
    [a], [b] = runtime.pids("agent-a"), runtime.pids("agent-b")
    assert a != b
    await runtime.ok("agent-b")
    assert runtime.pids("agent-a") == [a] and runtime.pids("agent-b") == [b]
    # A run without a tenant takes neither, and keeps nothing.
    await runtime.ok("")
    assert runtime.kept.workers(NAME, "") == []
    assert runtime.pids("agent-a") == [a] and runtime.pids("agent-b") == [b]


async def test_a_host_is_recycled_after_its_runs(monty_registered: None) -> None:
    async with served(kept_host_runs=2) as runtime:
        await runtime.ok("agent-a")
        [first] = runtime.hosts("agent-a")
        await runtime.ok("agent-a")
        assert runtime.hosts("agent-a") == []  # its second run was its last
        await asyncio.wait_for(first.closed, 30)
        await runtime.ok("agent-a")
        [second] = runtime.hosts("agent-a")
        assert second is not first


ENDS = [
    pytest.param("while True:\n    pass", {"compute_ms": 300}, "timeout", id="timeout"),
    pytest.param(
        "x = []\nwhile True:\n    x.append('y' * 1000000)",
        {"memory_bytes": 64 << 20},
        "",
        id="out-of-memory",
    ),
    pytest.param("print('x' * 100)", {"max_output_bytes": 16}, "output-limit", id="output"),
]


@pytest.mark.parametrize(("source", "budgets", "outcome"), ENDS)
async def test_a_run_that_ends_badly_recycles_its_host_and_the_next_works(
    runtime: Served, source: str, budgets: dict[str, int], outcome: str
) -> None:
    await runtime.ok("agent-a")
    await runtime.ok("agent-b")
    [host] = runtime.hosts("agent-a")
    [other] = runtime.pids("agent-b")
    seen = await runtime.run(source, "agent-a", budgets=budgets)
    if outcome:
        assert seen.outcome == outcome, seen
    else:
        assert seen.outcome in ("abort", "worker-exit", "exception"), seen
        assert "memory" in seen.message.lower(), seen.message
    await asyncio.wait_for(host.closed, 30)  # ended, not kept
    assert runtime.hosts("agent-a") == []
    await runtime.ok("agent-a")
    [fresh] = runtime.hosts("agent-a")
    assert fresh is not host
    assert runtime.pids("agent-b") == [other]  # the other tenant's host is untouched


async def _held_call(runtime: Served, tenant: str) -> tuple[Any, pb.BindingCall]:
    call = runtime.stub.Run()
    await call.write(start_message_in(NAME, "return await tools.echo({})", "echo", tenant=tenant))
    async for message in call:
        if message.WhichOneof("kind") == "binding_call":
            return call, message.binding_call
    raise AssertionError("the run ended before its call")


async def _terminal(call: Any) -> pb.RunTerminal:
    async for message in call:
        if message.WhichOneof("kind") == "terminal":
            await call.done_writing()
            terminal: pb.RunTerminal = message.terminal
            return terminal
    raise AssertionError("no terminal")


async def test_a_cancelled_run_recycles_its_host(runtime: Served) -> None:
    await runtime.ok("agent-a")
    [host] = runtime.hosts("agent-a")
    call, _ = await _held_call(runtime, "agent-a")
    await call.write(pb.RunRequest(cancel=pb.RunCancel(reason="enough")))
    terminal = await _terminal(call)
    assert terminal.failure.kind == pb.FAILURE_KIND_ABORT, terminal
    await asyncio.wait_for(host.closed, 30)
    await runtime.ok("agent-a")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(child) for child in handle.read().split()]
    return found


async def test_a_crash_of_the_monty_process_ends_the_run_and_recycles_the_host(
    runtime: Served,
) -> None:
    await runtime.ok("agent-a")
    await runtime.ok("agent-b")
    [other] = runtime.pids("agent-b")
    [host] = runtime.hosts("agent-a")
    call, held = await _held_call(runtime, "agent-a")
    [monty] = _children(host.pid)  # the bridge's one child: the monty process
    os.kill(monty, signal.SIGKILL)
    await call.write(pb.RunRequest(call_result=await echo_answer(held)))
    terminal = await _terminal(call)
    assert terminal.failure.kind == pb.FAILURE_KIND_WORKER_EXIT, terminal
    assert "crashed" in terminal.failure.message, terminal.failure.message
    await asyncio.wait_for(host.closed, 30)
    await runtime.ok("agent-a")
    assert runtime.hosts("agent-a")[0] is not host
    assert runtime.pids("agent-b") == [other]
    await runtime.ok("agent-b")


async def test_an_idle_host_is_ended(monty_registered: None) -> None:
    async with served(kept_host_idle_s=0.2) as runtime:
        await runtime.ok("agent-a")
        [host] = runtime.hosts("agent-a")
        await asyncio.wait_for(host.closed, 30)  # nobody ends it but its idle timer
        assert runtime.hosts("agent-a") == []
        assert runtime.kept.held(NAME, "agent-a") == 0
        await runtime.ok("agent-a")


async def test_a_tenant_holds_at_most_its_hosts(monty_registered: None) -> None:
    async with served(kept_hosts_per_tenant=1) as runtime:
        calls = [await _held_call(runtime, "agent-a") for _ in range(3)]
        assert runtime.kept.held(NAME, "agent-a") == 1  # the others run on hosts used once
        for call, held in calls:
            await call.write(pb.RunRequest(call_result=await echo_answer(held)))
        for call, _ in calls:
            terminal = await _terminal(call)
            assert json.loads(terminal.success.value_json) == {"echo": {}}
        assert len(runtime.hosts("agent-a")) == 1


async def _until(condition: Any) -> None:
    """Poll a condition of the runtime's state (a latch, never a duration)."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def _started(runtime: Served, tenant: str, source: str = "return 2") -> Any:
    call = runtime.stub.Run()
    await call.write(start_message_in(NAME, source, "echo", tenant=tenant))
    return call


async def test_a_run_finding_its_tenants_hosts_busy_waits_for_one(
    monty_registered: None,
) -> None:
    """The run beyond the tenant's one kept host starts no host of its own: it waits, another
    tenant's host given back meanwhile is not its, and its tenant's host serves it next."""
    async with served(kept_hosts_per_tenant=1, kept_host_wait_s=60) as runtime:
        call, held = await _held_call(runtime, "agent-a")
        [host] = runtime.hosts("agent-a")
        waiting = await _started(runtime, "agent-a")
        await _until(lambda: runtime.kept.waiting(NAME, "agent-a") == 1)
        await runtime.ok("agent-b")  # given back idle: agent-b's, never agent-a's waiter
        assert runtime.kept.waiting(NAME, "agent-a") == 1
        assert runtime.hosts("agent-a") == [host]
        await call.write(pb.RunRequest(call_result=await echo_answer(held)))
        assert (await _terminal(call)).WhichOneof("outcome") == "success"
        terminal = await _terminal(waiting)
        assert json.loads(terminal.success.value_json) == 2, terminal
        assert runtime.hosts("agent-a") == [host] and host.runs_served == 2
        assert (
            runtime.kept.held(NAME, "agent-a") == 1 and runtime.kept.waiting(NAME, "agent-a") == 0
        )


async def test_a_waiting_run_can_be_cancelled_and_the_host_stays_kept(
    monty_registered: None,
) -> None:
    async with served(kept_hosts_per_tenant=1, kept_host_wait_s=60) as runtime:
        call, held = await _held_call(runtime, "agent-a")
        [host] = runtime.hosts("agent-a")
        waiting = await _started(runtime, "agent-a")
        await _until(lambda: runtime.kept.waiting(NAME, "agent-a") == 1)
        await waiting.write(pb.RunRequest(cancel=pb.RunCancel(reason="enough")))
        assert (await _terminal(waiting)).failure.kind == pb.FAILURE_KIND_ABORT
        assert runtime.kept.waiting(NAME, "agent-a") == 0
        await call.write(pb.RunRequest(call_result=await echo_answer(held)))
        assert (await _terminal(call)).WhichOneof("outcome") == "success"
        await runtime.ok("agent-a")  # on the same host: the cancelled waiter took nothing
        assert runtime.hosts("agent-a") == [host] and host.runs_served == 2


async def test_a_host_recycled_while_a_run_waits_lets_it_keep_a_fresh_one(
    monty_registered: None,
) -> None:
    async with served(kept_hosts_per_tenant=1, kept_host_wait_s=60) as runtime:
        call, _ = await _held_call(runtime, "agent-a")
        [host] = runtime.hosts("agent-a")
        waiting = await _started(runtime, "agent-a")
        await _until(lambda: runtime.kept.waiting(NAME, "agent-a") == 1)
        await call.write(pb.RunRequest(cancel=pb.RunCancel(reason="enough")))  # recycles it
        assert (await _terminal(call)).failure.kind == pb.FAILURE_KIND_ABORT
        terminal = await _terminal(waiting)
        assert json.loads(terminal.success.value_json) == 2, terminal
        [fresh] = runtime.hosts("agent-a")
        assert fresh is not host and runtime.kept.held(NAME, "agent-a") == 1


async def test_a_run_stops_waiting_when_no_host_comes_back(monty_registered: None) -> None:
    """The tenant's one host is held by a run that goes on: none is given back, so the run
    beyond it stops waiting and is served at once on a host used once."""
    async with served(kept_hosts_per_tenant=1, kept_host_wait_s=0.2) as runtime:
        call, held = await _held_call(runtime, "agent-a")
        [host] = runtime.hosts("agent-a")
        await runtime.ok("agent-a")  # while the first run still waits for its answer
        assert runtime.hosts("agent-a") == [host] and runtime.kept.held(NAME, "agent-a") == 1
        assert runtime.kept.waiting(NAME, "agent-a") == 0
        await call.write(pb.RunRequest(call_result=await echo_answer(held)))
        assert (await _terminal(call)).WhichOneof("outcome") == "success"


async def test_without_waiting_a_run_beyond_the_hosts_gets_one_used_once(
    monty_registered: None,
) -> None:
    async with served(kept_hosts_per_tenant=1, kept_host_wait_s=0) as runtime:
        call, held = await _held_call(runtime, "agent-a")
        await runtime.ok("agent-a")  # at once, on a host used once
        assert runtime.kept.held(NAME, "agent-a") == 1
        await call.write(pb.RunRequest(call_result=await echo_answer(held)))
        assert (await _terminal(call)).WhichOneof("outcome") == "success"


async def test_idle_hosts_give_their_sandbox_to_a_run_that_needs_one(
    monty_registered: None,
) -> None:
    # Two sandboxes in all: two tenants' idle hosts hold both; a third tenant's run ends the
    # least recently used instead of being refused. A range of its own: a worker an earlier
    # test's runtime is still tearing down must not hold one of the two.
    async with served(pool_size=0, worker_uid_base=63_740, worker_uid_count=2) as runtime:
        await runtime.ok("agent-a")
        await runtime.ok("agent-b")
        [a], [b] = runtime.hosts("agent-a"), runtime.hosts("agent-b")
        await runtime.ok("agent-c")
        await asyncio.wait_for(a.closed, 30)
        assert runtime.hosts("agent-a") == [] and runtime.hosts("agent-b") == [b]
        assert len(runtime.hosts("agent-c")) == 1


def test_the_settings_bound_kept_hosts() -> None:
    options = grpc_settings(
        kept_host_runs=7, kept_hosts_per_tenant=2, kept_host_wait_s=0.5
    ).runtime_options()
    assert options.kept_hosts.runs_per_host == 7 and options.kept_hosts.hosts_per_tenant == 2
    assert options.kept_hosts.wait_s == 0.5
    with pytest.raises(ValueError, match="kept_host_wait_s"):
        grpc_settings(kept_host_wait_s=-1)
    with pytest.raises(ValueError, match="kept_host_runs"):
        grpc_settings(kept_host_runs=0)


def _address_space_limits(pid: int) -> list[str]:
    """The soft ``Max address space`` of ``pid`` and of each of its children, from /proc."""
    found = []
    with open(f"/proc/{pid}/task/{pid}/children") as listed:
        children = listed.read().split()
    for each in [pid, *map(int, children)]:
        with open(f"/proc/{each}/limits") as limits:
            line = next(text for text in limits if text.startswith("Max address space"))
        found.append(line.split()[3])
    return found


async def test_the_bridge_address_space_is_bounded_by_each_runs_budget(runtime: Served) -> None:
    """The bridge's RLIMIT_AS is what it held when ready plus the run's budget, set again at
    each run of a kept host (larger, then smaller); its ``monty`` child, started before, keeps
    its own (Monty's heap limit and the run cgroup bound it)."""
    await runtime.run("return 1", "t", {"outcome": "success"}, {"memory_bytes": 128 << 20})
    (pid,) = runtime.pids("t")
    first = _address_space_limits(pid)
    assert first[0] != "unlimited" and len(first) == 2, first
    await runtime.run("return 2", "t", {"outcome": "success"}, {"memory_bytes": 256 << 20})
    assert runtime.pids("t") == [pid]  # the same kept host
    second = _address_space_limits(pid)
    assert int(second[0]) - int(first[0]) == 128 << 20
    assert second[1] == first[1]
    await runtime.run("return 3", "t", {"outcome": "success"}, {"memory_bytes": 128 << 20})
    assert _address_space_limits(pid) == first
