"""Scale-out: one registry, three runtime processes.

Runs spread over all three; SIGKILLing one while it serves runs fails exactly those runs,
cleanly (UNAVAILABLE CODE_RUNTIME_UNAVAILABLE with `phase: running`, the failure recorded,
every nested call they started settled once in history), and runs started after the kill all
go to the other two and succeed.

Which runtime served a run is read from the host, not from the services: programs see host pid
numbers (the runtimes spawn their workers, which then share the runtime's pid namespace: a
forked worker, in a pid namespace of its own, would not know its host pid), so a program
reports its worker's pid and the test finds, in /proc, the runtime process that is that
worker's parent.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
from collections.abc import Collection
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_client import ToolProvider
from codemode_client.provider import InvocationContext
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import tool_pb2
from registry_service.config import RegistrySettings
from registry_service.domain.scopes import Mode
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from tests.codemode.conftest import value_of
from tests.codemode.test_faults import _runtime_process
from tests.procfs import children, parent
from tests.registry.conftest import CODE, Harness, error_info_of

RUNTIMES = 3
SPAWNING = {"CODEMODE_RUNTIME_WORKER_LAUNCH": "spawn"}
IN_FLIGHT = 9  # runs parked in a nested call when one runtime is killed
AFTER_KILL = 6
_WAIT_S = 60  # generous: three runtimes and their workers share a small, loaded machine

# Nested calls before and after a call that parks until the test releases it, then returns the
# worker's pid.
PARKED = """\
import os
for i in range(3):
    await tools.tick({"i": i})
await tools.hold({"pid": os.getpid()})
total = 0
for i in range(3):
    total += (await tools.tick({"i": i}))["i"]
return {"pid": os.getpid(), "total": total}
"""
# A short run that says which runtime serves it: the worker is the runtime's child.
WHO = """\
import os
await tools.tick({"i": 0})
return {"runtime": os.getppid()}
"""


def _pidfd(pid: int) -> int | None:
    """A handle on a live process, which turns readable once it has exited."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


async def _exit_of(pidfd: int) -> None:
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(pidfd, exited.set_result, None)
    try:
        await exited
    finally:
        loop.remove_reader(pidfd)


async def _history(harness: Harness, agent: str) -> list[Any]:
    records: list[Any] = []
    token = ""
    while True:
        page = await harness.stub.ListHistory(
            rpb.ListHistoryRequest(agent=agent, page_size=1000, page_token=token)
        )
        records.extend(page.records)
        if not (token := page.next_page_token):
            return records


@pytest.mark.parametrize("runtime_channel", ["per-run", "multiplexed"])
async def test_runs_spread_over_three_runtimes_and_survive_losing_one(
    tmp_path: Path, runtime_channel: str
) -> None:
    launched = await asyncio.gather(
        *(_runtime_process(SPAWNING) for _ in range(RUNTIMES)), return_exceptions=True
    )
    started = [item for item in launched if not isinstance(item, BaseException)]
    procs = {proc.pid: proc for proc, _ in started}
    if len(started) < RUNTIMES:
        await _stop(procs.values())
        raise next(item for item in launched if isinstance(item, BaseException))
    config = RegistrySettings(
        listen="127.0.0.1:0",
        history_path=str(tmp_path / "history.sqlite3"),
        default_mode=Mode.CODE,
        runtime_targets=[address for _, address in started],
        # One agent holds every run parked at once and starts more beside them (more than
        # the default 8 per agent).
        agent_limits={"max_concurrent_runs": IN_FLIGHT + AFTER_KILL},
        runtime_channel=runtime_channel,  # a stream per run, or each runtime's one stream
    )
    running = await start_registry(config, build_registry(config))
    channel = grpc.aio.insecure_channel(running.address)
    harness = Harness(running, channel)
    provider = ToolProvider(channel, "load")
    held: dict[str, int] = {}  # nested call id -> worker pid
    arrived = asyncio.Event()
    gate = asyncio.Event()
    workers: list[int] = []  # pidfds of the killed runtime's workers
    tasks: list[asyncio.Task[tool_pb2.ToolResult]] = []

    @provider.tool(concurrency_safe=True)
    async def tick(args: Any, ctx: InvocationContext) -> Any:
        await asyncio.sleep(0.01)
        return {"i": args["i"]}

    @provider.tool(concurrency_safe=True)
    async def hold(args: Any, ctx: InvocationContext) -> Any:
        held[ctx.call_id] = args["pid"]
        arrived.set()
        await gate.wait()
        return {"released": True}

    async def run(program: str, call_id: str) -> tool_pb2.ToolResult:
        _, result = await harness.execute(
            "run_code", {"code": program, "description": call_id}, agent=agent, call_id=call_id
        )
        return result

    async def lost_run(call_id: str) -> None:
        """A run of the killed runtime: it ends as an outage (after its nested calls)."""
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(parked[call_id], _WAIT_S)
        info = error_info_of(caught.value)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE, caught.value
        assert info is not None and info.reason == "CODE_RUNTIME_UNAVAILABLE", caught.value
        assert info.metadata["phase"] == "running"

    try:
        await provider.start()
        agent = await harness.agent("scale", mode=CODE)

        # (1) Round-robin reaches every runtime once all three are connected.
        served: collections.Counter[int] = collections.Counter()
        for n in range(10 * RUNTIMES):
            served[value_of(await run(WHO, f"warm-{n}"))["result"]["runtime"]] += 1
            if len(served) == RUNTIMES:
                break
        assert set(served) == set(procs), served

        # (2) Many runs in flight, each parked in a nested call on some runtime's worker.
        parked = {
            f"load-{n}": asyncio.create_task(run(PARKED, f"load-{n}")) for n in range(IN_FLIGHT)
        }
        tasks += parked.values()
        async with asyncio.timeout(_WAIT_S):
            while len(held) < IN_FLIGHT:
                arrived.clear()
                await arrived.wait()
        where = {call_id.split(":")[0]: parent(pid) for call_id, pid in held.items()}
        spread = collections.Counter(where.values())
        assert set(spread) == set(procs), f"runs per runtime: {spread}"
        victim = max(spread, key=lambda pid: spread[pid])
        lost = {call_id for call_id, pid in where.items() if pid == victim}
        workers += [fd for pid in children(victim) if (fd := _pidfd(pid)) is not None]
        assert workers
        procs[victim].send_signal(signal.SIGKILL)
        await asyncio.wait_for(procs[victim].wait(), _WAIT_S)

        # (3) Runs started once the runtime is gone go to the two others, and succeed.
        fresh = [asyncio.create_task(run(WHO, f"after-{n}")) for n in range(AFTER_KILL)]
        tasks += fresh
        results = await asyncio.wait_for(asyncio.gather(*fresh), _WAIT_S)
        after = collections.Counter(value_of(result)["result"]["runtime"] for result in results)
        assert set(after) == set(procs) - {victim}, f"runs per runtime after the kill: {after}"

        # The victim's runs end on their own (no hang), as clean failures.
        for call_id in lost:
            await lost_run(call_id)
        gate.set()
        for call_id in set(parked) - lost:
            value = value_of(await asyncio.wait_for(parked[call_id], _WAIT_S))
            assert value["result"] == {"pid": held[f"{call_id}:code:4"], "total": 3}

        # Every nested call started is settled exactly once, before its run's result.
        records = await _history(harness, agent)
        outer = {r.call_id: r for r in records if r.kind == "tool/result"}
        assert set(outer) >= set(parked) | {f"after-{n}" for n in range(AFTER_KILL)}
        assert {c for c, r in outer.items() if r.is_error} == lost
        assert {outer[c].error_code for c in lost} == {"CODE_RUNTIME_UNAVAILABLE"}
        starts = collections.Counter(
            r.call_id for r in records if r.kind == "tool/code-dispatch-start"
        )
        settles = {r.call_id: r for r in records if r.kind == "tool/code-dispatch"}
        assert len(settles) == len([r for r in records if r.kind == "tool/code-dispatch"])
        assert set(starts) == set(settles) and set(starts.values()) == {1}
        for record in settles.values():
            assert record.seq < outer[record.parent_call_id].seq
        by_seq = sorted(settles.values(), key=lambda r: r.seq)
        for call_id in lost:
            nested = [r for r in by_seq if r.parent_call_id == call_id]
            assert [r.tool_name for r in nested] == ["tick"] * 3 + ["hold"]
            assert nested[-1].is_error and not any(r.is_error for r in nested[:-1])

        # The victim's workers died with it (no orphans).
        await asyncio.wait_for(asyncio.gather(*(_exit_of(fd) for fd in workers)), _WAIT_S)
    finally:
        gate.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for fd in workers:
            os.close(fd)
        await provider.close()
        await channel.close()
        await running.stop(0)
        await _stop(procs.values())


async def _stop(procs: Collection[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        if proc.returncode is None:
            proc.terminate()
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()
