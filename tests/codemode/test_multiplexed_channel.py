"""What only the multiplexed channel (`runtime_channel: multiplexed`, the default) has: one
stream per runtime target carrying the runs of every agent, and its replacement by age. The
rest of the suite runs on it by default (`test_per_run_channel.py` runs the main scenarios
again on per-run streams)."""

from __future__ import annotations

import asyncio
import re
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1.runtime_pb2_grpc import (
    RuntimeServiceStub,
    add_RuntimeServiceServicer_to_server,
)
from registry_service import runtime_resolution
from registry_service.codemode.runtime_port import (
    BindingCall,
    RunSpec,
    RunTerminal,
    RuntimeLost,
    RuntimeUnreachable,
)
from registry_service.domain.scopes import Mode
from registry_service.runtime_client import GrpcRuntime, MuxRunStream
from registry_service.runtime_mux import Multiplexer
from registry_service.runtime_targets import names_one_runtime
from tests.codemode.conftest import value_of
from tests.codemode.fake_runtime import FakeRuntime
from tests.codemode.test_faults import _runtime_process
from tests.codemode.test_scale_out import SPAWNING
from tests.registry.conftest import CODE, error_info_of
from tests.runtime.conftest import grpc_settings, serving, start_message

_WAIT_S = 60

HELD = """\
import os
await tools.hold({"runtime": os.getppid()})
return "released"
"""


@pytest.mark.parametrize("naming", ["two targets", "one target naming both"])
async def test_a_runtime_killed_with_runs_of_several_agents_fails_only_the_runs_it_held(
    make_registry: Callable[..., Any], naming: str
) -> None:
    """Two runtimes, each over its one stream (two targets, or one address list naming both:
    a stream per runtime it resolves to); three agents with two runs each parked in a nested
    call. Killing one runtime fails exactly its runs (of every agent on it) as `phase:
    running` outages; the other runtime's runs, on their own stream, complete."""
    launched = [await _runtime_process(SPAWNING) for _ in range(2)]
    procs = {proc.pid: proc for proc, _ in launched}
    held: dict[str, int] = {}  # outer call id -> the runtime its worker runs under
    arrived = asyncio.Event()
    gate = asyncio.Event()

    async def hold(invocation: Any) -> Any:
        held[invocation.call_id.split(":")[0]] = invocation.arguments["runtime"]
        arrived.set()
        # Released by the test, or cancelled when its run is lost (it settles first).
        waits = [asyncio.ensure_future(e.wait()) for e in (gate, invocation.signal)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return {"ok": True}

    try:
        targets = [address for _, address in launched]
        if naming != "two targets":
            targets = ["ipv4:" + ",".join(targets)]
        async with make_registry(default_mode=Mode.CODE, runtime_targets=targets) as harness:
            harness.registry.register_tool("hold", hold, concurrency_safe=True)
            agents = [await harness.agent(f"agent-{n}", mode=CODE) for n in range(3)]

            async def run(agent: str, call_id: str) -> Any:
                _, result = await harness.execute(
                    "run_code", {"code": HELD, "description": call_id}, agent=agent,
                    call_id=call_id,
                )  # fmt: skip
                return result

            runs = {
                f"{agent}-{n}": (agent, asyncio.create_task(run(agent, f"{agent}-{n}")))
                for agent in agents
                for n in range(2)
            }
            async with asyncio.timeout(_WAIT_S):
                while len(held) < len(runs):
                    arrived.clear()
                    await arrived.wait()
            assert set(held.values()) == set(procs), f"runs per runtime: {held}"
            victim = next(
                pid
                for pid in procs
                if len({runs[c][0] for c, where in held.items() if where == pid}) >= 2
            )
            procs[victim].send_signal(signal.SIGKILL)
            await asyncio.wait_for(procs[victim].wait(), _WAIT_S)
            lost = {call_id for call_id, where in held.items() if where == victim}
            for call_id in lost:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await asyncio.wait_for(runs[call_id][1], _WAIT_S)
                info = error_info_of(caught.value)
                assert caught.value.code() is grpc.StatusCode.UNAVAILABLE, caught.value
                assert info is not None and info.reason == "CODE_RUNTIME_UNAVAILABLE"
                assert info.metadata["phase"] == "running"
            gate.set()
            for call_id in set(runs) - lost:
                result = await asyncio.wait_for(runs[call_id][1], _WAIT_S)
                assert value_of(result)["result"] == "released", call_id
    finally:
        gate.set()
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


async def test_a_stream_past_its_age_takes_no_new_runs_and_ends_after_its_own() -> None:
    """Run 1 on a stream; the stream is past its age when run 2 comes (max_age_s 0), so run 2
    opens a new one; run 1 still completes on the old stream, which then ends."""
    program = "return (await tools.echo({}))['n']"
    async with (
        serving(grpc_settings(pool_size=2)) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        multiplexer = Multiplexer(RuntimeServiceStub(channel), 4 << 20, max_age_s=0.0)
        first = multiplexer.open(start_message(program, "echo").start)
        second = multiplexer.open(start_message(program, "echo").start)
        assert multiplexer.streams_opened == 2
        for n, run in enumerate((first, second), start=1):
            stream = MuxRunStream(run, None)
            async with asyncio.timeout(_WAIT_S):
                async for event in stream.events():
                    if isinstance(event, BindingCall):
                        stream.reply(event.call_id, True, f'{{"n": {n}}}')
                    elif isinstance(event, RunTerminal):
                        assert event.value_json == str(n)
            await stream.close()
        # The retired stream ends once its run has (the runtime ends it: no error).
        await asyncio.wait_for(first._stream.ended(), _WAIT_S)
        assert first._stream.broken and not second._stream.broken
        await multiplexer.close()


async def _events(stream: MuxRunStream) -> list[Any]:
    return [event async for event in stream.events()]


class _HungRuntime(FakeRuntime):
    """Takes every run on its stream, then never says anything more about it."""

    async def Multiplex(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for message in request_iterator:
            for frame in message.frames:
                if frame.request.WhichOneof("kind") == "start":
                    yield pb.MultiplexResponse(
                        frames=[pb.RunResponseFrame(run_id=frame.run_id, accepted=True)]
                    )


async def test_a_run_the_runtime_goes_silent_on_is_lost_at_its_deadline_and_only_it() -> None:
    """A runtime that takes runs and sends nothing more: the stream has no deadline of its
    own, so each run's is kept by the registry; the first run is lost at its deadline
    (DEADLINE_EXCEEDED, an outage of the running phase), while the other, whose deadline is
    far, is still waiting on the same stream."""
    server = grpc.aio.server()
    add_RuntimeServiceServicer_to_server(_HungRuntime(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            multiplexer = Multiplexer(RuntimeServiceStub(channel), 4 << 20)
            loop = asyncio.get_running_loop()
            runs = [multiplexer.open(start_message("return 1").start) for _ in range(2)]
            for run in runs:
                assert await asyncio.wait_for(run.incoming.get(), _WAIT_S) is True
            soon = MuxRunStream(runs[0], loop.time() + 0.2)
            far = MuxRunStream(runs[1], loop.time() + 3600)
            with pytest.raises(RuntimeLost, match="DEADLINE_EXCEEDED"):
                await asyncio.wait_for(_events(soon), _WAIT_S)
            assert far._run.incoming.empty() and not far._done
            await soon.close()
            await far.close()
            assert runs[1].ended and not runs[1]._stream.broken
            await multiplexer.close()
    finally:
        await server.stop(0)


@pytest.mark.parametrize(
    ("address", "one"),
    [
        ("127.0.0.1:50052", True),
        ("runtime.internal:50052", True),
        ("localhost:0", True),
        ("unix:/run/codemode/runtime.sock", True),
        ("ipv4:10.0.0.1:50052", True),
        ("dns:///runtime:50052", False),
        ("dns://8.8.8.8/runtime:50052", False),
        ("ipv4:10.0.0.1:50052,10.0.0.2:50052", False),
    ],
)
def test_which_targets_name_one_runtime(address: str, one: bool) -> None:
    assert names_one_runtime(address) is one


async def _ran_on(runtime: GrpcRuntime, runs: int = 1) -> list[int]:
    """The runtime process (pid) each of `runs` sequential runs ran under."""
    pids = []
    for _ in range(runs):
        spec = RunSpec("import os\nreturn os.getppid()", "", (), b"t", _WAIT_S)
        stream = await runtime.open_run(spec)
        async with asyncio.timeout(_WAIT_S):
            async for event in stream.events():
                assert isinstance(event, RunTerminal) and event.value_json, event
                pids.append(int(event.value_json))
        await stream.close()
    return pids


async def test_a_target_naming_several_runtimes_gets_a_stream_per_runtime() -> None:
    """One target naming two runtimes (an address list, as a `dns:///` name with two records
    is): each runtime gets a channel and one multiplexed stream of its own, and runs alternate
    between them (round robin over the connected ones)."""
    launched = [await _runtime_process(SPAWNING) for _ in range(2)]
    try:
        target = "ipv4:" + ",".join(address for _, address in launched)
        runtime = GrpcRuntime([target], 4 << 20, start_timeout_s=_WAIT_S)
        try:
            ran_on: Counter[int] = Counter()
            # A runtime's channel connects when first asked: run until both are connected.
            for _ in range(40):
                ran_on.update(await _ran_on(runtime))
                if all(t.connected() for t in runtime._targets):
                    break
            assert {t.address for t in runtime._targets} == {
                f"ipv4:{address}" for _, address in launched
            }
            ran_on = Counter(await _ran_on(runtime, 6))
            assert set(ran_on) == {proc.pid for proc, _ in launched}, ran_on
            assert set(ran_on.values()) == {3}, ran_on  # in turn
            multiplexers = list(runtime._multiplexers.values())
            assert len(multiplexers) == 2
            assert [m.streams_opened for m in multiplexers] == [1, 1]
        finally:
            await runtime.close()
    finally:
        for proc, _ in launched:
            proc.kill()
            await proc.wait()


async def test_a_resolved_target_follows_its_runtimes_as_they_are_replaced_and_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A `dns:` name whose answer changes (the lookup is this test's: the name's records as
    the test sets them): its runtime replaced by another, the next run finds the new one
    (the old one is not connected, so the name is looked up again) within the start
    timeout; a runtime added to the answer takes runs at the next lookup."""
    answer: list[str] = []

    async def lookup(target: str) -> list[str]:
        assert target == "dns:///runtimes.test:50052"
        return list(answer)

    monkeypatch.setattr(runtime_resolution, "resolve", lookup)
    first, second, third = [await _runtime_process(SPAWNING) for _ in range(3)]
    try:
        answer[:] = [f"ipv4:{first[1]}"]
        runtime = GrpcRuntime(["dns:///runtimes.test:50052"], 4 << 20, start_timeout_s=_WAIT_S)
        try:
            assert await _ran_on(runtime) == [first[0].pid]
            first[0].kill()
            await first[0].wait()
            answer[:] = [f"ipv4:{second[1]}"]
            assert await _ran_on(runtime) == [second[0].pid]
            assert [t.address for t in runtime._targets] == [f"ipv4:{second[1]}"]
            # A runtime added: found at the next lookup (due at once here).
            answer[:] = [f"ipv4:{second[1]}", f"ipv4:{third[1]}"]
            monkeypatch.setattr(runtime_resolution, "RESOLVE_INTERVAL_S", 0.0)
            seen: set[int] = set()
            for _ in range(40):
                seen.update(await _ran_on(runtime))
                if len(seen) == 2:
                    break
            assert seen == {second[0].pid, third[0].pid}
            assert len(runtime._multiplexers) == 2  # the first runtime's: closed, no runs left
        finally:
            await runtime.close()
    finally:
        for proc, _ in (first, second, third):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


async def test_a_name_that_resolves_to_nothing_is_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No record (or a failed lookup) is not a refusal: the run waits the start timeout for
    a runtime, then the runtime is unreachable, naming the target."""
    calls = 0

    async def lookup(target: str) -> list[str]:
        nonlocal calls
        calls += 1
        if calls % 2:
            raise OSError("Name or service not known")
        return []

    monkeypatch.setattr(runtime_resolution, "resolve", lookup)
    runtime = GrpcRuntime(["dns:///nowhere.test:50052"], 4 << 20, start_timeout_s=1.5)
    try:
        spec = RunSpec("return 1", "", (), b"t", _WAIT_S)
        with pytest.raises(RuntimeUnreachable, match=re.escape("dns:///nowhere.test:50052")):
            await asyncio.wait_for(runtime.open_run(spec), _WAIT_S)
        assert calls >= 2  # looked up again while it waited
    finally:
        await runtime.close()


async def test_a_runtime_that_leaves_the_answer_finishes_its_runs_then_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Of two runtimes behind a name, the one holding a run leaves the name's answer: it takes
    no new run, the run it holds still completes on its stream, and its stream and channel
    close at the first use after that run has ended."""
    answer: list[str] = []

    async def lookup(target: str) -> list[str]:
        return list(answer)

    monkeypatch.setattr(runtime_resolution, "resolve", lookup)
    launched = [await _runtime_process(SPAWNING) for _ in range(2)]
    try:
        answer[:] = [f"ipv4:{address}" for _, address in launched]
        runtime = GrpcRuntime(["dns:///runtimes.test:50052"], 4 << 20, start_timeout_s=_WAIT_S)
        try:
            spec = RunSpec("return await tools.hold({})", "", ("hold",), b"t", _WAIT_S)
            held = await runtime.open_run(spec)
            assert isinstance(held, MuxRunStream)
            events = held.events()
            call = await asyncio.wait_for(anext(events), _WAIT_S)
            assert isinstance(call, BindingCall)
            (holder,) = [
                t for t, m in runtime._multiplexers.items() if m._stream is held._run._stream
            ]
            answer.remove(holder.address)
            monkeypatch.setattr(runtime_resolution, "RESOLVE_INTERVAL_S", 0.0)
            for _ in range(40):  # the lookup is applied in the background
                await _ran_on(runtime)
                if holder not in runtime._targets:
                    break
            assert [t.address for t in runtime._targets] == answer
            assert holder in runtime._draining and not runtime._multiplexers[holder].idle()
            held.reply(call.call_id, True, '"still served"')
            terminal = await asyncio.wait_for(anext(events), _WAIT_S)
            assert isinstance(terminal, RunTerminal) and terminal.value_json == '"still served"'
            await held.close()
            await _ran_on(runtime)
            assert holder not in runtime._multiplexers and runtime._draining == []
            assert holder.channel.get_state() is grpc.ChannelConnectivity.SHUTDOWN
        finally:
            await runtime.close()
    finally:
        for proc, _ in launched:
            proc.kill()
            await proc.wait()
