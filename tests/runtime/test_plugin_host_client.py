"""The registry's `PluginHosts` adapter against a real runtime: activation, a dynamic tool's
calls, cancellation, changes, retract, and a host lost after its start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.plugin_hosts import (
    ActivationFailed,
    ActivationSpec,
    HostEvents,
    HostRegistrations,
)
from registry_service.domain.signals import AbortController, never
from registry_service.plugin_host_client import GrpcPluginHosts
from registry_service.runtime_client import GrpcRuntime
from tests.runtime.conftest import child_pids, grpc_settings, serving

SOURCE = """
import asyncio
def plugin(ctx):
    async def wait(args):
        await asyncio.sleep(3600)
    def add(args):
        return {"sum": args["a"] + args["b"]}
    def grow(args):
        harness.register_tool(harness.define_tool(name="later", execute=lambda a: "late"))
        return "grown"
    harness.register_tool(harness.define_tool(
        name="add", description="adds",
        parameters={"type": "object", "properties": {"a": {"type": "integer"}}},
        output_schema={"type": "object"}, execute=add))
    harness.register_tool(harness.define_tool(name="wait", execute=wait))
    harness.register_tool(harness.define_tool(name="grow", execute=grow))
    die = harness.define_tool(name="die", execute=lambda a: __import__("os")._exit(1))
    harness.register_tool(die)
    print("up")
return plugin
"""


def spec(source: str = SOURCE) -> ActivationSpec:
    return ActivationSpec(
        owner="agent-a",
        plugin_id="calc-1",
        package_id="pkg-2",
        run_id="run-3",
        language="python",
        source=source,
        visible_tools=(("search", {"type": "object"}),),
    )


@pytest.fixture
async def hosts() -> AsyncIterator[GrpcPluginHosts]:
    async with serving(grpc_settings(pool_size=0)) as running:
        runtime = GrpcRuntime([running.address], 16 << 20)
        try:
            yield GrpcPluginHosts(runtime)
        finally:
            await runtime.close()


async def test_an_activation_serves_its_tools_and_retracts_quiescent(
    hosts: GrpcPluginHosts,
) -> None:
    changes: list[HostRegistrations] = []
    changed = asyncio.Event()
    logs: list[str] = []

    def on_change(registrations: HostRegistrations) -> None:
        changes.append(registrations)
        changed.set()

    events = HostEvents(on_change=on_change, on_log=lambda _s, text: logs.append(text))
    active = await hosts.activate(spec(), events)
    names = [tool.name for tool in active.registrations.tools]
    assert names == ["add", "wait", "grow", "die"]
    (add,) = [tool for tool in active.registrations.tools if tool.name == "add"]
    assert add.output_schema == {"type": "object"}
    assert "[cordis:calc-1] up\n" in logs

    assert await active.call_tool("add", {"a": 2, "b": 3}, never()) == {"sum": 5}
    with pytest.raises(ToolCallFailure, match="has no tool"):
        await active.call_tool("nope", {}, never())

    controller = AbortController()
    waiting = asyncio.ensure_future(active.call_tool("wait", {}, controller.signal))
    await asyncio.sleep(0.2)
    controller.abort("the caller went away")
    with pytest.raises(ToolCallFailure, match="cancelled"):
        await waiting

    assert await active.call_tool("grow", {}, never()) == "grown"
    await changed.wait()
    assert [tool.name for tool in changes[-1].tools][-1] == "later"
    assert active.registrations is changes[-1]

    await active.retract()
    assert child_pids() == []
    with pytest.raises(ToolCallFailure, match="not running"):
        await active.call_tool("add", {"a": 1, "b": 1}, never())


async def test_a_failing_host_half_raises_activation_failed_with_its_phase(
    hosts: GrpcPluginHosts,
) -> None:
    with pytest.raises(ActivationFailed) as load:
        await hosts.activate(spec("x = 1"), HostEvents())
    assert load.value.phase == "host-load"
    assert "did you forget `return`" in load.value.message
    with pytest.raises(ActivationFailed) as apply:
        await hosts.activate(spec("def p(ctx):\n    1 / 0\nreturn p"), HostEvents())
    assert apply.value.phase == "host-apply"
    assert "ZeroDivisionError" in apply.value.stack
    assert child_pids() == []


async def test_a_host_that_dies_is_reported_lost_and_its_calls_fail(
    hosts: GrpcPluginHosts,
) -> None:
    lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_lost(why: str) -> None:
        if not lost.done():
            lost.set_result(why)

    events = HostEvents(on_lost=on_lost)
    active = await hosts.activate(spec(), events)
    with pytest.raises(ToolCallFailure):
        await active.call_tool("die", {}, never())
    assert await lost == "the plugin host exited (status 1)"
    await active.retract()  # safe after the loss
    assert child_pids() == []
