"""The program language travels: declared like the mode (deployment default, preset, agent;
nearest wins), visible on Agent/Preset, choosing the run_code flavour, SDK and prompt, sent on
every Run, and refused with FAILED_PRECONDITION where no runtime serves it."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from codemode_wire.api.registry.v1 import presentation_pb2, scope_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.config import RegistrySettings
from registry_service.domain.scopes import Mode
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.codemode.conftest import Stack, value_of
from tests.registry.conftest import BOTH, CODE, Harness
from tests.registry.cordis.real_stack import NEEDS_NODE

BOTH_LANGUAGES = ["python", "typescript"]


async def _create_agent(h: Harness, agent_id: str, preset: str = "", language: str = "") -> Any:
    agent = scope_pb2.Agent(preset=preset, mode=CODE, code_language=language)
    response = await h.stub.CreateAgent(rpb.CreateAgentRequest(agent_id=agent_id, agent=agent))
    return response.agent


async def _create_preset(h: Harness, preset_id: str, language: str) -> Any:
    preset = scope_pb2.Preset(code_language=language)
    request = rpb.CreatePresetRequest(preset_id=preset_id, preset=preset)
    return (await h.stub.CreatePreset(request)).preset


async def test_nearest_declaration_wins_and_is_visible(make_registry: Any) -> None:
    settings = {"default_mode": Mode.CODE, "runtime_languages": BOTH_LANGUAGES}
    async with make_registry(code_language="typescript", **settings) as h:
        preset = await _create_preset(h, "py-team", "python")
        assert preset.code_language == "python"
        plain = await _create_agent(h, "plain")
        inherits = await _create_agent(h, "inherits", preset=preset.name)
        overrides = await _create_agent(h, "overrides", preset=preset.name, language="typescript")
        got = {
            a.name: (a.code_language, a.effective_code_language)
            for a in (plain, inherits, overrides)
        }
        assert got == {
            "agents/plain": ("", "typescript"),  # the deployment default
            "agents/inherits": ("", "python"),  # the preset's
            "agents/overrides": ("typescript", "typescript"),  # its own
        }
        fetched = await h.stub.GetAgent(rpb.GetAgentRequest(name="agents/inherits"))
        assert fetched.agent.effective_code_language == "python"
        listed = await h.stub.ListPresets(rpb.ListPresetsRequest())
        assert [p.code_language for p in listed.presets] == ["python"]


async def test_flavour_sdk_and_prompt_follow_the_scope_language(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.CODE, runtime_languages=BOTH_LANGUAGES) as h:
        py = (await _create_agent(h, "py", language="python")).name
        ts = (await _create_agent(h, "ts", language="typescript")).name
        cases = ((py, "python", "Python", "```python"), (ts, "typescript", "TypeScript", "```ts"))
        for scope, language, word, fence in cases:
            wire = await h.stub.GetWireSchemas(presentation_pb2.GetWireSchemasRequest(scope=scope))
            assert wire.language == language
            (run_code,) = wire.schemas
            assert run_code.description.startswith(f"Execute a {word} program")
            sdk = await h.stub.GetSdk(presentation_pb2.GetSdkRequest(scope=scope))
            assert sdk.language == wire.language
            prompt = await h.stub.GetSystemPrompt(
                presentation_pb2.GetSystemPromptRequest(scope=scope)
            )
            assert prompt.language == wire.language and fence in prompt.text
        # An explicit language in the request still wins over the scope's.
        asked = await h.stub.GetSdk(presentation_pb2.GetSdkRequest(scope=py, language="typescript"))
        assert asked.language == "typescript"


async def test_an_unknown_language_is_refused_and_creates_nothing(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.CODE) as h:
        for create in (
            _create_agent(h, "cobol-agent", language="cobol"),
            _create_preset(h, "cobol-preset", "cobol"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await create
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "UNKNOWN_CODE_LANGUAGE" in str(refused.value.trailing_metadata())
        assert not (await h.stub.ListAgents(rpb.ListAgentsRequest())).agents
        assert not (await h.stub.ListPresets(rpb.ListPresetsRequest())).presets


async def test_settings_declare_languages_and_bad_ones_stop_the_start(
    make_registry: Any,
) -> None:
    declared = {
        "presets": [{"id": "ts-team", "code_language": "typescript"}],
        "agents": [
            {"id": "member", "preset": "ts-team"},
            {"id": "solo", "code_language": "python"},
        ],
        "runtime_languages": BOTH_LANGUAGES,
        "default_mode": Mode.CODE,
    }
    async with make_registry(**declared) as h:
        member = await h.stub.GetAgent(rpb.GetAgentRequest(name="agents/member"))
        solo = await h.stub.GetAgent(rpb.GetAgentRequest(name="agents/solo"))
        assert (member.agent.effective_code_language, solo.agent.code_language) == (
            "typescript",
            "python",
        )
    from codemode_common.settings import ConfigError
    from registry_service.config import RegistrySettings
    from registry_service.registry import build_registry

    with pytest.raises(ValueError, match="code_language 'cobol'"):
        RegistrySettings(code_language="cobol")
    bad = RegistrySettings(agents=[{"id": "x", "code_language": "cobol"}], history_path=":memory:")
    with pytest.raises(ConfigError, match=r"not a program language"):
        build_registry(bad)


async def test_a_language_no_runtime_serves_fails_assembly_and_execution(
    make_stack: Any,
) -> None:
    async with make_stack(runtime_languages=["python"]) as stack:  # a restriction
        ts = (await _create_agent(stack, "ts-only", language="typescript")).name
        with pytest.raises(grpc.aio.AioRpcError) as assembly:
            await stack.stub.GetSystemPrompt(presentation_pb2.GetSystemPromptRequest(scope=ts))
        assert assembly.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert 'mode "code": runtime language "typescript"' in (assembly.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as execution:
            await stack.run_code("return 1", agent=ts)
        assert execution.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert 'runtime language "typescript"' in (execution.value.details() or "")
        history = await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=ts))
        assert list(history.records) == []  # refused before the call existed


async def test_run_code_sends_the_scope_language_to_the_runtime(make_stack: Any) -> None:
    """Both languages are served: a program that only one of them can run succeeds for the
    agent of that language and fails for the other, so the language travelled on Run."""
    async with make_stack(runtime_languages=BOTH_LANGUAGES) as stack:
        py = (await _create_agent(stack, "py-runner", language="python")).name
        ts = (await _create_agent(stack, "ts-runner", language="typescript")).name
        _events, ok = await stack.run_code("return 6 * 7", agent=py)
        assert value_of(ok) == {"logs": [], "result": 42}
        typed = "const x: number = 6 * 7;\nreturn x;"
        _events, ok = await stack.run_code(typed, agent=ts, call_id="call-ts")
        assert value_of(ok) == {"logs": [], "result": 42}
        _events, refused = await stack.run_code(typed, agent=py, call_id="call-py")
        assert refused.is_error
        assert "SyntaxError" in refused.error.message, refused.error.message


async def test_without_runtime_languages_the_registry_serves_what_the_runtime_does(
    make_stack: Any,
) -> None:
    """A registry configured without `runtime_languages` (as `codemode up --config-registry`
    with a file that does not set it) asks its runtime: a TypeScript agent gets its SDK and
    runs, because the runtime serves TypeScript."""
    async with make_stack() as stack:
        ts = (await _create_agent(stack, "ts-asks", language="typescript")).name
        sdk = await stack.stub.GetSdk(presentation_pb2.GetSdkRequest(scope=ts))
        assert sdk.language == "typescript"
        _events, result = await stack.run_code("const n: number = 2; return n + 1;", agent=ts)
        assert not result.is_error, result.error.message
        assert value_of(result)["result"] == 3


async def test_a_language_the_runtime_does_not_serve_is_refused_naming_the_served(
    make_stack: Any,
) -> None:
    """The runtime serves Python only (its `languages` setting); the registry, not restricted,
    refuses a TypeScript agent with FAILED_PRECONDITION naming what is served."""
    async with make_stack(runtime_settings={"languages": ["python"]}) as stack:
        ts = (await _create_agent(stack, "ts-unserved", language="typescript")).name
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stack.stub.GetSdk(presentation_pb2.GetSdkRequest(scope=ts))
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        details = refused.value.details() or ""
        assert 'runtime language "typescript" is not served' in details
        assert '(served: "python")' in details
        py = (await _create_agent(stack, "py-served", language="python")).name
        _events, two = await stack.run_code("return 1 + 1", agent=py)
        assert value_of(two)["result"] == 2


@NEEDS_NODE
async def test_runtimes_serving_different_languages_each_get_their_own_work() -> None:
    """One registry, two runtime targets: one serves Python only, the other TypeScript only.
    Every run, plugin host and define-time check goes to the one that serves its language
    (spread by language, not by turn: a run sent to the other would be refused)."""
    only_python = await start_runtime(
        RuntimeSettings(listen="127.0.0.1:0", pool_size=1, languages=["python"])
    )
    only_typescript = await start_runtime(
        RuntimeSettings(listen="127.0.0.1:0", pool_size=1, languages=["typescript"])
    )
    config = RegistrySettings(
        listen="127.0.0.1:0",
        history_path=":memory:",
        default_mode=Mode.CODE,
        runtime_targets=[only_python.address, only_typescript.address],
    )
    registry = await start_registry(config, build_registry(config))
    channel = grpc.aio.insecure_channel(registry.address)
    stack = Stack(registry, channel)
    try:
        names = []
        for language in ("python", "typescript"):
            agent = scope_pb2.Agent(mode=BOTH, code_language=language, self_modification=True)
            request = rpb.CreateAgentRequest(agent_id=language[:2], agent=agent)
            names.append((await stack.stub.CreateAgent(request)).agent.name)
        py, ts = names
        for scope, language in ((py, "python"), (ts, "typescript")):
            sdk = await stack.stub.GetSdk(presentation_pb2.GetSdkRequest(scope=scope))
            assert sdk.language == language  # both served, by different runtimes
        for n in range(4):  # in turn, half of each would reach the wrong runtime
            _e, python_run = await stack.run_code(f"return {n}", agent=py, call_id=f"p{n}")
            assert value_of(python_run)["result"] == n, python_run.error.message
            _e, ts_run = await stack.run_code(
                f"const n: number = {n}; return n;", agent=ts, call_id=f"t{n}"
            )
            assert value_of(ts_run)["result"] == n, ts_run.error.message
        # A define's halves are parsed where they would run: a TypeScript host half and a
        # client half (JavaScript) by the TypeScript runtime's Node workers, a Python host
        # half by the Python runtime.
        good = {"python": "return {}", "typescript": "return {};"}
        for scope, language, host in (
            (ts, "typescript", "let x: number = 1;\ndelete x;"),
            (py, "python", "x = (1,\n"),
        ):
            for code, half in (
                ({"host": host}, "code.host"),
                ({"host": good[language], "client": "const a = (1 as number)"}, "code.client"),
            ):
                _e, bad = await stack.execute(
                    "cordis_define",
                    {
                        "plugin": {"kind": "new", "idPrefix": "plug"},
                        "name": "n",
                        "purpose": "p",
                        "code": code,
                    },
                    agent=scope,
                )
                assert bad.is_error and bad.error.code == "syntax-error", bad.error.message
                assert bad.error.message.startswith(f"cordis_define {half} does not parse")
    finally:
        await channel.close()
        await registry.stop(0)
        await only_python.stop(0)
        await only_typescript.stop(0)
