"""Cordis plugin hosts through ``RuntimeService.Host``: a host half in a real sandboxed worker,
from start to retract (reference §9.3, §9.4, §9.6; design/cordis.md)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from tests.runtime.conftest import can_isolate, child_pids, connected, grpc_settings, serving

THIS_FILE = os.path.realpath(__file__)  # the runtime's tree: not in any sandbox
CLOCK = """
def plugin(ctx):
    async def now(args):
        return {"echo": args, "tools": [t["name"] for t in ctx.tools.schemas()]}
    harness.register_tool(harness.define_tool(
        name="clock_now", description="the time, or an echo",
        parameters={"type": "object", "properties": {"x": {"type": "integer"}}},
        execute=now,
    ))
    ctx.effect(lambda: (lambda: print("effect one disposed")))
    ctx.effect(lambda: (lambda: print("effect two disposed")))
    print("started")
return plugin
"""


class HostStream:
    """One Host stream: send requests, read responses in order."""

    def __init__(self, stub: runtime_pb2_grpc.RuntimeServiceStub) -> None:
        self.call = stub.Host()
        self.seen: list[runtime_pb2.HostResponse] = []

    async def start(self, source: str, **fields: Any) -> runtime_pb2.HostResponse:
        start = runtime_pb2.HostStart(
            source=source, plugin_id="clock-1", package_id="pkg-2", run_id="run-3", **fields
        )
        await self.call.write(runtime_pb2.HostRequest(start=start))
        return await self.next_not_log()

    async def next(self) -> runtime_pb2.HostResponse:
        message: runtime_pb2.HostResponse = await self.call.read()
        assert message is not grpc.aio.EOF, "the stream ended"
        self.seen.append(message)
        return message

    async def next_not_log(self) -> runtime_pb2.HostResponse:
        while (message := await self.next()).WhichOneof("kind") == "log":
            pass
        return message

    async def invoke(self, invocation: int, name: str, args: object) -> None:
        request = runtime_pb2.HostInvoke(
            invocation_id=invocation, tool_name=name, arguments_json=json.dumps(args)
        )
        await self.call.write(runtime_pb2.HostRequest(invoke=request))

    def logs(self) -> list[str]:
        return [m.log.text for m in self.seen if m.WhichOneof("kind") == "log"]


@pytest.fixture
async def stub() -> AsyncIterator[runtime_pb2_grpc.RuntimeServiceStub]:
    async with serving(grpc_settings(pool_size=0)) as running, connected(running) as client:
        yield client


async def test_a_host_half_registers_a_tool_serves_it_and_retracts_in_reverse_order(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    host = HostStream(stub)
    visible = [{"name": "search", "description": "d", "inputSchema": {"type": "object"}}]
    started = await host.start(CLOCK, visible_tools_json=json.dumps(visible))
    assert started.WhichOneof("kind") == "started", started
    (tool,) = started.started.tools
    assert tool.name == "clock_now"
    assert json.loads(tool.input_schema_json)["properties"] == {"x": {"type": "integer"}}
    assert "[cordis:clock-1] started\n" in host.logs()

    await host.invoke(1, "clock_now", {"x": 12345678901234567890})
    result = await host.next_not_log()
    assert result.result.invocation_id == 1
    assert json.loads(result.result.value_json) == {
        "echo": {"x": 12345678901234567890},  # beyond 2**64: exact
        "tools": ["search"],
    }

    await host.invoke(2, "no_such_tool", {})
    missing = await host.next_not_log()
    assert missing.result.error_message == 'the plugin has no tool "no_such_tool"'

    await host.call.write(runtime_pb2.HostRequest(retract=runtime_pb2.HostRetract()))
    retracted = await host.next_not_log()
    assert retracted.WhichOneof("kind") == "retracted"
    disposals = [text for text in host.logs() if "disposed" in text]
    assert disposals == [
        "[cordis:clock-1] effect two disposed\n",
        "[cordis:clock-1] effect one disposed\n",
    ]
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []  # the plugin host's processes are gone before the stream ends


@pytest.mark.parametrize(
    ("source", "phase", "text"),
    [
        ("x = 1", "host-load", "the Host half returned `None` -- did you forget `return`?"),
        ("return 42", "host-load", "the Host half must return a Plugin function or an object"),
        ("return (", "host-load", "SyntaxError"),
        ("raise ValueError('boom at load')", "host-load", "boom at load"),
        ("def p(ctx):\n    raise RuntimeError('boom at start')\nreturn p", "host-apply", "boom"),
        (
            "def p(ctx):\n    harness.register_tool({'name': 'forged'})\nreturn p",
            "host-apply",
            "dynamic tool registration must use a tool returned by harness.define_tool(...)",
        ),
        (
            "def p(ctx):\n    ctx.anything = 1\nreturn p",
            "host-apply",
            'sandbox ctx is read-only; cannot assign "anything"',
        ),
        (
            "def p(ctx):\n    ctx.network\nreturn p",
            "host-apply",
            'sandbox ctx does not expose "network"',
        ),
        (
            "def p(ctx):\n    ctx.timer\nreturn p",
            "host-apply",
            'service "timer" is not injected',
        ),
    ],
)
async def test_a_host_half_that_is_no_plugin_fails_with_its_phase_and_leaves_nothing(
    stub: runtime_pb2_grpc.RuntimeServiceStub, source: str, phase: str, text: str
) -> None:
    host = HostStream(stub)
    failed = await host.start(source)
    assert failed.WhichOneof("kind") == "failed", failed
    assert failed.failed.phase == phase
    assert text in failed.failed.message, failed.failed.message
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []


async def test_a_start_that_never_ends_is_bounded_by_the_start_timeout(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    host = HostStream(stub)
    source = "import asyncio\ndef p(ctx):\n    return asyncio.sleep(3600)\nreturn p"
    failed = await host.start(source, start_timeout=Duration(nanos=300_000_000))
    assert failed.failed.phase == "host-apply"
    assert failed.failed.message == "the Plugin did not start within 0.3 s"


async def test_a_plugin_injecting_a_service_nobody_provides_parks_waiting(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    source = "def p(ctx):\n    raise AssertionError('must not start')\np.inject = ['db']\nreturn p"
    host = HostStream(stub)
    started = await host.start(source)
    assert started.WhichOneof("kind") == "started"
    assert list(started.started.waiting_for) == ["db"]
    assert list(started.started.tools) == []


async def test_timers_run_while_active_and_stop_with_the_retract(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    source = (
        "def p(ctx):\n"
        "    ctx.timer.interval(lambda: print('tick'), 10)\n"
        "    ctx.effect(lambda: (lambda: print('bye')))\n"
        "p.inject = ['timer']\n"
        "return p"
    )
    host = HostStream(stub)
    assert (await host.start(source)).WhichOneof("kind") == "started"
    while (await host.next()).log.text != "[cordis:clock-1] tick\n":
        pass
    await host.call.write(runtime_pb2.HostRequest(retract=runtime_pb2.HostRetract()))
    assert (await host.next_not_log()).WhichOneof("kind") == "retracted"
    logs = host.logs()
    assert logs[-1] == "[cordis:clock-1] bye\n"  # disposers ran after the last tick
    assert await host.call.read() is grpc.aio.EOF


async def test_an_invocation_is_cancelled_and_a_failing_tool_reports_its_message(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    source = (
        "import asyncio\n"
        "def p(ctx):\n"
        "    async def slow(args):\n"
        "        await asyncio.sleep(3600)\n"
        "    def bad(args):\n"
        "        raise ValueError('the plugin refused')\n"
        "    def lossy(args):\n"
        "        return {1, 2}\n"
        "    for name, fn in [('slow', slow), ('bad', bad), ('lossy', lossy)]:\n"
        "        harness.register_tool(harness.define_tool(name=name, execute=fn))\n"
        "return p"
    )
    host = HostStream(stub)
    assert (await host.start(source)).WhichOneof("kind") == "started"
    await host.invoke(1, "slow", {})
    await host.invoke(2, "bad", {})
    bad = await host.next_not_log()
    assert (bad.result.invocation_id, bad.result.error_message) == (2, "the plugin refused")
    await host.call.write(runtime_pb2.HostRequest(cancel=runtime_pb2.HostCancel(invocation_id=1)))
    slow = await host.next_not_log()
    assert (slow.result.invocation_id, slow.result.error_message) == (1, "the call was cancelled")
    await host.invoke(3, "lossy", {})
    lossy = await host.next_not_log()
    assert lossy.result.error_message.startswith('the result of tool "lossy" must be lossless')


async def test_closing_the_stream_retracts_and_kills_everything_the_plugin_started(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    source = (
        "import os, time\n"
        "def p(ctx):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid = None\n"
        "        while True: time.sleep(1)\n"
        "return p"
    )
    host = HostStream(stub)
    assert (await host.start(source)).WhichOneof("kind") == "started"
    assert child_pids() != []
    host.call.cancel()
    for _ in range(200):  # the runtime reaps it right after it sees the cancel
        if child_pids() == []:
            break
        await asyncio.sleep(0.05)
    assert child_pids() == []


async def test_a_plugin_host_that_dies_after_its_start_is_reported_lost(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    source = (
        "import os\n"
        "def p(ctx):\n"
        "    die = harness.define_tool(name='die', execute=lambda a: os._exit(3))\n"
        "    harness.register_tool(die)\n"
        "return p"
    )
    host = HostStream(stub)
    assert (await host.start(source)).WhichOneof("kind") == "started"
    await host.invoke(7, "die", {})
    first = await host.next_not_log()
    assert first.result.invocation_id == 7
    assert first.result.error_message == "the plugin host ended before the call did"
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost"
    assert lost.lost.phase == "host-lost"


async def test_bad_host_input_is_refused_with_canonical_codes(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    call = stub.Host()
    await call.write(runtime_pb2.HostRequest(retract=runtime_pb2.HostRetract()))
    with pytest.raises(grpc.aio.AioRpcError) as first:
        await call.read()
    assert first.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be a start message" in (first.value.details() or "")

    # Plugin hosts are Python only, also where TypeScript programs are served.
    for unsupported in ("cobol", "typescript"):
        call = stub.Host()
        start = runtime_pb2.HostStart(source="return 1", language=unsupported)
        await call.write(runtime_pb2.HostRequest(start=start))
        with pytest.raises(grpc.aio.AioRpcError) as language:
            await call.read()
        assert language.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unsupported language" in (language.value.details() or "")


async def test_a_plugin_over_its_memory_budget_is_lost_and_the_runtime_stays_healthy(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    source = (
        "def p(ctx):\n"
        "    hoard = []\n"
        "    def grow(args):\n"
        "        while True:\n"
        "            hoard.append(bytearray(8 << 20))\n"
        "    harness.register_tool(harness.define_tool(name='grow', execute=grow))\n"
        "return p"
    )
    host = HostStream(stub)
    budgets = runtime_pb2.RunBudgets(memory_bytes=96 << 20)
    assert (await host.start(source, budgets=budgets)).WhichOneof("kind") == "started"
    await host.invoke(1, "grow", {})
    failed = await host.next_not_log()
    assert failed.result.error_message == "the plugin host ended before the call did"
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost"
    assert lost.lost.message == "the plugin host exceeded its memory budget (96 MiB)"
    assert child_pids() == []
    # The runtime still serves.
    again = HostStream(stub)
    assert (await again.start(CLOCK)).WhichOneof("kind") == "started"


async def test_a_host_half_is_sandboxed_like_a_program(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    # The attack: a host half that reaches for the network, the runtime's files and other
    # processes.
    if not can_isolate():
        pytest.skip("this host cannot build the sandbox (needs root with CAP_SYS_ADMIN)")
    source = (
        "import os, socket\n"
        "def attempts():\n"
        "    out = {}\n"
        "    s = socket.socket()\n"
        "    s.settimeout(2)\n"
        "    try:\n"
        "        s.connect(('1.1.1.1', 80)); out['net'] = 'connected'\n"
        "    except OSError as e:\n"
        "        out['net'] = type(e).__name__\n"
        "    try:\n"
        f"        open({THIS_FILE!r}).read(1); out['file'] = 'read'\n"
        "    except OSError as e:\n"
        "        out['file'] = type(e).__name__\n"
        "    out['pids'] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "    out['uid'] = os.getuid()\n"
        "    return out\n"
        "def p(ctx):\n"
        "    probe = harness.define_tool(name='probe', execute=lambda a: attempts())\n"
        "    harness.register_tool(probe)\n"
        "return p"
    )
    host = HostStream(stub)
    assert (await host.start(source)).WhichOneof("kind") == "started"
    await host.invoke(1, "probe", {})
    result = json.loads((await host.next_not_log()).result.value_json)
    assert result["net"] != "connected"
    assert result["file"] != "read"
    assert result["pids"] == [1, 2]  # the host's init and itself: nothing else is visible
    assert result["uid"] >= 60000
    await host.invoke(2, "probe", {})
    again = await host.next_not_log()
    assert again.result.invocation_id == 2


LISTENING = """
def plugin(ctx):
    ctx.on("tool/result", lambda event: print("result of", event["name"]))
    ctx.once("tool/call", lambda event: print("first call", event["name"]))
    ctx.on("plugin/dispose", lambda event: print("disposing:", event["reason"]))
    ctx.effect(lambda: (lambda: print("effect disposed")))
return plugin
"""


async def test_events_reach_listeners_once_fires_once_and_dispose_precedes_disposers(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    host = HostStream(stub)
    started = await host.start(LISTENING)
    assert sorted(started.started.events) == ["plugin/dispose", "tool/call", "tool/result"]
    for invocation, (event, name) in enumerate(
        [("tool/call", "a"), ("tool/call", "b"), ("tool/result", "a")], start=1
    ):
        request = runtime_pb2.HostInvoke(
            invocation_id=invocation, event=event, arguments_json=json.dumps({"name": name})
        )
        await host.call.write(runtime_pb2.HostRequest(invoke=request))
        if invocation == 1:
            # `once` is spent before its listener runs: the plugin no longer observes
            # tool/call (the registry stops delivering it).
            changed = await host.next_not_log()
            assert sorted(changed.changed.events) == ["plugin/dispose", "tool/result"]
        delivered = await host.next_not_log()
        assert delivered.result.invocation_id == invocation
        assert delivered.result.WhichOneof("outcome") == "value_json"
    await host.call.write(runtime_pb2.HostRequest(retract=runtime_pb2.HostRetract()))
    assert (await host.next_not_log()).WhichOneof("kind") == "retracted"
    said = [text.removeprefix("[cordis:clock-1] ") for text in host.logs()]
    assert said == [
        "first call a\n",
        "result of a\n",
        "disposing: stop\n",
        "effect disposed\n",
    ]


BUSY = """
def plugin(ctx):
    def spin(args):
        while True:
            pass
    async def fine(args):
        return "fine"
    harness.register_tool(harness.define_tool(name="spin", description="d", execute=spin))
    harness.register_tool(harness.define_tool(name="fine", description="d", execute=fine))
return plugin
"""


async def test_an_invocation_past_its_compute_budget_ends_with_the_budget_text_and_the_host(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    host = HostStream(stub)
    started = await host.start(BUSY, budgets=runtime_pb2.RunBudgets(compute_ms=300))
    assert started.WhichOneof("kind") == "started", started
    await host.invoke(1, "fine", {})
    assert json.loads((await host.next_not_log()).result.value_json) == "fine"
    await host.invoke(2, "spin", {})
    result = await host.next_not_log()
    assert result.result.invocation_id == 2
    assert result.result.error_message == "compute budget exhausted (300ms busy)"
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost"
    assert lost.lost.message.startswith("a call ran past its compute budget (300ms busy)")
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []


async def test_a_parked_plugin_starts_when_its_service_appears_and_parks_when_it_goes(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    source = (
        "def p(ctx):\n"
        "    print('applied with', ctx.db['url'])\n"
        "    ctx.effect(lambda: (lambda: print('disposed')))\n"
        "p.inject = ['db']\n"
        "return p"
    )
    host = HostStream(stub)
    started = await host.start(source)
    assert list(started.started.waiting_for) == ["db"]
    db = runtime_pb2.HostService(name="db", data_json='{"url": "mem://"}')
    services = runtime_pb2.HostServices(services=[db])
    await host.call.write(runtime_pb2.HostRequest(services=services))
    running = await host.next_not_log()
    assert running.WhichOneof("kind") == "changed" and not running.changed.waiting_for
    await host.call.write(runtime_pb2.HostRequest(services=runtime_pb2.HostServices()))
    parked = await host.next_not_log()
    assert list(parked.changed.waiting_for) == ["db"]
    said = [text.removeprefix("[cordis:clock-1] ") for text in host.logs()]
    assert said == ["applied with mem://\n", "disposed\n"]


async def test_a_parked_plugin_whose_start_fails_once_unparked_ends_its_host(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    source = "def p(ctx):\n    raise RuntimeError('no schema')\np.inject = ['db']\nreturn p"
    host = HostStream(stub)
    assert list((await host.start(source)).started.waiting_for) == ["db"]
    services = runtime_pb2.HostServices(
        services=[runtime_pb2.HostService(name="db", data_json="1")]
    )
    await host.call.write(runtime_pb2.HostRequest(services=services))
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost"
    assert lost.lost.message == "its injected services appeared, but its start failed: no schema"
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []
