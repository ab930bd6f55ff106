"""The inspect registry through `cordis_inspect_list` / `cordis_inspect_query`:
this product's host providers, input and output validation, validated manifests."""

from __future__ import annotations

from typing import Any

import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.cordis.inspect import InspectRegistry, Method, Provider
from registry_service.domain.signals import AbortController
from tests.registry.cordis.conftest import CordisHarness


async def test_list_shows_the_host_providers_with_schemas(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    listed = await cordis.ok(agent, "cordis_inspect_list", {})
    providers = listed["providers"]
    assert [(p["platform"], p["id"]) for p in providers] == [
        ("host", "Service"),
        ("host", "Event"),
        ("host", "Builtin"),
        ("host", "Tool"),
    ]
    methods = {p["id"]: [m["name"] for m in p["methods"]] for p in providers}
    assert methods == {
        "Service": ["listService"],
        "Event": ["listEvents"],
        "Builtin": ["listBuiltins"],
        "Tool": ["listTools"],
    }
    for provider in providers:
        for method in provider["methods"]:
            assert set(method) == {"name", "description", "inputSchema", "outputSchema"}


async def _query(h: CordisHarness, agent: str, provider: str, method: str, **extra: object) -> Any:
    return await h.call(
        agent,
        "cordis_inspect_query",
        {"platform": "host", "provider": provider, "method": method, **extra},
    )


async def test_builtins_name_the_python_facade(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    data = await cordis.ok(
        agent,
        "cordis_inspect_query",
        {"platform": "host", "provider": "Builtin", "method": "listBuiltins"},
    )
    assert data["platform"] == "host" and data["provider"] == "Builtin"
    names = [b["name"] for b in data["data"]["builtins"]]
    assert names == [
        "harness.define_tool",
        "harness.register_tool",
        "harness.handle",
        "ctx.tools.schemas",
        "ctx.tools.get",
        "ctx.tools.register",
        "ctx.get",
        "ctx.effect",
        "ctx.on",
        "ctx.once",
        "ctx.provide",
        "inject",
        "timer",
        "print",
    ]
    assert all(b["signature"] for b in data["data"]["builtins"])


async def test_builtins_name_the_typescript_facade_for_a_typescript_agent(
    cordis: CordisHarness,
) -> None:
    # A host half is in the agent's program language: so is the façade it is shown, and the
    # prompt section that teaches it.
    agent = await cordis.agent("maker", language="typescript")
    data = await cordis.ok(
        agent,
        "cordis_inspect_query",
        {"platform": "host", "provider": "Builtin", "method": "listBuiltins"},
    )
    names = [b["name"] for b in data["data"]["builtins"]]
    assert names[:3] == ["harness.defineTool", "harness.registerTool", "harness.handle"]
    assert "console" in names and "harness.define_tool" not in names
    prompt = await cordis.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=agent))
    assert "body of a TypeScript async function" in prompt.text
    assert "harness.defineTool({ name, description, parameters, execute })" in prompt.text
    python = await cordis.agent("snake")
    assert (
        "body of a Python async function"
        in (await cordis.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=python))).text
    )


async def test_tools_are_the_owners_visible_ones_including_dynamic(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    other = await cordis.agent("other")
    await cordis.define(agent)
    await cordis.run(agent, "clock-1", "pkg-1")
    mine = await _query(cordis, agent, "Tool", "listTools")
    mine_value: Any = jsonvalue.loads(mine.value_json)
    names = [t["name"] for t in mine_value["data"]["tools"]]
    assert "clock_now" in names and "cordis_define" in names and "run_code" not in names
    theirs = await _query(cordis, other, "Tool", "listTools", input={"tool": "clock_now"})
    assert theirs.is_error and theirs.error.message == 'no visible tool "clock_now"'
    one = await cordis.ok(
        agent,
        "cordis_inspect_query",
        {
            "platform": "host",
            "provider": "Tool",
            "method": "listTools",
            "input": {"tool": "clock_now"},
        },
    )
    assert one["data"]["tools"] == [
        {
            "name": "clock_now",
            "description": "The time.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": True},
            "outputSchema": {},
        }
    ]


async def test_services_and_events(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    provider = "async def apply(ctx):\n    ctx.provide('weather', object())\n\nreturn apply\n"
    await cordis.define(agent, provider, prefix="wthr")
    await cordis.run(agent, "wthr-1", "pkg-1")
    services = await cordis.ok(
        agent,
        "cordis_inspect_query",
        {"platform": "host", "provider": "Service", "method": "listService"},
    )
    assert services["data"] == {
        "services": [
            {"name": "timer", "providedBy": "builtin"},
            {"name": "weather", "providedBy": "wthr-1"},
        ]
    }
    timer = await cordis.ok(
        agent,
        "cordis_inspect_query",
        {
            "platform": "host",
            "provider": "Service",
            "method": "listService",
            "input": {"service": "timer"},
        },
    )
    assert "throttle" in timer["data"]["service"]["methods"]
    events = await cordis.ok(
        agent,
        "cordis_inspect_query",
        {"platform": "host", "provider": "Event", "method": "listEvents"},
    )
    names = [e["name"] for e in events["data"]["events"]]
    assert "tool/result" in names and not any(n.startswith("cordis/") for n in names)


async def test_query_refusals(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    unknown = await _query(cordis, agent, "Nope", "x")
    assert unknown.error.code == "provider-missing"
    assert unknown.error.message.startswith('no host Inspect Provider "Nope"; known: "Service"')
    no_method = await _query(cordis, agent, "Tool", "dropTools")
    assert no_method.error.message == (
        'host Inspect Provider "Tool" has no method "dropTools"; known: "listTools"'
    )
    bad_input = await _query(cordis, agent, "Tool", "listTools", input={"tool": 3})
    assert bad_input.error.code == "invalid-input"
    assert bad_input.error.message.startswith(
        "cordis_inspect_query input for Tool.listTools is invalid: "
    )
    client = await cordis.call(
        agent, "cordis_inspect_query", {"platform": "client", "provider": "Slots", "method": "x"}
    )
    assert client.error.code == "provider-missing"
    platform = await cordis.call(
        agent, "cordis_inspect_query", {"platform": "page", "provider": "Tool", "method": "x"}
    )
    assert platform.error.code == "INVALID_ARGS"


async def test_outputs_are_validated_and_manifests_checked() -> None:
    async def wrong(_input: JsonValue, _owner: str) -> JsonValue:
        return {"count": "three"}

    registry = InspectRegistry()
    registry.register_host(
        Provider(
            "Count",
            "Counts.",
            (
                Method(
                    "get",
                    "The count.",
                    {"type": "object"},
                    {"type": "object", "properties": {"count": {"type": "integer"}}},
                    wrong,
                ),
            ),
        )
    )
    with pytest.raises(Exception, match="returned output that does not match its schema"):
        await registry.query(
            "host",
            "Count",
            "get",
            input_value=None,
            owner="agents/a",
            signal=AbortController().signal,
        )
    with pytest.raises(ValueError, match="already registered"):
        registry.register_host(Provider("Count", "Again.", ()))
    with pytest.raises(ValueError, match="needs a non-empty description"):
        registry.register_host(Provider("Empty", " ", ()))
    with pytest.raises(ValueError, match='method "m" is declared twice'):
        registry.register_host(
            Provider("Dup", "d", (Method("m", "x", {}, {}), Method("m", "y", {}, {})))
        )
    with pytest.raises(ValueError, match="input schema is not supported"):
        registry.register_host(Provider("Bad", "b", (Method("m", "x", {"type": "date"}, {}),)))
    with pytest.raises(ValueError, match="appears twice"):
        registry.sync_client_manifest(
            "agents/a", [Provider("Slots", "s", ()), Provider("Slots", "t", ())]
        )
