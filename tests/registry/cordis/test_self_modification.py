"""`self_modification`: off by default, nearest wins, revoked with the scope; only where it is in
force are the seven tools in the catalog and `tool:cordis` (order 115) in the prompt."""

from __future__ import annotations

from typing import Any

from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from tests.registry.conftest import CODE, result_text
from tests.registry.cordis.conftest import CordisHarness

SEVEN = {
    "cordis_inspect_list",
    "cordis_inspect_query",
    "cordis_inspect_self",
    "cordis_define",
    "cordis_run",
    "cordis_stop",
    "cordis_undefine",
}


async def _sections(h: CordisHarness, scope: str) -> list[tuple[str, int]]:
    prompt = await h.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=scope))
    return [(s.id, s.order) for s in prompt.sections]


async def test_off_by_default_no_tools_no_section_and_calls_are_unknown(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("plain", self_modification=None)
    assert SEVEN.isdisjoint(await cordis.visible(agent))
    assert all(section != "tool:cordis" for section, _ in await _sections(cordis, agent))
    got = await cordis.stub.GetAgent(rpb.GetAgentRequest(name=agent))
    assert not got.agent.HasField("self_modification")
    assert got.agent.effective_self_modification is False
    result = await cordis.call(agent, "cordis_inspect_list", {})
    assert result.is_error and result.error.code == "UNKNOWN_TOOL"


async def test_declared_on_an_agent_gives_the_tools_and_the_section(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    assert set(await cordis.visible(agent)) >= SEVEN
    sections = await _sections(cordis, agent)
    assert ("tool:cordis", 115) in sections
    prompt = await cordis.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=agent))
    assert "cordis_define" in prompt.text
    got = await cordis.stub.GetAgent(rpb.GetAgentRequest(name=agent))
    assert got.agent.self_modification is True
    assert got.agent.effective_self_modification is True
    # Its sibling and the global view stay without them.
    assert SEVEN.isdisjoint(
        await cordis.visible(await cordis.agent("other", self_modification=None))
    )
    assert SEVEN.isdisjoint(await cordis.visible(""))


async def test_nearest_wins_and_the_preset_delete_revokes(cordis: CordisHarness) -> None:
    response = await cordis.stub.CreatePreset(
        rpb.CreatePresetRequest(preset_id="makers", preset=scope_pb2.Preset(self_modification=True))
    )
    assert response.preset.self_modification is True
    inherits = await cordis.agent("inherits", "presets/makers", self_modification=None)
    opts_out = await cordis.agent("opts-out", "presets/makers", self_modification=False)
    assert set(await cordis.visible(inherits)) >= SEVEN
    assert SEVEN.isdisjoint(await cordis.visible(opts_out))
    await cordis.stub.DeletePreset(rpb.DeletePresetRequest(name="presets/makers", force=True))
    assert SEVEN.isdisjoint(await cordis.visible(inherits))
    assert all(section != "tool:cordis" for section, _ in await _sections(cordis, inherits))


async def test_deployment_default_and_the_agent_opt_out(make_cordis: Any) -> None:
    async with make_cordis(self_modification=True) as h:
        assert set(await h.visible(await h.agent("a", self_modification=None))) >= SEVEN
        assert SEVEN.isdisjoint(await h.visible(await h.agent("b", self_modification=False)))
        # Without an agent the tools answer with a clear text, not a crash.
        result = await h.call("", "cordis_inspect_list", {})
        assert result.is_error
        assert result.error.message == "Cordis dynamic tools require an Agent-backed session"


async def test_under_code_the_section_is_filtered_and_the_sdk_has_the_bindings(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("coder", mode=CODE)
    assert all(section != "tool:cordis" for section, _ in await _sections(cordis, agent))
    sdk = await cordis.stub.GetSdk(ppb.GetSdkRequest(scope=agent))
    for name in SEVEN:
        assert f"    async def {name}(self, args: " in sdk.text, name
    assert "class CordisRunArgs(TypedDict):" in sdk.text
    assert 'mode: Literal["run", "update"]' in sdk.text
    # Model-direct calls collapse under code, like every other tool.
    result = await cordis.call(agent, "cordis_inspect_list", {})
    assert result.error.code == "UNKNOWN_TOOL"
    assert "run_code" in result_text(result)


async def test_settings_declare_presets_and_agents(make_cordis: Any) -> None:
    async with make_cordis(
        presets=[{"id": "makers", "self_modification": True}],
        agents=[{"id": "bob", "preset": "makers"}, {"id": "eve", "self_modification": False}],
    ) as h:
        assert set(await h.visible("agents/bob")) >= SEVEN
        assert SEVEN.isdisjoint(await h.visible("agents/eve"))


async def test_the_python_client_declares_it_and_resolves_references(
    cordis: CordisHarness,
) -> None:
    from codemode_client import RegistryClient

    async with RegistryClient(cordis.running.address) as client:
        preset = await client.create_preset("makers", self_modification=True)
        assert preset.self_modification is True
        agent = await client.create_agent("maker", preset=preset.name)
        assert not agent.HasField("self_modification")
        assert agent.effective_self_modification is True
        plain = await client.create_agent("plain", self_modification=False)
        assert plain.effective_self_modification is False
        await cordis.define(agent.name)
        [block] = await client.resolve_plugin_references(agent.name, "@clock-1 again")
        assert block.available and block.text.startswith("<cordis_dynamic_plugin_context>\n")
        assert await client.resolve_plugin_references(agent.name, "no mention") == []
