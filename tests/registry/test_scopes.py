"""Scopes and presentation modes and the scoped registry rules."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_status import rpc_status

from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.grpc_status import error_info
from registry_service.domain.execution import ExecutionInput
from registry_service.domain.results import ToolResult
from registry_service.domain.scopes import Mode
from registry_service.domain.signals import never
from tests.registry.conftest import BOTH, CODE, NATIVE, Harness, echo_tool


def reason_of(error: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(error)
    assert status is not None
    info = error_info(status)
    assert info is not None and info.domain == "codemode.registry"
    return str(info.reason)


async def expect_error(coro: Any, code: grpc.StatusCode, reason: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await coro
    assert caught.value.code() == code, caught.value.details()
    assert reason_of(caught.value) == reason
    return caught.value.details() or ""


async def test_agent_code_mode_while_deployment_native(harness: Harness) -> None:
    echo_tool(harness.registry, "read")
    agent = await harness.agent("coder", mode=CODE)
    sibling = await harness.agent("plain")
    assert await harness.visible(agent) == ["read", "run_code"]
    assert await harness.visible(sibling) == ["read"]  # no run_code for native agents
    assert await harness.visible() == ["read"]
    got = await harness.stub.GetAgent(rpb.GetAgentRequest(name=agent))
    assert got.agent.effective_mode == CODE


async def test_preset_mode_is_inherited_by_parented_agent_only(harness: Harness) -> None:
    echo_tool(harness.registry, "read")
    preset = await harness.preset("coders", mode=CODE)
    child = await harness.agent("child", preset=preset)
    loner = await harness.agent("loner")
    assert (
        await harness.stub.GetAgent(rpb.GetAgentRequest(name=child))
    ).agent.effective_mode == CODE
    assert (
        await harness.stub.GetAgent(rpb.GetAgentRequest(name=loner))
    ).agent.effective_mode == NATIVE
    _, denied = await harness.execute("read", agent=child)
    assert denied.error.code == "UNKNOWN_TOOL"
    _, allowed = await harness.execute("read", agent=loner)
    assert not allowed.is_error
    catalog = harness.registry.catalog
    assert catalog.mode_for(child) is Mode.CODE
    execution = harness.registry.executor.create(
        ExecutionInput(call_id="c", name="read", arguments={}, signal=never(), agent=child)
    )
    assert isinstance(execution, ToolResult)  # collapsed at creation: never scheduled


async def test_agent_declaration_overrides_its_preset(harness: Harness) -> None:
    preset = await harness.preset("coders", mode=CODE)
    agent = await harness.agent("own", preset=preset, mode=BOTH)
    assert (
        await harness.stub.GetAgent(rpb.GetAgentRequest(name=agent))
    ).agent.effective_mode == BOTH


async def test_opting_out_of_code_deployment(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.CODE) as h:
        echo_tool(h.registry, "read")
        agent = await h.agent("native-one", mode=NATIVE)
        assert await h.visible(agent) == ["read"]
        _, result = await h.execute("read", agent=agent)
        assert not result.is_error
        assert await h.visible() == ["read", "run_code"]
        # The opted-out agent gets an empty SDK and no code-mode prompt sections.
        sdk = await h.stub.GetSdk(ppb.GetSdkRequest(scope=agent, language="python"))
        assert (sdk.text, sdk.effective_mode) == ("", NATIVE)
        prompt = await h.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=agent))
        ids = [section.id for section in prompt.sections]
        assert "tools:sdk" not in ids and "tools:code-only" not in ids
        assert "tools:sdk" in [
            section.id
            for section in (
                await h.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=""))
            ).sections
        ]


async def test_deleting_agent_restores_deployment_default_and_revokes_exactly(
    harness: Harness,
) -> None:
    echo_tool(harness.registry, "read")
    agent = await harness.agent("temp", mode=CODE)
    echo_tool(harness.registry, "mine", scope=agent)
    await harness.stub.AddRestriction(rpb.AddRestrictionRequest(scope=agent, deny=["read"]))
    harness.registry.catalog.hooks(agent).guards.append(lambda e: "blocked")
    assert await harness.visible(agent) == ["mine", "run_code"]
    await harness.stub.DeleteAgent(rpb.DeleteAgentRequest(name=agent))
    again = await harness.agent("temp")
    assert await harness.visible(again) == ["read"]
    _, result = await harness.execute("read", agent=again)
    assert not result.is_error  # the old agent's guard went with it
    assert harness.registry.catalog.view("").visible.keys() == {"read"}


async def test_second_mode_declaration_is_refused(harness: Harness) -> None:
    agent = await harness.agent("a", mode=CODE)
    details = await expect_error(
        harness.stub.SetPresentationMode(rpb.SetPresentationModeRequest(scope=agent, mode=BOTH)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "MODE_ALREADY_DECLARED",
    )
    assert '"both" conflicts with "code"' in details
    other = await harness.agent("b")
    await harness.stub.SetPresentationMode(rpb.SetPresentationModeRequest(scope=other, mode=CODE))
    assert await harness.visible(other) == ["run_code"]


async def test_global_mode_declaration_is_refused(harness: Harness) -> None:
    await expect_error(
        harness.stub.SetPresentationMode(rpb.SetPresentationModeRequest(scope="", mode=CODE)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "SCOPE_REQUIRED",
    )


async def test_run_code_is_reserved_even_when_no_agent_presents_it(harness: Harness) -> None:
    with pytest.raises(Exception, match="reserved"):
        echo_tool(harness.registry, "run_code")
    assert await harness.visible() == []


async def test_scoped_registration_shadows_global_in_both_orders(harness: Harness) -> None:
    agent = await harness.agent("a")

    async def scoped(invocation: Any) -> Any:
        return "scoped"

    async def global_(invocation: Any) -> Any:
        return "global"

    harness.registry.register_tool("t", scoped, scope=agent)
    harness.registry.register_tool("t", global_)
    _, r1 = await harness.execute("t", agent=agent)
    _, r2 = await harness.execute("t")
    assert (r1.value_json, r2.value_json) == ('"scoped"', '"global"')
    harness.registry.register_tool("u", global_)
    harness.registry.register_tool("u", scoped, scope=agent)
    _, r3 = await harness.execute("u", agent=agent)
    assert r3.value_json == '"scoped"'


async def test_duplicate_registration_errors(harness: Harness) -> None:
    agent = await harness.agent("a")
    echo_tool(harness.registry, "t")
    echo_tool(harness.registry, "t", scope=agent)
    with pytest.raises(Exception, match='tool "t" is already registered \\(for a per-agent'):
        echo_tool(harness.registry, "t")
    with pytest.raises(Exception, match='tool "t" is already registered in this scope'):
        echo_tool(harness.registry, "t", scope=agent)


async def test_restrictions_intersect_snapshot_and_exempt_own_scope(harness: Harness) -> None:
    for name in ("a", "b", "c"):
        echo_tool(harness.registry, name)
    preset = await harness.preset("p")
    agent = await harness.agent("x", preset=preset)
    echo_tool(harness.registry, "own", scope=agent)
    await harness.stub.AddRestriction(rpb.AddRestrictionRequest(scope=preset, allow=["a", "b"]))
    await harness.stub.AddRestriction(rpb.AddRestrictionRequest(scope=agent, deny=["b"]))
    assert await harness.visible(agent) == ["a", "own"]
    assert await harness.visible(preset) == ["a", "b"]
    echo_tool(harness.registry, "d")  # allow masks exclude later globals; deny masks admit them
    assert await harness.visible(agent) == ["a", "own"]
    other = await harness.agent("y")
    await harness.stub.AddRestriction(rpb.AddRestrictionRequest(scope=other, deny=["a"]))
    echo_tool(harness.registry, "e")
    assert await harness.visible(other) == ["b", "c", "d", "e"]
    _, hidden = await harness.execute("c", agent=agent)
    assert hidden.error.code == "UNKNOWN_TOOL"


async def test_restriction_errors(harness: Harness) -> None:
    echo_tool(harness.registry, "a")
    agent = await harness.agent("x")
    echo_tool(harness.registry, "own", scope=agent)
    add = harness.stub.AddRestriction
    await expect_error(
        add(rpb.AddRestrictionRequest(scope=agent)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "EMPTY_RESTRICTION",
    )
    details = await expect_error(
        add(rpb.AddRestrictionRequest(scope=agent, allow=["run_code"])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "RESERVED_TOOL_NAME",
    )
    assert "run_code" in details
    details = await expect_error(
        add(rpb.AddRestrictionRequest(scope=agent, deny=["own", "zzz"])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "UNKNOWN_RESTRICTION_TARGET",
    )
    assert (
        details
        == 'restriction names unknown inherited tool(s) "own", "zzz"; known inherited tools: "a"'
    )
    await expect_error(
        add(rpb.AddRestrictionRequest(scope="", deny=["a"])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "SCOPE_REQUIRED",
    )
    await expect_error(
        add(rpb.AddRestrictionRequest(scope="agents/nobody", deny=["a"])),
        grpc.StatusCode.NOT_FOUND,
        "AGENT_NOT_FOUND",
    )
    assert await harness.visible(agent) == ["a", "own"]  # nothing changed


async def test_run_code_survives_restrictions(harness: Harness) -> None:
    echo_tool(harness.registry, "a")
    echo_tool(harness.registry, "b")
    agent = await harness.agent("x", mode=BOTH)
    await harness.stub.AddRestriction(rpb.AddRestrictionRequest(scope=agent, allow=["a"]))
    assert await harness.visible(agent) == ["a", "run_code"]
    await harness.stub.AddRestriction(rpb.AddRestrictionRequest(scope=agent, deny=["a"]))
    assert await harness.visible(agent) == ["run_code"]


async def test_remove_restriction(harness: Harness) -> None:
    echo_tool(harness.registry, "a")
    agent = await harness.agent("x")
    added = await harness.stub.AddRestriction(rpb.AddRestrictionRequest(scope=agent, deny=["a"]))
    assert await harness.visible(agent) == []
    await harness.stub.RemoveRestriction(
        rpb.RemoveRestrictionRequest(scope=agent, restriction_id=added.restriction_id)
    )
    assert await harness.visible(agent) == ["a"]
    await expect_error(
        harness.stub.RemoveRestriction(
            rpb.RemoveRestrictionRequest(scope=agent, restriction_id=added.restriction_id)
        ),
        grpc.StatusCode.NOT_FOUND,
        "RESTRICTION_NOT_FOUND",
    )


async def test_allow_none_hides_every_inherited_tool(harness: Harness) -> None:
    echo_tool(harness.registry, "a")
    echo_tool(harness.registry, "b")
    agent = await harness.agent("x", mode=BOTH)  # BOTH: run_code shown, direct calls allowed
    sibling = await harness.agent("y")
    echo_tool(harness.registry, "own", scope=agent)
    added = await harness.stub.AddRestriction(
        rpb.AddRestrictionRequest(scope=agent, allow_none=True)
    )
    assert await harness.visible(agent) == ["own", "run_code"]  # own tools are exempt
    echo_tool(harness.registry, "c")  # an allow list naming none excludes later globals too
    assert await harness.visible(agent) == ["own", "run_code"]
    assert await harness.visible(sibling) == ["a", "b", "c"]
    _, hidden = await harness.execute("a", agent=agent)
    assert hidden.error.code == "UNKNOWN_TOOL"
    await harness.stub.RemoveRestriction(
        rpb.RemoveRestrictionRequest(scope=agent, restriction_id=added.restriction_id)
    )
    assert await harness.visible(agent) == ["a", "b", "c", "own", "run_code"]
    _, shown = await harness.execute("a", agent=agent, call_id="call-2")
    assert not shown.is_error


async def test_allow_none_on_a_preset_applies_to_its_agents(harness: Harness) -> None:
    echo_tool(harness.registry, "a")
    preset = await harness.preset("p")
    agent = await harness.agent("x", preset=preset)
    loner = await harness.agent("y")
    echo_tool(harness.registry, "preset-tool", scope=preset)
    echo_tool(harness.registry, "own", scope=agent)
    await harness.stub.AddRestriction(
        rpb.AddRestrictionRequest(scope=preset, allow_none=True, deny=["a"])  # deny: redundant
    )
    assert await harness.visible(preset) == ["preset-tool"]
    # The preset's own tool is inherited by its agents, so the preset's restriction hides it there.
    assert await harness.visible(agent) == ["own"]
    echo_tool(harness.registry, "later")
    assert await harness.visible(agent) == ["own"]
    assert await harness.visible(loner) == ["a", "later"]


async def test_allow_none_with_allow_is_refused(harness: Harness) -> None:
    echo_tool(harness.registry, "a")
    echo_tool(harness.registry, "b")
    agent = await harness.agent("x")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.stub.AddRestriction(
            rpb.AddRestrictionRequest(scope=agent, allow=["a"], allow_none=True)
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(caught.value)
    assert status is not None
    info = error_info(status)
    assert info is not None and info.reason == "CONFLICTING_ALLOW"
    assert dict(info.metadata) == {"field": "allow_none"}
    assert await harness.visible(agent) == ["a", "b"]  # nothing was added


async def test_delete_preset_in_use_is_refused_then_revokes(harness: Harness) -> None:
    echo_tool(harness.registry, "a")
    preset = await harness.preset("p", mode=CODE)
    agent = await harness.agent("x", preset=preset)
    echo_tool(harness.registry, "preset-tool", scope=preset)
    assert await harness.visible(agent) == ["a", "preset-tool", "run_code"]
    await expect_error(
        harness.stub.DeletePreset(rpb.DeletePresetRequest(name=preset)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "PRESET_IN_USE",
    )
    await harness.stub.DeleteAgent(rpb.DeleteAgentRequest(name=agent))
    await harness.stub.DeletePreset(rpb.DeletePresetRequest(name=preset))
    assert await harness.visible() == ["a"]


async def test_force_deleting_a_preset_puts_its_agents_on_the_default(harness: Harness) -> None:
    echo_tool(harness.registry, "a")
    echo_tool(harness.registry, "b")
    preset = await harness.preset("p", mode=CODE)
    agent = await harness.agent("x", preset=preset)
    other = await harness.agent("y")
    echo_tool(harness.registry, "preset-tool", scope=preset)
    await harness.stub.AddRestriction(rpb.AddRestrictionRequest(scope=preset, deny=["b"]))
    harness.registry.catalog.hooks(preset).guards.append(lambda e: "blocked by the preset")
    listed = await harness.stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent))
    assert [t.name for t in listed.tools] == ["a", "preset-tool", "run_code"]
    assert listed.effective_mode == CODE
    _, blocked = await harness.execute("run_code", {"code": "return 1"}, agent=agent)
    assert blocked.is_error and blocked.error.message == "blocked by the preset"

    await harness.stub.DeletePreset(rpb.DeletePresetRequest(name=preset, force=True))
    got = await harness.stub.GetAgent(rpb.GetAgentRequest(name=agent))
    assert got.agent.preset == ""
    listed = await harness.stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent))
    assert [t.name for t in listed.tools] == ["a", "b"]  # the deployment default: native
    assert listed.effective_mode == NATIVE
    _, result = await harness.execute("a", {"k": 1}, agent=agent)
    assert not result.is_error  # the preset's guard is gone with it
    assert await harness.visible(other) == ["a", "b"]  # other agents are untouched
    await expect_error(
        harness.stub.GetPreset(rpb.GetPresetRequest(name=preset)),
        grpc.StatusCode.NOT_FOUND,
        "PRESET_NOT_FOUND",
    )


async def test_listing_tools_shows_concurrency_owner_and_scope(harness: Harness) -> None:
    echo_tool(harness.registry, "safe", concurrency_safe=True)
    echo_tool(harness.registry, "unsafe")
    response = await harness.stub.ListVisibleTools(rpb.ListVisibleToolsRequest())
    by_name = {t.name: t for t in response.tools}
    assert by_name["safe"].concurrency == tool_pb2.CONCURRENCY_SAFE
    assert by_name["unsafe"].concurrency == tool_pb2.CONCURRENCY_EXCLUSIVE
    assert by_name["safe"].owner == "in-process"
    assert by_name["safe"].scope == ""  # global is the empty scope
    # Listed for an agent, each tool reports the scope it is registered in, not the query's.
    preset = await harness.preset("p", mode=BOTH)
    agent = await harness.agent("x", preset=preset)
    echo_tool(harness.registry, "from-preset", scope=preset)
    echo_tool(harness.registry, "own", scope=agent)
    echo_tool(harness.registry, "unsafe", scope=agent)  # shadows the global one
    listed = await harness.stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent))
    assert {t.name: t.scope for t in listed.tools} == {
        "safe": "",
        "unsafe": agent,
        "from-preset": preset,
        "own": agent,
        "run_code": "",
    }
    listed = await harness.stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=preset))
    assert {t.name: t.scope for t in listed.tools} == {
        "safe": "",
        "unsafe": "",
        "from-preset": preset,
        "run_code": "",
    }
