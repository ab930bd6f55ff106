"""A dynamic tool's failures name their code, in the result and in history, on real plugin hosts
of both languages: a call in flight when its plugin is stopped settles `ABORTED` (as every
cancelled call), and a tool that throws settles `TOOL_FAILED`; through `run_code`, the nested
dispatch record names the same code."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.registry.conftest import CODE
from tests.registry.cordis.conftest import CordisHarness, until
from tests.registry.cordis.real_stack import LANGUAGES
from tests.registry.cordis.real_stack import program as _program
from tests.registry.cordis.real_stack import real_stack as _stack

HOST = {
    "python": """\
import asyncio

async def hang(args):
    await asyncio.sleep(3600)

def fail(args):
    raise ValueError("the plugin refused")

async def apply(ctx):
    for name, fn in (("hang", hang), ("fail", fail)):
        harness.register_tool(harness.define_tool(name=name, description=name, execute=fn))

return apply
""",
    "typescript": """\
const hang = (_args: unknown, { signal }: { signal: AbortSignal }) =>
  new Promise((resolve) => signal.addEventListener("abort", () => resolve("late")));
const fail = () => { throw new Error("the plugin refused"); };

return async (ctx: unknown): Promise<void> => {
  for (const [name, execute] of [["hang", hang], ["fail", fail]] as const)
    harness.registerTool(harness.defineTool({ name, description: name, execute }));
};
""",
}


def _in_flight(h: CordisHarness) -> bool:
    """Whether a plugin host holds an invocation (the latch for "the call is running")."""
    assert h.runtime is not None
    return any(host._pending for host in h.runtime._hosts)


async def _activate(h: CordisHarness, agent: str, language: str) -> None:
    defined = await h.define(agent, HOST[language], prefix="codes")
    started = await h.run(agent, defined["pluginId"], defined["packageId"])
    assert not started.is_error, started.error.message


async def _dispatch_codes(h: CordisHarness, agent: str) -> dict[str, str]:
    page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
    return {r.tool_name: r.error_code for r in page.records if r.kind == "tool/code-dispatch"}


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_call_in_flight_when_its_plugin_stops_settles_aborted(language: str) -> None:
    async with _stack() as h:
        agent = await h.agent("coder", language=language)
        await _activate(h, agent, language)
        call = asyncio.ensure_future(h.call(agent, "hang", {}, "in-flight"))
        await until(lambda: _in_flight(h), "the plugin host holding the call")
        stopped = await h.call(agent, "cordis_stop", {"pluginId": "codes-1"}, "stop")
        assert not stopped.is_error, stopped.error.message
        result = await call
        assert result.is_error and result.error.code == "ABORTED", result.error.message
        assert result.error.message == "tool call aborted: the plugin was stopped"
        record = await h.settled(agent, "in-flight")
        assert record.is_error and record.error_code == "ABORTED"

        await _activate(h, agent, language)
        failed = await h.call(agent, "fail", {}, "fails")
        assert failed.is_error and failed.error.code == "TOOL_FAILED"
        assert "the plugin refused" in failed.error.message
        assert (await h.settled(agent, "fails")).error_code == "TOOL_FAILED"


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_nested_failure_is_recorded_with_its_code(language: str) -> None:
    async with _stack() as h:
        agent = await h.agent("coder", mode=CODE, language=language)
        setup = (
            f"await tools.cordis_define({{'plugin': {{'kind': 'new', 'idPrefix': 'codes'}},"
            f" 'name': 'Codes', 'purpose': 'Fail.', 'code': {{'host': {HOST[language]!r}}}}})\n"
            "return await tools.cordis_run({'pluginId': 'codes-1', 'packageId': 'pkg-1',"
            " 'mode': 'run'})"
        )
        if language == "typescript":
            setup = (
                "await tools.cordis_define({ plugin: { kind: 'new', idPrefix: 'codes' },"
                f" name: 'Codes', purpose: 'Fail.', code: {{ host: {json.dumps(HOST[language])} }}"
                " });\n"
                "return await tools.cordis_run({ pluginId: 'codes-1', packageId: 'pkg-1',"
                " mode: 'run' });"
            )
        assert (await _program(h, agent, setup, "setup"))["result"]["status"] == "running"
        caught = (
            "try:\n    await tools.fail({})\nexcept Exception as e:\n    return str(e)"
            if language == "python"
            else "try { await tools.fail({}); } catch (e) { return (e as Error).message; }"
        )
        out: Any = await _program(h, agent, caught, "nested")
        assert "the plugin refused" in out["result"]
        assert (await _dispatch_codes(h, agent))["fail"] == "TOOL_FAILED"
