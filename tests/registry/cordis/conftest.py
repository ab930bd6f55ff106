"""A live registry on loopback with an in-process `PluginHosts` wired in."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from registry_service.config import RegistrySettings
from registry_service.domain.plugin_hosts import PluginHosts
from registry_service.registry import build_registry
from registry_service.server import start
from runtime_service.runtime import Runtime
from tests.registry.conftest import UNSET, Harness, ModeValue
from tests.registry.cordis.hosts import InProcessHosts

CLOCK = """\
async def now(args):
    probe.seen.append("now")
    return {"time": "12:00", "args": args}

tool = harness.define_tool(
    name="clock_now",
    description="The time.",
    parameters={"type": "object", "properties": {}, "additionalProperties": True},
    execute=now,
)

async def apply(ctx):
    harness.register_tool(tool)
    ctx.effect(lambda: (lambda: probe.seen.append("disposed clock")), "clock")

return apply
"""


def clock_v2(label: str = "v2") -> str:
    return CLOCK.replace('"12:00"', f'"{label}"')


async def until(predicate: Callable[[], bool], what: str = "condition") -> None:
    """Polls a latch-like condition with a generous bound (no timing is asserted)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what} did not happen within 10 s")


class CordisHarness(Harness):
    hosts: InProcessHosts | None
    runtime: Runtime | None = None  # the in-process runtime of a real stack

    async def agent(
        self,
        agent_id: str,
        preset: str = "",
        mode: ModeValue = UNSET,
        *,
        self_modification: bool | None = True,
        language: str = "",
    ) -> str:
        """An agent; ``language`` is its program language (and so its host halves')."""
        agent = scope_pb2.Agent(preset=preset, mode=mode, code_language=language)
        if self_modification is not None:
            agent.self_modification = self_modification
        response = await self.stub.CreateAgent(
            rpb.CreateAgentRequest(agent_id=agent_id, agent=agent)
        )
        return str(response.agent.name)

    async def call(self, agent: str, name: str, arguments: Any, call_id: str = "c") -> Any:
        """The result proto of one model-direct call."""
        _events, result = await self.execute(name, arguments, agent=agent, call_id=call_id)
        return result

    async def ok(self, agent: str, name: str, arguments: Any, call_id: str = "c") -> Any:
        result = await self.call(agent, name, arguments, call_id)
        assert not result.is_error, result.error.message
        return jsonvalue.loads(result.value_json)

    async def define(
        self,
        agent: str,
        host: str | None = CLOCK,
        *,
        prefix: str = "clock",
        existing: str = "",
        client: str | None = None,
        name: str = "Clock",
    ) -> Any:
        plugin = (
            {"kind": "existing", "pluginId": existing}
            if existing
            else {"kind": "new", "idPrefix": prefix}
        )
        code = {k: v for k, v in (("host", host), ("client", client)) if v is not None}
        return await self.ok(
            agent,
            "cordis_define",
            {"plugin": plugin, "name": name, "purpose": "Tell the time.", "code": code},
        )

    async def run(self, agent: str, plugin_id: str, package_id: str, mode: str = "run") -> Any:
        return await self.call(
            agent, "cordis_run", {"pluginId": plugin_id, "packageId": package_id, "mode": mode}
        )


@pytest.fixture
def make_cordis() -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def factory(
        hosts: PluginHosts | str | None = "in-process",
        tracer_provider: Any = None,
        **settings: Any,
    ) -> AsyncIterator[CordisHarness]:
        plugin_hosts = InProcessHosts() if hosts == "in-process" else hosts
        config = RegistrySettings(
            **{"listen": "127.0.0.1:0", "history_path": ":memory:", **settings}
        )
        registry = build_registry(
            config,
            plugin_hosts=plugin_hosts,  # type: ignore[arg-type]
            tracer_provider=tracer_provider,
        )
        running = await start(config, registry)
        channel = grpc.aio.insecure_channel(running.address)
        harness = CordisHarness(running, channel)
        harness.hosts = plugin_hosts if isinstance(plugin_hosts, InProcessHosts) else None
        try:
            yield harness
        finally:
            await channel.close()
            await running.stop(0)

    return factory


@pytest.fixture
async def cordis(make_cordis: Any) -> AsyncIterator[CordisHarness]:
    async with make_cordis() as h:
        yield h
