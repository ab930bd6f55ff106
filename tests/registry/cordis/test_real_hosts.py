"""End to end with the runtime's real plugin hosts (GrpcPluginHosts over RuntimeService.Host):
a code agent's program defines and runs a plugin, a second program calls its tool, a broken
update fails and keeps `current`, stop removes the tool and the host's processes are gone.
The registry's own composition wires the adapter: configuring runtime targets is all it takes.

Both host languages: an agent's program language is also its host halves' language, so each
test is written once per language (the host half and the programs that define and call it)."""

from __future__ import annotations

import json

import pytest

from codemode_client.page_runner import PageRunner
from codemode_wire import jsonvalue
from tests.registry.conftest import CODE
from tests.registry.cordis.real_stack import LANGUAGES
from tests.registry.cordis.real_stack import program as _program
from tests.registry.cordis.real_stack import real_stack as _stack

HOST = {
    "python": """\
def now(args):
    return {"time": "12:00", "zone": args.get("zone", "utc")}

async def apply(ctx):
    harness.register_tool(harness.define_tool(
        name="clock_now", description="The time.",
        parameters={"type": "object", "properties": {"zone": {"type": "string"}}},
        execute=now))

return apply
""",
    "typescript": """\
function now(args: { zone?: string }) {
  return { time: "12:00", zone: args.zone ?? "utc" };
}

return async (ctx: unknown): Promise<void> => {
  harness.registerTool(harness.defineTool({
    name: "clock_now", description: "The time.",
    parameters: { type: "object", properties: { zone: { type: "string" } } },
    execute: now,
  }));
};
""",
}
BROKEN = {
    "python": (
        "async def apply(ctx):\n    raise RuntimeError('clock face missing')\n\nreturn apply\n"
    ),
    "typescript": (
        "return async (ctx: unknown) => {\n  throw new Error('clock face missing');\n};\n"
    ),
}


def programs(language: str) -> dict[str, str]:
    """The agent's programs, in its language."""
    if language == "python":
        host, broken = repr(HOST[language]), repr(BROKEN[language])
        return {
            "define-run": (
                "d = await tools.cordis_define({'plugin': {'kind': 'new', 'idPrefix': 'clock'},"
                f" 'name': 'Clock', 'purpose': 'Tell the time.', 'code': {{'host': {host}}}}})\n"
                "r = await tools.cordis_run({'pluginId': d['pluginId'],"
                " 'packageId': d['packageId'], 'mode': 'run'})\n"
                "return r"
            ),
            "call": "return await tools.clock_now({'zone': 'cet'})",
            "update": (
                "d = await tools.cordis_define({'plugin': {'kind': 'existing', 'pluginId': "
                f"'clock-1'}}, 'name': 'Broken', 'purpose': 'p', 'code': {{'host': {broken}}}}})\n"
                "try:\n"
                "    await tools.cordis_run({'pluginId': 'clock-1', 'packageId': d['packageId'],"
                " 'mode': 'update'})\n"
                "except Exception as e:\n"
                "    print(str(e))\n"
                "return await tools.cordis_inspect_self({'pluginId': 'clock-1'})"
            ),
            "rollback": (
                "return await tools.cordis_run("
                "{'pluginId': 'clock-1', 'packageId': 'pkg-1', 'mode': 'run'})"
            ),
            "stop": (
                "a = await tools.clock_now({})\n"
                "await tools.cordis_stop({'pluginId': 'clock-1'})\n"
                "try:\n"
                "    await tools.clock_now({})\n"
                "except Exception as e:\n"
                "    print(str(e))\n"
                "return a"
            ),
        }
    host, broken = json.dumps(HOST[language]), json.dumps(BROKEN[language])
    return {
        "define-run": (
            "const d = await tools.cordis_define({ plugin: { kind: 'new', idPrefix: 'clock' },"
            f" name: 'Clock', purpose: 'Tell the time.', code: {{ host: {host} }} }});\n"
            "return await tools.cordis_run({ pluginId: d.pluginId, packageId: d.packageId,"
            " mode: 'run' });"
        ),
        "call": "return await tools.clock_now({ zone: 'cet' });",
        "update": (
            "const d = await tools.cordis_define({ plugin: { kind: 'existing', pluginId: "
            f"'clock-1' }}, name: 'Broken', purpose: 'p', code: {{ host: {broken} }} }});\n"
            "try {\n"
            "  await tools.cordis_run({ pluginId: 'clock-1', packageId: d.packageId,"
            " mode: 'update' });\n"
            "} catch (e) {\n"
            "  console.log((e as Error).message);\n"
            "}\n"
            "return await tools.cordis_inspect_self({ pluginId: 'clock-1' });"
        ),
        "rollback": (
            "return await tools.cordis_run("
            "{ pluginId: 'clock-1', packageId: 'pkg-1', mode: 'run' });"
        ),
        "stop": (
            "const a = await tools.clock_now({});\n"
            "await tools.cordis_stop({ pluginId: 'clock-1' });\n"
            "try {\n"
            "  await tools.clock_now({});\n"
            "} catch (e) {\n"
            "  console.log((e as Error).message);\n"
            "}\n"
            "return a;"
        ),
    }


@pytest.mark.parametrize("language", LANGUAGES)
async def test_define_run_call_failed_update_and_stop_on_real_plugin_hosts(language: str) -> None:
    code = programs(language)
    async with _stack() as h:
        agent = await h.agent("coder", mode=CODE, language=language)
        first = await _program(h, agent, code["define-run"], "p1")
        assert first["result"]["status"] == "running"
        assert first["result"]["pluginRunId"] == "run-1"
        second = await _program(h, agent, code["call"], "p2")
        assert second["result"] == {"time": "12:00", "zone": "cet"}
        update = await _program(h, agent, code["update"], "p3")
        assert "clock face missing" in update["logs"][0]
        plugin = update["result"]
        assert plugin["currentPackageId"] == "pkg-1" and plugin["nextPackageId"] == "pkg-2"
        assert "clock_now" not in await h.visible(agent)
        rollback = await _program(h, agent, code["rollback"], "p3b")
        assert rollback["result"]["status"] == "running"
        assert "nextPackageId" not in rollback["result"]  # rollback with run clears next
        back = await _program(h, agent, code["stop"], "p4")
        assert back["result"] == {"time": "12:00", "zone": "utc"}
        assert 'unknown tool "clock_now"' in back["logs"][0]
        assert "clock_now" not in await h.visible(agent)


HANDLERS = {
    "python": """\
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
""",
    "typescript": """\
function greet(args: { name: string }) {
  return { hello: args.name };
}

async function slow(args: number[]) {
  return { sum: args.reduce((a, b) => a + b, 0) };
}

function boom(): never {
  throw new RangeError("no greeting today");
}

return async (ctx: unknown) => {
  harness.handle("greet", greet);
  harness.handle("sum", slow);
  harness.handle("boom", boom);
};
""",
}
ERROR_CLASS = {"python": "ValueError", "typescript": "RangeError"}


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_page_invokes_host_handlers_in_a_real_plugin_host(language: str) -> None:
    async with _stack() as h:
        agent = await h.agent("pages", language=language)
        await h.define(
            agent, HANDLERS[language], prefix="greet", client="return {}", name="Greeter"
        )
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
            assert ERROR_CLASS[language] in failed.stack and "boom" in failed.stack
            missing = await page.invoke("greet-1", run_id, "nope")
            assert not missing.accepted and missing.code == "method-not-found"
            await page.stop("greet-1")
            after = await page.invoke("greet-1", run_id, "greet", {"name": "Ada"})
            assert not after.accepted and after.code == "plugin-not-running"
