"""The Cordis tools and the dynamic tools they create, reached from `run_code` programs on a real
runtime (worker processes): the seven tools are SDK bindings of a `code` agent; a dynamic tool is
a binding of the *next* run; one unregistered after enumeration fails as an unknown tool."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.config import RegistrySettings
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.registry.conftest import CODE
from tests.registry.cordis.conftest import CLOCK, CordisHarness
from tests.registry.cordis.hosts import InProcessHosts


@contextlib.asynccontextmanager
async def _stack() -> AsyncIterator[CordisHarness]:
    runtime = await start_runtime(RuntimeSettings(listen="127.0.0.1:0", pool_size=2))
    config = RegistrySettings(
        listen="127.0.0.1:0", history_path=":memory:", runtime_targets=[runtime.address]
    )
    hosts = InProcessHosts()
    registry = await start_registry(config, build_registry(config, plugin_hosts=hosts))
    channel = grpc.aio.insecure_channel(registry.address)
    harness = CordisHarness(registry, channel)
    harness.hosts = hosts
    try:
        yield harness
    finally:
        await channel.close()
        await registry.stop(0)
        await runtime.stop(0)


@pytest.fixture
async def stack() -> AsyncIterator[CordisHarness]:
    async with _stack() as s:
        yield s


async def _program(h: CordisHarness, agent: str, code: str, call_id: str) -> Any:
    result = await h.call(agent, "run_code", {"code": code, "description": "cordis"}, call_id)
    assert not result.is_error, result.error.message
    return jsonvalue.loads(result.value_json)


async def test_a_program_defines_runs_and_a_later_program_calls_the_tool(
    stack: CordisHarness,
) -> None:
    agent = await stack.agent("coder", mode=CODE)
    define = (
        f"host = {CLOCK!r}\n"
        "d = await tools.cordis_define({'plugin': {'kind': 'new', 'idPrefix': 'clock'},"
        " 'name': 'Clock', 'purpose': 'Tell the time.', 'code': {'host': host}})\n"
        "r = await tools.cordis_run({'pluginId': d['pluginId'], 'packageId': d['packageId'],"
        " 'mode': 'run'})\n"
        "try:\n"
        "    await tools.clock_now({})\n"
        "except AttributeError:\n"
        "    print('not a binding of this run')\n"
        "return [r['status'], r['pluginRunId']]"
    )
    first = await _program(stack, agent, define, "p1")
    assert first == {"logs": ["not a binding of this run"], "result": ["running", "run-1"]}
    # The next assembly and the next run see it.
    sdk = await stack.stub.GetSdk(ppb.GetSdkRequest(scope=agent))
    assert "    async def clock_now(self, args: " in sdk.text
    second = await _program(stack, agent, "return await tools.clock_now({'a': 1})", "p2")
    assert second == {"logs": [], "result": {"time": "12:00", "args": {"a": 1}}}
    # Nested records: the dynamic tool's call is a code-dispatch like any nested call.
    history = await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, call_id="p2"))
    kinds = [(r.kind, r.tool_name) for r in history.records]
    assert ("tool/code-dispatch-start", "clock_now") in kinds
    assert ("tool/code-dispatch", "clock_now") in kinds


async def test_a_tool_stopped_after_enumeration_is_an_unknown_tool(stack: CordisHarness) -> None:
    agent = await stack.agent("coder", mode=CODE)
    await stack.ok(
        agent,
        "run_code",
        {
            "code": (
                f"d = await tools.cordis_define({{'plugin': {{'kind': 'new', 'idPrefix': 'clock'}},"
                f" 'name': 'Clock', 'purpose': 'p', 'code': {{'host': {CLOCK!r}}}}})\n"
                "await tools.cordis_run("
                "{'pluginId': 'clock-1', 'packageId': 'pkg-1', 'mode': 'run'})"
            ),
            "description": "setup",
        },
        "setup",
    )
    program = (
        "await tools.cordis_stop({'pluginId': 'clock-1'})\n"
        "try:\n"
        "    await tools.clock_now({})\n"
        "except Exception as e:\n"
        "    print(str(e))\n"
        "return 'done'"
    )
    out = await _program(stack, agent, program, "p3")
    assert out["result"] == "done"
    assert len(out["logs"]) == 1 and 'unknown tool "clock_now"' in out["logs"][0]
    assert stack.hosts is not None and "now" not in stack.hosts.probe.seen  # body never ran
