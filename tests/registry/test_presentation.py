"""Presentation over gRPC: wire schemas, system-prompt assembly, SDK text.

An assemble-listener rewrite has no counterpart (the registry exposes no prompt listener
API); its adaptation is the code-mode filtering step plus configured deployment sections, and a
scope's own mode changing the sections.
"""

from __future__ import annotations

import json
from typing import Any

import grpc

from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.scopes import Mode
from registry_service.presentation.assembly import CODE_ONLY_TEXT
from tests.registry.conftest import BOTH, CODE, NATIVE, Harness, echo_tool
from tests.registry.test_scopes import expect_error

PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
LANGS = ["python", "typescript"]
HOUSE = {"id": "house", "order": 110, "text": "House rules: be brief."}


def _tools(h: Harness, scope: str = "") -> None:
    echo_tool(h.registry, "read", scope=scope, guidance="Read before you write.")
    echo_tool(h.registry, "write", scope=scope, guidance="Write only inside the workspace.")


async def wire(h: Harness, scope: str = "", language: str = "") -> ppb.GetWireSchemasResponse:
    response: ppb.GetWireSchemasResponse = await h.stub.GetWireSchemas(
        ppb.GetWireSchemasRequest(scope=scope, language=language)
    )
    return response


async def prompt(h: Harness, scope: str = "", language: str = "") -> ppb.GetSystemPromptResponse:
    response: ppb.GetSystemPromptResponse = await h.stub.GetSystemPrompt(
        ppb.GetSystemPromptRequest(scope=scope, language=language)
    )
    return response


async def sdk(h: Harness, scope: str = "", language: str = "") -> ppb.GetSdkResponse:
    response: ppb.GetSdkResponse = await h.stub.GetSdk(
        ppb.GetSdkRequest(scope=scope, language=language)
    )
    return response


def ids(response: ppb.GetSystemPromptResponse) -> list[str]:
    return [s.id for s in response.sections]


async def test_wire1_native_needs_no_runtime(make_registry: Any) -> None:
    async with make_registry(runtime_languages=[], prompt_sections=[HOUSE]) as h:
        _tools(h)
        got = await wire(h)
        assert [s.name for s in got.schemas] == ["read", "write"]
        assert got.effective_mode == NATIVE and got.language == ""
        assert json.loads(got.schemas[0].parameters_json) == {"type": "object"}
        assert got.schemas[0].description == "read tool"
        text = await prompt(h)
        assert ids(text) == ["house", "tool:read", "tool:write"]
        assert text.text == (
            "House rules: be brief.\n\nRead before you write.\n\nWrite only inside the workspace."
        )
        empty = await sdk(h, language="python")  # native: language not consulted
        assert (empty.text, empty.language, empty.effective_mode) == ("", "", NATIVE)


async def test_wire2_wire3_code_only_rule_sdk_and_guidance_filtered(make_registry: Any) -> None:
    async with make_registry(
        default_mode=Mode.CODE, runtime_languages=LANGS, prompt_sections=[HOUSE]
    ) as h:
        _tools(h)
        got = await wire(h, language="typescript")
        assert [s.name for s in got.schemas] == ["run_code"]
        assert json.loads(got.schemas[0].parameters_json)["required"] == ["code", "description"]
        text = await prompt(h, language="typescript")
        # code-only rule first, before the 100-band section and the SDK; no tool:* guidance.
        assert ids(text) == ["tools:code-only", "house", "tools:sdk"]
        assert [s.order for s in text.sections] == [99, 110, 150]
        assert text.sections[0].text == CODE_ONLY_TEXT
        assert "Read before you write." not in text.text
        body = text.sections[2].text
        assert "declare const tools: {" in body and "  read: " in body and "  write: " in body
        assert "run_code:" not in body
        assert text.text == "\n\n".join(s.text for s in text.sections)


async def test_wire4_both_keeps_guidance_and_renders_rule_empty(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.BOTH, prompt_sections=[HOUSE]) as h:
        _tools(h)
        got = await wire(h)
        assert [s.name for s in got.schemas] == ["read", "write", "run_code"]
        assert got.effective_mode == BOTH and got.language == "python"
        text = await prompt(h)
        assert ids(text) == ["house", "tool:read", "tool:write", "tools:sdk"]
        assert CODE_ONLY_TEXT not in text.text
        assert "```python" in text.sections[-1].text


async def test_wire5_deep_one_of_output_schema(make_registry: Any) -> None:
    deep: Any = {"type": "string"}
    for _ in range(5000):
        deep = {"oneOf": [deep, {"type": "null"}]}
    async with make_registry(default_mode=Mode.CODE, runtime_languages=LANGS) as h:
        echo_tool(h.registry, "deep", output_schema=deep)
        for language in LANGS:
            got = await sdk(h, language=language)
            assert got.language == language and "deep" in got.text


async def test_wire6_a_scopes_own_mode_changes_the_sections(make_registry: Any) -> None:
    async with make_registry(prompt_sections=[HOUSE]) as h:
        _tools(h)
        coder = await h.agent("coder", mode=CODE)
        mixed = await h.agent("mixed", mode=BOTH)
        plain = await h.agent("plain")
        assert ids(await prompt(h, coder)) == ["tools:code-only", "house", "tools:sdk"]
        assert ids(await prompt(h, mixed)) == ["house", "tool:read", "tool:write", "tools:sdk"]
        assert ids(await prompt(h, plain)) == ["house", "tool:read", "tool:write"]
        assert [s.name for s in (await wire(h, plain)).schemas] == ["read", "write"]
        assert (await sdk(h, plain)).text == ""


async def test_wire7_run_code_is_reserved_unrestrictable_and_never_a_binding(
    make_registry: Any,
) -> None:
    async with make_registry(
        default_mode=Mode.BOTH, runtime_languages=LANGS, tool_order=["run_code", "write"]
    ) as h:
        _tools(h)
        echo_tool(h.registry, "search")
        allowed = await h.agent("allowed")
        denied = await h.agent("denied")
        await h.stub.AddRestriction(rpb.AddRestrictionRequest(scope=allowed, allow=["read"]))
        await h.stub.AddRestriction(rpb.AddRestrictionRequest(scope=denied, deny=["read"]))
        # tool_order places run_code first, then write; the rest by name.
        assert [s.name for s in (await wire(h, allowed)).schemas] == ["run_code", "read"]
        assert [s.name for s in (await wire(h, denied)).schemas] == [
            "run_code",
            "write",
            "search",
        ]
        await expect_error(
            h.stub.AddRestriction(rpb.AddRestrictionRequest(scope=allowed, deny=["run_code"])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "RESERVED_TOOL_NAME",
        )
        for language, needle in (("python", "def run_code"), ("typescript", "run_code:")):
            text = (await sdk(h, denied, language)).text
            assert needle not in text and "search" in text


async def test_wire8_sdk_and_prompt_byte_identical(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.CODE) as h:
        _tools(h)
        first, second = await sdk(h), await sdk(h)
        assert first.text == second.text and first.language == "python"
        assert (await prompt(h)).text == (await prompt(h)).text


async def test_cache_invalidates_per_agent_tool_set(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.CODE) as h:
        _tools(h)
        alice, bob = await h.agent("alice"), await h.agent("bob")
        before_a, before_b = (await sdk(h, alice)).text, (await sdk(h, bob)).text
        renders = h.registry.assembler.renders
        assert renders == 1  # identical tool sets share one rendered text
        echo_tool(h.registry, "alice_only", scope=alice)
        after_a, after_b = (await sdk(h, alice)).text, (await sdk(h, bob)).text
        assert after_a != before_a and "alice_only" in after_a
        assert after_b == before_b and "alice_only" not in after_b
        assert h.registry.assembler.renders == renders + 1  # bob's text was not re-rendered
        prompt_a = await prompt(h, alice)
        assert prompt_a.sections[-1].text == after_a


async def test_wire9_no_runtime_rejects_every_non_native_assembly(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.CODE, runtime_languages=[]) as h:
        _tools(h)
        both = await h.agent("both-agent", mode=BOTH)
        for scope, mode in (("", "code"), (both, "both")):
            for call in (wire(h, scope), prompt(h, scope), sdk(h, scope, "python")):
                message = await expect_error(call, PRECONDITION, "CODE_RUNTIME_UNAVAILABLE")
                assert message == (
                    f'mode "{mode}" requires a code runtime — configure runtime_languages or '
                    'set the mode to "native"'
                )
        # The catalog's run_code degrades to the TypeScript flavour with no runtime.
        listed = await h.stub.ListVisibleTools(rpb.ListVisibleToolsRequest())
        run_code = next(t for t in listed.tools if t.name == "run_code")
        assert run_code.description.startswith("Execute a TypeScript program")


async def test_wire9_unknown_or_unconfigured_language(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.BOTH, runtime_languages=["cobol", "python"]) as h:
        for call in (wire(h), prompt(h), sdk(h)):
            message = await expect_error(call, PRECONDITION, "UNKNOWN_RUNTIME_LANGUAGE")
            assert message == (
                'mode "both": no SDK renderer registered for runtime language "cobol" '
                '(known: "monty", "python", "typescript")'
            )
        assert (await sdk(h, language="python")).language == "python"
        message = await expect_error(
            sdk(h, language="typescript"), PRECONDITION, "RUNTIME_LANGUAGE_NOT_CONFIGURED"
        )
        assert message == (
            'mode "both": runtime language "typescript" is not configured '
            '(configured: "cobol", "python")'
        )


async def test_wire9_language_picks_renderer_and_run_code_flavour(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.CODE, runtime_languages=LANGS) as h:
        _tools(h)
        coder_both = await h.agent("mixed", mode=BOTH)
        for scope in ("", coder_both):
            for language, word, fence in (
                ("python", "Python", "```python"),
                ("typescript", "TypeScript", "```ts"),
            ):
                schemas = (await wire(h, scope, language)).schemas
                assert schemas[-1].name == "run_code"
                assert schemas[-1].description.startswith(f"Execute a {word} program")
                code = json.loads(schemas[-1].parameters_json)["properties"]["code"]
                assert code["description"] == f"The program: the body of an async {word} function."
                got = await sdk(h, scope, language)
                assert got.language == language and fence in got.text
                assert fence in (await prompt(h, scope, language)).text
        # Empty language = the first configured one, for every RPC.
        assert (await prompt(h)).language == (await wire(h)).language == "python"


async def test_wire10_tool_order_outside_the_known_set(make_registry: Any) -> None:
    async with make_registry(tool_order=["write"], runtime_languages=LANGS) as h:
        _tools(h)
        coder = await h.agent("coder", mode=CODE)
        for call in (wire(h, coder), prompt(h, coder)):
            message = await expect_error(call, PRECONDITION, "TOOL_ORDER_UNKNOWN_TOOL")
            assert message == (
                'mode "code": tool_order lists tool(s) unknown to scope "agents/coder": "write"; '
                'known tools: "run_code"'
            )
        assert "write" in (await sdk(h, coder)).text  # the SDK does not depend on tool_order
        # Native: write is known, so it leads the guidance and the wire.
        assert ids(await prompt(h)) == ["tool:write", "tool:read"]
        assert [s.name for s in (await wire(h)).schemas] == ["write", "read"]
        ghost = await h.agent("ghost")
        await h.stub.AddRestriction(rpb.AddRestrictionRequest(scope=ghost, deny=["write"]))
        assert [s.name for s in (await wire(h, ghost)).schemas] == ["read"]  # still legal


async def test_wire10_disposal_removes_run_code_and_sdk(make_registry: Any) -> None:
    async with make_registry() as h:
        _tools(h)
        preset = await h.preset("coders", mode=CODE)
        agent = await h.agent("worker", preset=preset)
        assert [s.name for s in (await wire(h, agent)).schemas] == ["run_code"]
        assert (await sdk(h, agent)).text
        await h.stub.DeleteAgent(rpb.DeleteAgentRequest(name=agent))
        await expect_error(sdk(h, agent), grpc.StatusCode.NOT_FOUND, "AGENT_NOT_FOUND")
        agent = await h.agent("worker")
        assert [s.name for s in (await wire(h, agent)).schemas] == ["read", "write"]
        assert "tools:sdk" not in ids(await prompt(h, agent))
        assert (await sdk(h, agent)).text == ""


async def test_bad_scopes(harness: Harness) -> None:
    await expect_error(
        prompt(harness, "agents/nobody"), grpc.StatusCode.NOT_FOUND, "AGENT_NOT_FOUND"
    )
    await expect_error(
        wire(harness, "nonsense"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_RESOURCE_NAME"
    )


async def test_assemble_hooks_are_authoritative_and_scoped(harness: Harness) -> None:
    """An assemble hook's rewrite stands; an agent's hook can shadow the SDK section."""
    from registry_service.presentation.assembly import Section

    echo_tool(harness.registry, "read", guidance="Use read for files.")
    coder = await harness.agent("coder", mode=BOTH)
    other = await harness.agent("other", mode=BOTH)

    def drop_guidance(scope: str, sections: list[Section]) -> list[Section]:
        return [s for s in sections if s.id != "tool:read"] + [Section("house", 10, "House rules.")]

    def own_sdk(scope: str, sections: list[Section]) -> list[Section]:
        return [
            Section(s.id, s.order, "custom sdk") if s.id == "tools:sdk" else s for s in sections
        ]

    harness.registry.catalog.hooks("").prompt.append(drop_guidance)
    harness.registry.catalog.hooks(coder).prompt.append(own_sdk)
    mine = await harness.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=coder))
    theirs = await harness.stub.GetSystemPrompt(ppb.GetSystemPromptRequest(scope=other))
    assert [s.id for s in mine.sections] == ["tools:sdk", "house"]  # the hook's order stands
    assert {s.id: s.text for s in mine.sections}["tools:sdk"] == "custom sdk"
    assert "tool:read" not in [s.id for s in theirs.sections]
    assert {s.id: s.text for s in theirs.sections}["tools:sdk"] != "custom sdk"
