"""A catalog change answered OK survives a crash: a real registry process SIGKILLed right after
CreatePreset, CreateAgent (mode code, language typescript, self-modification, a preset parent)
and AddRestriction answered comes back with all of it, the restriction in force once the
provider has reconnected and registered its tools again (tools are not stored)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import grpc

from codemode_client import ToolProvider
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2
from tests.cli._processes import service_env
from tests.registry.history.test_interrupted_calls import _start, _stop


def _provider(channel: grpc.aio.Channel) -> ToolProvider:
    provider = ToolProvider(channel, "tools")

    @provider.tool(description="Reads")
    async def read(args: Any, ctx: Any) -> Any:
        return {}

    @provider.tool(description="Writes")
    async def write(args: Any, ctx: Any) -> Any:
        return {}

    return provider


async def _visible(stub: Any, scope: str) -> set[str]:
    response = await stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=scope))
    return {t.name for t in response.tools}


async def test_a_change_answered_ok_survives_a_sigkill(tmp_path: Path) -> None:
    env = {**service_env(tmp_path), "PYTHON": sys.executable}
    registry, address = _start("registry_service", tmp_path, env)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = rpb_grpc.RegistryServiceStub(channel)
            async with _provider(channel):
                await stub.CreatePreset(
                    rpb.CreatePresetRequest(
                        preset_id="team", preset=scope_pb2.Preset(code_language="python")
                    )
                )
                created = await stub.CreateAgent(
                    rpb.CreateAgentRequest(
                        agent_id="coder",
                        agent=scope_pb2.Agent(
                            preset="presets/team",
                            mode=scope_pb2.PRESENTATION_MODE_CODE,
                            code_language="typescript",
                            self_modification=True,
                        ),
                    )
                )
                assert "write" in await _visible(stub, "agents/coder")
                await stub.AddRestriction(
                    rpb.AddRestrictionRequest(scope="agents/coder", deny=["write"])
                )
                before = (await stub.GetAgent(rpb.GetAgentRequest(name="agents/coder"))).agent
                registry.send_signal(signal.SIGKILL)  # at once after OK: nothing graceful
                registry.wait(10)
    finally:
        _stop(registry)

    registry, address = _start("registry_service", tmp_path, env)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = rpb_grpc.RegistryServiceStub(channel)
            after = (await stub.GetAgent(rpb.GetAgentRequest(name="agents/coder"))).agent
            assert after == before == created.agent
            assert (after.mode, after.code_language, after.preset) == (
                scope_pb2.PRESENTATION_MODE_CODE,
                "typescript",
                "presets/team",
            )
            assert after.self_modification and after.agent_id
            preset = (await stub.GetPreset(rpb.GetPresetRequest(name="presets/team"))).preset
            assert preset.code_language == "python"
            async with _provider(channel):
                visible = await _visible(stub, "agents/coder")
                assert "read" in visible and "write" not in visible
    finally:
        _stop(registry)
