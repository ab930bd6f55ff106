"""The compute budget of a plugin host between invocations (``BACKGROUND_CPU_SHARE``): timers
and tasks a plugin starts may keep it busy for a share of one CPU, in bursts of up to its
compute budget; a loop in the background ends the host as a busy invocation does, and what
the invocations themselves used is never charged to the background. Both host languages, each
host half written once per language (the runtime's meter knows no language)."""

from __future__ import annotations

import grpc
import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from tests.runtime.conftest import child_pids
from tests.runtime.test_plugin_host import LANGUAGES, HostStream, host, stub

__all__ = ["host", "stub"]  # the fixtures, shared with test_plugin_host

BUDGET = runtime_pb2.RunBudgets(compute_ms=300)
LOST = (
    "its background work (timers, tasks) was busy past its compute budget (300ms beyond 10% of "
    "a CPU); the plugin host was stopped"
)

TOOLS_PY = """
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
TOOLS_TS = """
const real = (globalThis as any).process;
const fine = async () => "fine";
function burn() {
  // As the Python one: 200 ms of busy CPU.
  const began = real.cpuUsage();
  for (;;) {
    const used = real.cpuUsage(began);
    if (used.user + used.system >= 200_000) return "burnt";
  }
}
function spin() {
  while (true) {}
}
function tools() {
  harness.registerTool(harness.defineTool({ name: "fine", description: "d", execute: fine }));
  harness.registerTool(harness.defineTool({ name: "burn", description: "d", execute: burn }));
}
"""


async def _lost(host: HostStream) -> runtime_pb2.HostFailure:
    message = await host.next_not_log()
    assert message.WhichOneof("kind") == "lost", message
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []  # the host's processes are gone before the last word
    return message.lost


# The loops start from a tool call that returns at once: the start is over by then (a loop
# during the start is the start timeout's), and the call's own CPU is not what runs out.
LOOPS_PY = {
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
LOOPS_TS = {
    "timer": (
        "const p = (ctx: any) => {\n"
        "  tools();\n"
        "  const arm = () => { ctx.timer.timeout(spin, 0); return 'armed'; };\n"
        "  harness.registerTool(harness.defineTool({ name: 'arm', execute: arm }));\n"
        "};\n"
        "p.inject = ['timer'];\n"
    ),
    # The host half's own timer globals are traps; the real ones are still reachable.
    "task": (
        "const p = (ctx: unknown) => {\n"
        "  tools();\n"
        "  const arm = () => { (globalThis as any).setImmediate(spin); return 'armed'; };\n"
        "  harness.registerTool(harness.defineTool({ name: 'arm', execute: arm }));\n"
        "};\n"
    ),
}
SPIN_PY = "def spin():\n    while True:\n        pass\n"


def looping(language: str, started_by: str) -> str:
    if language == "python":
        return TOOLS_PY + SPIN_PY + LOOPS_PY[started_by] + "return p"
    return TOOLS_TS + LOOPS_TS[started_by] + "return p;"


def ticking(language: str) -> str:
    if language == "python":
        return TOOLS_PY + (
            "def p(ctx):\n"
            "    tools()\n"
            "    ctx.timer.interval(lambda: print('tick'), 10)\n"
            "p.inject = ['timer']\n"
            "return p"
        )
    return TOOLS_TS + (
        "const p = (ctx: any) => {\n"
        "  tools();\n"
        "  ctx.timer.interval(() => console.log('tick'), 10);\n"
        "};\n"
        "p.inject = ['timer'];\n"
        "return p;"
    )


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("started_by", sorted(LOOPS_PY))
async def test_background_work_that_loops_ends_the_plugin_host(
    stub: runtime_pb2_grpc.RuntimeServiceStub, language: str, started_by: str
) -> None:
    host = HostStream(stub, language)
    started = await host.start(looping(language, started_by), budgets=BUDGET)
    assert started.WhichOneof("kind") == "started", started
    await host.invoke(1, "arm", {})
    armed = await host.next_not_log()
    assert armed.result.value_json == '"armed"', armed
    lost = await _lost(host)
    assert lost.message == LOST


async def test_light_periodic_work_and_busy_invocations_do_not_spend_the_background_credit(
    host: HostStream,
) -> None:
    assert (await host.start(ticking(host.language), budgets=BUDGET)).WhichOneof(
        "kind"
    ) == "started"
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
