"""End to end with the runtime's real plugin hosts (GrpcPluginHosts over RuntimeService.Host):
a code agent's program defines and runs a plugin, a second program calls its tool, a broken
update fails and keeps `current`, stop removes the tool and the host's processes are gone.
The registry's own composition wires the adapter: configuring runtime targets is all it takes."""

from __future__ import annotations

from codemode_client.page_runner import PageRunner
from codemode_wire import jsonvalue
from tests.registry.conftest import CODE
from tests.registry.cordis.real_stack import program as _program
from tests.registry.cordis.real_stack import real_stack as _stack

HOST = """\
def now(args):
    return {"time": "12:00", "zone": args.get("zone", "utc")}

async def apply(ctx):
    harness.register_tool(harness.define_tool(
        name="clock_now", description="The time.",
        parameters={"type": "object", "properties": {"zone": {"type": "string"}}},
        execute=now))

return apply
"""
BROKEN = "async def apply(ctx):\n    raise RuntimeError('clock face missing')\n\nreturn apply\n"


async def test_define_run_call_failed_update_and_stop_on_real_plugin_hosts() -> None:
    async with _stack() as h:
        agent = await h.agent("coder", mode=CODE)
        first = await _program(
            h,
            agent,
            f"d = await tools.cordis_define({{'plugin': {{'kind': 'new', 'idPrefix': 'clock'}},"
            f" 'name': 'Clock', 'purpose': 'Tell the time.', 'code': {{'host': {HOST!r}}}}})\n"
            "r = await tools.cordis_run({'pluginId': d['pluginId'], 'packageId': d['packageId'],"
            " 'mode': 'run'})\n"
            "return r",
            "p1",
        )
        assert first["result"]["status"] == "running"
        assert first["result"]["pluginRunId"] == "run-1"
        second = await _program(h, agent, "return await tools.clock_now({'zone': 'cet'})", "p2")
        assert second["result"] == {"time": "12:00", "zone": "cet"}
        update = await _program(
            h,
            agent,
            f"d = await tools.cordis_define({{'plugin': {{'kind': 'existing', 'pluginId': "
            f"'clock-1'}}, 'name': 'Broken', 'purpose': 'p', 'code': {{'host': {BROKEN!r}}}}})\n"
            "try:\n"
            "    await tools.cordis_run({'pluginId': 'clock-1', 'packageId': d['packageId'],"
            " 'mode': 'update'})\n"
            "except Exception as e:\n"
            "    print(str(e))\n"
            "return await tools.cordis_inspect_self({'pluginId': 'clock-1'})",
            "p3",
        )
        assert "clock face missing" in update["logs"][0]
        plugin = update["result"]
        assert plugin["currentPackageId"] == "pkg-1" and plugin["nextPackageId"] == "pkg-2"
        assert "clock_now" not in await h.visible(agent)
        rollback = await _program(
            h,
            agent,
            "return await tools.cordis_run("
            "{'pluginId': 'clock-1', 'packageId': 'pkg-1', 'mode': 'run'})",
            "p3b",
        )
        assert rollback["result"]["status"] == "running"
        assert "nextPackageId" not in rollback["result"]  # rollback with run clears next
        back = await _program(
            h,
            agent,
            "a = await tools.clock_now({})\n"
            "await tools.cordis_stop({'pluginId': 'clock-1'})\n"
            "try:\n"
            "    await tools.clock_now({})\n"
            "except Exception as e:\n"
            "    print(str(e))\n"
            "return a",
            "p4",
        )
        assert back["result"] == {"time": "12:00", "zone": "utc"}
        assert 'unknown tool "clock_now"' in back["logs"][0]
        assert "clock_now" not in await h.visible(agent)


HANDLERS = """\
def greet(args):
    return {"hello": args["name"]}

async def slow(args):
    return {"sum": sum(args)}

def boom(args):
    raise ValueError("no greeting today")

async def apply(ctx):
    harness.handle("greet", greet)
    harness.handle("sum", slow)
    harness.handle("boom", boom)

return apply
"""


async def test_a_page_invokes_host_handlers_in_a_real_plugin_host() -> None:
    async with _stack() as h:
        agent = await h.agent("pages")
        await h.define(agent, HANDLERS, prefix="greet", client="return {}", name="Greeter")
        out = await h.ok(
            agent, "cordis_run", {"pluginId": "greet-1", "packageId": "pkg-1", "mode": "run"}
        )
        assert out["status"] == "awaiting-approval"
        async with PageRunner(h.channel, agent) as page:
            request = (await page.next_event("run_requested")).run_requested
            started = await page.run_host_half(request)
            assert started.accepted, started.message
            run_id = started.plugin_run_id
            assert (await page.settle(request.request_id, run_id)).accepted
            ok = await page.invoke("greet-1", run_id, "greet", {"name": "Ada"})
            assert ok.accepted and jsonvalue.loads(ok.value_json) == {"hello": "Ada"}
            summed = await page.invoke("greet-1", run_id, "sum", [1, 2, 3])
            assert jsonvalue.loads(summed.value_json) == {"sum": 6}
            failed = await page.invoke("greet-1", run_id, "boom", {})
            assert not failed.accepted and failed.code == "handler-error"
            assert failed.message == "no greeting today"
            assert "ValueError" in failed.stack and "boom" in failed.stack
            missing = await page.invoke("greet-1", run_id, "nope")
            assert not missing.accepted and missing.code == "method-not-found"
            await page.stop("greet-1")
            after = await page.invoke("greet-1", run_id, "greet", {"name": "Ada"})
            assert not after.accepted and after.code == "plugin-not-running"
