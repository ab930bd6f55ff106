"""The per-invocation compute budget and the start timeout of plugin hosts, as registry
settings, with real plugin hosts through the gRPC API."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.config import RegistrySettings
from tests.registry.cordis.real_stack import LANGUAGES, real_stack
from tests.runtime.conftest import child_pids, describe

BUSY_PY = """\
def spin(args):
    while True:
        pass

async def fine(args):
    return "fine"

async def apply(ctx):
    harness.register_tool(harness.define_tool(name="spin", description="Loops.", execute=spin))
    harness.register_tool(harness.define_tool(name="fine", description="Ok.", execute=fine))

return apply
"""

SLOW_START_PY = """\
async def apply(ctx):
    while True:  # the plugin's synchronous start never ends
        pass

return apply
"""

BUSY = {
    "python": BUSY_PY,
    "typescript": """\
const spin = () => {
  while (true) {}
};
const fine = async () => "fine";

return async (ctx: unknown) => {
  harness.registerTool(harness.defineTool({ name: "spin", description: "Loops.", execute: spin }));
  harness.registerTool(harness.defineTool({ name: "fine", description: "Ok.", execute: fine }));
};
""",
}
SLOW_START = {
    "python": SLOW_START_PY,
    "typescript": """\
return async (ctx: unknown) => {
  while (true) {} // the plugin's synchronous start never ends
};
""",
}


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_busy_looping_tool_ends_with_the_budget_text_and_its_host_steers_once(
    language: str,
) -> None:
    async with real_stack(
        {"pool_size": 0, "typescript_pool_size": 0}, cordis_compute_ms_per_call=300
    ) as h:
        agent = await h.agent("spinner", language=language)
        defined = await h.define(agent, BUSY[language], prefix="busy", name="Busy")
        await h.ok(
            agent,
            "cordis_run",
            {"pluginId": defined["pluginId"], "packageId": defined["packageId"], "mode": "run"},
        )
        assert await h.ok(agent, "fine", {}, "f1") == "fine"
        spun = await h.call(agent, "spin", {}, "s1")
        assert spun.is_error
        assert spun.error.message == "compute budget exhausted (300ms busy)"
        # The host is gone with it: the plugin failed, its tools left the catalog, the owner
        # was steered once with the reason.
        for _ in range(500):
            if "fine" not in await h.visible(agent):
                break
            await asyncio.sleep(0.02)
        assert "fine" not in await h.visible(agent) and "spin" not in await h.visible(agent)
        plugin = await h.ok(agent, "cordis_inspect_self", {"pluginId": defined["pluginId"]})
        assert plugin["state"] == "failed"
        assert plugin["currentPackageId"] == defined["packageId"]
        page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
        steers = [r for r in page.records if r.kind == "agent/steer"]
        assert len(steers) == 1
        text = steers[0].content[0].text.text
        assert "plugin-host-lost" in text
        assert "a call ran past its compute budget (300ms busy)" in text
        for _ in range(500):
            if not child_pids():
                break
            await asyncio.sleep(0.02)
        assert child_pids() == [], describe(child_pids())


@pytest.mark.parametrize("language", LANGUAGES)
async def test_the_start_timeout_is_a_setting_and_bounds_a_start_that_never_ends(
    language: str,
) -> None:
    async with real_stack(cordis_start_timeout_s=0.5) as h:
        agent = await h.agent("slow", language=language)
        defined = await h.define(agent, SLOW_START[language], prefix="slow", name="Slow")
        result = await h.call(
            agent,
            "cordis_run",
            {"pluginId": defined["pluginId"], "packageId": defined["packageId"], "mode": "run"},
        )
        assert result.is_error
        assert "did not start within 0.5 s" in result.error.message
        plugin = await h.ok(
            agent,
            "cordis_inspect_self",
            {"pluginId": defined["pluginId"], "packageId": defined["packageId"]},
        )
        assert plugin["runtime"]["host"]["status"] == "failed"
        assert plugin["runtime"]["host"]["error"]["phase"] == "host-apply"


@pytest.mark.parametrize(
    "settings",
    [
        {"cordis_start_timeout_s": 0},
        {"cordis_start_timeout_s": 601},
        {"cordis_start_timeout_s": float("nan")},
        {"cordis_compute_ms_per_call": 0},
    ],
)
def test_cordis_host_settings_are_validated(settings: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        RegistrySettings(**settings)  # type: ignore[arg-type]
