"""The compute budget of a plugin host between invocations (``BACKGROUND_CPU_SHARE``): timers
and tasks a plugin starts may keep it busy for a share of one CPU, in bursts of up to its
compute budget; a loop in the background ends the host as a busy invocation does, and what
the invocations themselves used is never charged to the background."""

from __future__ import annotations

import grpc
import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from tests.runtime.conftest import child_pids
from tests.runtime.test_plugin_host import HostStream, stub

__all__ = ["stub"]  # the fixture, shared with test_plugin_host

BUDGET = runtime_pb2.RunBudgets(compute_ms=300)
LOST = (
    "its background work (timers, tasks) was busy past its compute budget (300ms beyond 10% of "
    "a CPU); the plugin host was stopped"
)

TOOLS = """
import time

async def fine(args):
    return "fine"

def burn(args):
    # 200 ms of busy CPU: under the per-call budget, and over the background credit once
    # two calls have run, if their CPU were (wrongly) charged to the background.
    began = time.process_time()
    while time.process_time() - began < 0.2:
        pass
    return "burnt"

def tools():
    harness.register_tool(harness.define_tool(name="fine", description="d", execute=fine))
    harness.register_tool(harness.define_tool(name="burn", description="d", execute=burn))
"""


async def _lost(host: HostStream) -> runtime_pb2.HostFailure:
    message = await host.next_not_log()
    assert message.WhichOneof("kind") == "lost", message
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []  # the host's processes are gone before the last word
    return message.lost


# The loops start from a tool call that returns at once: the start is over by then (a loop
# during the start is the start timeout's), and the call's own CPU is not what runs out.
LOOPS = {
    "timer": (
        "def p(ctx):\n"
        "    tools()\n"
        "    def arm(args):\n"
        "        ctx.timer.timeout(spin, 0)\n"
        "        return 'armed'\n"
        "    harness.register_tool(harness.define_tool(name='arm', description='d', execute=arm))\n"
        "p.inject = ['timer']\n"
    ),
    "task": (
        "import asyncio\n"
        "async def spin_later():\n"
        "    await asyncio.sleep(0)\n"
        "    spin()\n"
        "def p(ctx):\n"
        "    tools()\n"
        "    def arm(args):\n"
        "        asyncio.ensure_future(spin_later())\n"
        "        return 'armed'\n"
        "    harness.register_tool(harness.define_tool(name='arm', description='d', execute=arm))\n"
    ),
}


@pytest.mark.parametrize("started_by", sorted(LOOPS))
async def test_background_work_that_loops_ends_the_plugin_host(
    stub: runtime_pb2_grpc.RuntimeServiceStub, started_by: str
) -> None:
    source = TOOLS + "def spin():\n    while True:\n        pass\n" + LOOPS[started_by]
    host = HostStream(stub)
    started = await host.start(source + "return p", budgets=BUDGET)
    assert started.WhichOneof("kind") == "started", started
    await host.invoke(1, "arm", {})
    armed = await host.next_not_log()
    assert armed.result.value_json == '"armed"', armed
    lost = await _lost(host)
    assert lost.message == LOST


async def test_light_periodic_work_and_busy_invocations_do_not_spend_the_background_credit(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    source = TOOLS + (
        "def p(ctx):\n"
        "    tools()\n"
        "    ctx.timer.interval(lambda: print('tick'), 10)\n"
        "p.inject = ['timer']\n"
        "return p"
    )
    host = HostStream(stub)
    assert (await host.start(source, budgets=BUDGET)).WhichOneof("kind") == "started"
    # Three calls of 200 ms busy each (600 ms: twice the credit) with ticks in between.
    for invocation in (1, 2, 3):
        await host.invoke(invocation, "burn", {})
        while (message := await host.next()).WhichOneof("kind") == "log":
            pass
        assert message.result.invocation_id == invocation
        assert message.result.value_json == '"burnt"', message
        ticks = len([text for text in host.logs() if text.endswith("tick\n")])
        while len([text for text in host.logs() if text.endswith("tick\n")]) < ticks + 5:
            assert (await host.next()).WhichOneof("kind") == "log"
    await host.invoke(4, "fine", {})
    while (message := await host.next()).WhichOneof("kind") == "log":
        pass
    assert message.result.value_json == '"fine"', message  # still alive
    await host.call.write(runtime_pb2.HostRequest(retract=runtime_pb2.HostRetract()))
    assert (await host.next_not_log()).WhichOneof("kind") == "retracted"
