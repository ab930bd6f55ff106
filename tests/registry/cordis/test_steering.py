"""Steering (`agent/steer`) and inject (`agent/inject`) records: durable history records the
registry writes for what the agent could not see in a tool result, delivered by WatchHistory
and typed by the Python client (`watch_agent_messages`). The TypeScript client's half of this
is clients/typescript/test/cordis-steering.test.ts."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import pytest

from codemode_client import AgentMessage, RegistryClient, agent_message
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.jsonvalue import JsonValue
from registry_service.config import RegistrySettings
from registry_service.domain.cordis.steering import INSPECT_DIRECTION
from registry_service.domain.records import AGENT_INJECT, AGENT_STEER
from registry_service.domain.signals import AbortSignal
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.registry.cordis.conftest import CordisHarness, until
from tests.registry.cordis.hosts import InProcessHosts
from tests.registry.cordis.real_stack import LANGUAGES

# A host half whose tool kills its own plugin host (after a successful activation).
DYING_PY = """\
import os

def die(args):
    os._exit(3)

async def apply(ctx):
    harness.register_tool(harness.define_tool(
        name="doomed", description="Kills its plugin host.",
        parameters={"type": "object"}, execute=die))

return apply
"""
DYING_TS = """\
const die = () => (globalThis as any).process.reallyExit(3);

return async (ctx: unknown) => {
  harness.registerTool(harness.defineTool({
    name: "doomed", description: "Kills its plugin host.",
    parameters: { type: "object" }, execute: die,
  }));
};
"""
# The three programs of the test, in the agent's language.
DOOMED_PROGRAMS = {
    "python": (
        f"d = await tools.cordis_define({{'plugin': {{'kind': 'new', 'idPrefix': 'doom'}},"
        f" 'name': 'Doom', 'purpose': 'Die.', 'code': {{'host': {DYING_PY!r}}}}})\n"
        "return await tools.cordis_run({'pluginId': d['pluginId'],"
        " 'packageId': d['packageId'], 'mode': 'run'})",
        "try:\n    await tools.doomed({})\nexcept Exception as e:\n    print(str(e))\n",
        "try:\n    await tools.doomed({})\nexcept Exception as e:\n    print(str(e))\n"
        "return await tools.cordis_inspect_self({'pluginId': 'doom-1'})",
    ),
    "typescript": (
        "const d = await tools.cordis_define({ plugin: { kind: 'new', idPrefix: 'doom' },"
        f" name: 'Doom', purpose: 'Die.', code: {{ host: {json.dumps(DYING_TS)} }} }});\n"
        "return await tools.cordis_run({ pluginId: d.pluginId, packageId: d.packageId,"
        " mode: 'run' });",
        "try { await tools.doomed({}); } catch (e) { console.log((e as Error).message); }",
        "try { await tools.doomed({}); } catch (e) { console.log((e as Error).message); }\n"
        "return await tools.cordis_inspect_self({ pluginId: 'doom-1' });",
    ),
}
# How each language says that a program has no such binding (the same words in both).
NO_BINDING = {"python": "no binding 'doomed'", "typescript": "no binding 'doomed'"}


@contextlib.asynccontextmanager
async def _real_stack() -> AsyncIterator[RegistryClient]:
    runtime = await start_runtime(
        RuntimeSettings(listen="127.0.0.1:0", pool_size=1, shutdown_grace_s=0.2)
    )
    config = RegistrySettings(
        listen="127.0.0.1:0",
        history_path=":memory:",
        runtime_targets=[runtime.address],
        runtime_languages=list(runtime.runtime.languages),
    )
    registry = await start_registry(config, build_registry(config))
    client = RegistryClient(registry.address)
    try:
        yield client
    finally:
        await client.close()
        await registry.stop(0)
        await runtime.stop(0)


async def _close(messages: AsyncIterator[AgentMessage]) -> None:
    await cast("AsyncGenerator[AgentMessage, None]", messages).aclose()


async def _program(client: RegistryClient, agent: str, code: str) -> Any:
    result = await client.run_code(code, "cordis", agent=agent)
    assert not result.is_error, result.error_message
    return result.value


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_crashed_plugin_host_steers_its_owner_once_over_watch_history(
    language: str,
) -> None:
    define_run, crash, crash_again = DOOMED_PROGRAMS[language]
    async with _real_stack() as client:
        created = await client.create_agent(
            "coder",
            mode="code",
            language=language,  # type: ignore[arg-type]
            self_modification=True,
        )
        agent = created.name
        started = await _program(client, agent, define_run)
        assert started["result"]["status"] == "running"
        messages: list[AgentMessage] = []
        arrived = asyncio.Event()

        async def watch() -> None:
            async for message in client.watch_agent_messages(agent):
                messages.append(message)
                arrived.set()

        watcher = asyncio.ensure_future(watch())
        try:
            crashed = await _program(client, agent, crash)
            assert crashed["logs"], "the call into the dying host failed"
            await asyncio.wait_for(arrived.wait(), 30)
            # The plugin is failed and its tool gone: a second call cannot steer again.
            again = await _program(client, agent, crash_again)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        assert NO_BINDING[language] in again["logs"][0]  # gone from the next enumeration
        plugin = again["result"]
        assert plugin["state"] == "failed"
        assert plugin["currentPackageId"] == "pkg-1" and plugin["nextPackageId"] == "pkg-1"

        records = [r for r in await client.history(agent) if r.kind == AGENT_STEER]
        assert len(records) == 1  # once per distinct kind per run
        steer = agent_message(records[0])
        assert steer is not None and messages == [steer]  # WatchHistory delivered it, typed
        assert steer.kind == "steer" and steer.source == "cordis-host-runner"
        assert steer.metadata == {
            "pluginId": "doom-1",
            "packageId": "pkg-1",
            "pluginRunId": "run-1",
        }
        lines = steer.text.split("\n")
        assert lines[0] == (
            "Cordis run doom-1/pkg-1 (run-1) failed after cordis_run returned running: "
            "plugin-host-lost"
        )
        assert lines[1].startswith("the plugin host of doom-1 stopped unexpectedly: ")
        assert len(lines[1]) > len("the plugin host of doom-1 stopped unexpectedly: ")
        assert lines[2:] == [
            "currentPackageId: pkg-1",
            "nextPackageId: pkg-1",
            INSPECT_DIRECTION,
        ]


async def test_a_cancelled_run_call_steers_the_outcome_it_did_not_return(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    hosts = cordis.hosts
    assert isinstance(hosts, InProcessHosts)
    hosts.activation_gate = asyncio.Event()
    # The latch is the call's own abort signal: the steer depends on the registry having seen
    # the cancellation before the activation settles, not on the client having sent it.
    runner = cordis.registry.cordis.runner
    signals: list[AbortSignal] = []
    run = runner.run

    async def capturing_run(
        owner: str, plugin_id: str, package_id: str, mode: str, signal: AbortSignal, **kw: Any
    ) -> dict[str, JsonValue]:
        signals.append(signal)
        return await run(owner, plugin_id, package_id, mode, signal, **kw)

    runner.run = capturing_run  # type: ignore[method-assign]
    call = cordis.stub.ExecuteToolCall(
        rpb.ExecuteToolCallRequest(
            agent=agent,
            call_id="run-cancelled",
            tool_name="cordis_run",
            arguments_json='{"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}',
        )
    )
    await until(lambda: bool(hosts.log), "the activation")
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        async for _ in call:
            pass
    await until(lambda: len(signals) == 1 and signals[0].aborted, "the registry seeing the cancel")
    hosts.activation_gate.set()
    client = RegistryClient(cordis.channel)
    messages = client.watch_agent_messages(agent)
    message = await asyncio.wait_for(anext(messages), 30)
    await _close(messages)
    assert message.kind == "steer"
    assert message.text == (
        "Cordis run clock-1/pkg-1 (run-1) completed successfully. currentPackageId is pkg-1. "
        "Continue using the running Plugin."
    )


async def test_a_completed_run_call_does_not_steer(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    assert not (await cordis.run(agent, "clock-1", "pkg-1")).is_error
    await cordis.ok(agent, "cordis_stop", {"pluginId": "clock-1"})  # a stop is no failure
    kinds = [r.kind for r in await RegistryClient(cordis.channel).history(agent)]
    assert AGENT_STEER not in kinds and kinds  # the tool calls are there, no steer


async def test_inject_writes_an_agent_inject_record_the_client_types(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    cordis.registry.cordis.inject(
        agent, "The user stopped clock-1 from its panel.", {"pluginId": "clock-1"}
    )
    client = RegistryClient(cordis.channel)
    messages = client.watch_agent_messages(agent)
    message = await asyncio.wait_for(anext(messages), 30)
    await _close(messages)
    assert (message.kind, message.text, message.metadata) == (
        "inject",
        "The user stopped clock-1 from its panel.",
        {"pluginId": "clock-1"},
    )
    assert [r.kind for r in await client.history(agent)] == [AGENT_INJECT]
