"""Principal × tool × path: a tool call is allowed or refused by one rule whether it is made
directly, from a Python or a TypeScript `run_code` program, or by a plugin host
(registry_service/domain/tool_access.py). Real gRPC with TLS and JWTs, a real runtime (worker
processes, plugin hosts), the registry's own composition.

- `jwt:erin`: execute on the agents, no cordis; `jwt:frank`: execute and cordis;
  `cert:spiffe://codemode/pager`: a page runner, cordis only (it may start a host from a panel,
  and call none of the agent's tools).
- A tool the run's principal may not call is not one of its bindings (the program cannot name
  it; the runtime refuses a name outside them), nor in the SDK, prompt, wire schemas or tool
  list that principal gets. A binding call that reaches the registry anyway (a hostile
  runtime) is refused like the direct call and audited the same way.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from codemode_client.page_runner import PageRunner
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.cordis import prompt as cordis_prompt
from registry_service.server import RunningRegistry, start
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.auth.certs import Authority
from tests.auth.conftest import GRANTS, AuthRegistry, Signer, auth_settings
from tests.codemode.fake_runtime import CHANNELS, FakeRuntime, Step, serve
from tests.registry.conftest import echo_tool, error_info_of
from tests.registry.cordis.real_stack import NEEDS_NODE

pytestmark = pytest.mark.asyncio(loop_scope="module")

AGENTS = {"py": "python", "ts": "typescript"}
PAGER = "cert:spiffe://codemode/pager"
NESTED_GRANTS: list[dict[str, Any]] = [
    *GRANTS,
    {"principals": ["jwt:erin"], "permissions": ["execute"], "resources": ["agents/*"]},
    {"principals": ["jwt:frank"], "permissions": ["execute", "cordis"], "resources": ["agents/*"]},
    {"principals": [PAGER], "permissions": ["cordis"], "resources": ["agents/*"]},
]
MAY_USE_CORDIS = {"erin": False, "frank": True}
ORDINARY, CORDIS = "echo", "cordis_inspect_list"
DENIED_TEXT = "nested call refused: PERMISSION_DENIED"
CORDIS_TOOLS = (
    "cordis_define",
    "cordis_inspect_list",
    "cordis_inspect_query",
    "cordis_inspect_self",
    "cordis_run",
    "cordis_stop",
    "cordis_undefine",
)


def _settings(directory: Path, authority: Authority, signer: Signer, **extra: Any) -> Any:
    agents = [
        {"id": f"{name}{suffix}", "mode": "both", "code_language": language,
         "self_modification": True}
        for name, language in AGENTS.items()
        for suffix in ("", "-host", "-panel")
    ]  # fmt: skip
    return auth_settings(directory, authority, signer, grants=NESTED_GRANTS, agents=agents, **extra)


@dataclass
class Stack:
    auth: AuthRegistry
    running: RunningRegistry
    stubs: dict[str, tuple[Any, Any]]
    pager: grpc.aio.Channel | None = None  # a page runner's channel (PageRunnerService)

    def stub(self, who: str) -> tuple[Any, Any]:
        return self.stubs[who]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    tmp_path_factory: pytest.TempPathFactory, authority: Authority, signer: Signer
) -> AsyncIterator[Stack]:
    runtime = await start_runtime(
        RuntimeSettings(listen="127.0.0.1:0", pool_size=1, shutdown_grace_s=0.2)
    )
    directory = tmp_path_factory.mktemp("nested")
    settings = _settings(
        directory,
        authority,
        signer,
        runtime_targets=[runtime.address],
        runtime_languages=list(runtime.runtime.languages),
    )
    running = await start(settings)
    echo_tool(running.registry, ORDINARY)
    auth = AuthRegistry(running, authority, signer, directory)
    stubs = {
        "admin": auth.stub(cert="spiffe://codemode/admin"),
        "erin": auth.stub(bearer=signer.token("erin")),
        "frank": auth.stub(bearer=signer.token("frank")),
    }
    pem = authority.client(uri=PAGER.removeprefix("cert:"))
    pager = grpc.aio.secure_channel(
        f"localhost:{running.port}",
        grpc.ssl_channel_credentials(authority.pem, pem.key, pem.cert),
    )
    try:
        yield Stack(auth, running, stubs, pager)
    finally:
        await pager.close()
        await auth.close()
        await running.stop(0)
        await runtime.stop(0)


async def execute(
    caller: tuple[Any, Any], agent: str, tool: str, arguments: Any, call_id: str
) -> Any:
    """The result proto of one ExecuteToolCall by `caller` (stub, metadata); an RPC error
    raises."""
    stub, metadata = caller
    request = rpb.ExecuteToolCallRequest(
        agent=agent,
        call_id=call_id,
        tool_name=tool,
        arguments_json=json.dumps(arguments),
        progress_events=rpb.PROGRESS_EVENTS_NONE,
    )
    result = None
    async for response in stub.ExecuteToolCall(request, metadata=metadata, timeout=60):
        if response.HasField("result"):
            result = response.result
    assert result is not None
    return result


async def run_program(stack: Stack, who: str, agent: str, code: str, call_id: str) -> Any:
    result = await execute(
        stack.stub(who), agent, "run_code", {"code": code, "description": "probe"}, call_id
    )
    assert not result.is_error, result.error.message
    value: Any = jsonvalue.loads(result.value_json)
    return value["result"]


def probe(language: str, tool: str) -> str:
    """A program that reports whether `tool` is one of its bindings, and calls it if so."""
    if language == "python":
        return (
            f"if {tool!r} not in tools:\n"
            "    return {'bound': False}\n"
            f"await tools[{tool!r}]({{}})\n"
            "return {'bound': True}"
        )
    return (
        f"if (!Object.keys(tools).includes({tool!r})) return {{ bound: false }};\n"
        f"await tools[{tool!r}]({{}});\n"
        "return { bound: true };"
    )


async def denials(stack: Stack) -> list[dict[str, Any]]:
    """The `access/denied` records of the audit log (read by the manager), in order."""
    stub, metadata = stack.stub("admin")
    page = await stub.ListHistory(
        rpb.ListHistoryRequest(agent="", page_size=1000), metadata=metadata, timeout=10
    )
    out = []
    for record in page.records:
        if record.kind == "access/denied":
            assert (record.is_error, record.error_code) == (True, "PERMISSION_DENIED")
            out.append({**json.loads(record.arguments_json), "name": record.tool_name})
    return out


def _paths() -> list[Any]:
    return ["direct", "python", pytest.param("typescript", marks=NEEDS_NODE)]


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("tool", [ORDINARY, CORDIS])
@pytest.mark.parametrize("who", ["erin", "frank"])
async def test_principal_tool_path_matrix(stack: Stack, who: str, tool: str, path: str) -> None:
    allowed = tool == ORDINARY or MAY_USE_CORDIS[who]
    agent = "agents/ts" if path == "typescript" else "agents/py"
    call_id = f"m-{who}-{tool}-{path}"
    before = len(await denials(stack))
    if path == "direct" and not allowed:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await execute(stack.stub(who), agent, tool, {}, call_id)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        info = error_info_of(caught.value)
        assert info is not None and info.reason == "PERMISSION_DENIED"
        assert (info.metadata["permission"], info.metadata["resource"]) == ("cordis", agent)
        audited = (await denials(stack))[before:]
        assert [(d["principal"], d["tool"], d["via"], d["call_id"]) for d in audited] == [
            (f"jwt:{who}", tool, "direct", call_id)
        ]
        return
    if path == "direct":
        result = await execute(stack.stub(who), agent, tool, {}, call_id)
        assert not result.is_error, result.error.message
    else:
        value = await run_program(stack, who, agent, probe(path, tool), call_id)
        # Allowed: a binding, and the call succeeds. Refused: not even a binding of the run.
        assert value == {"bound": allowed}
    assert len(await denials(stack)) == before


@pytest.mark.parametrize("path", _paths()[1:])
async def test_an_execute_only_program_cannot_plant_a_tool(stack: Stack, path: str) -> None:
    """The attack: a principal refused `cordis_*` directly tries them from its program."""
    agent = "agents/ts" if path == "typescript" else "agents/py"
    registry = stack.running.registry
    tools_before = sorted(registry.catalog.view(agent).visible)
    if path == "python":
        code = (
            "out = []\n"
            "for name in ('cordis_define', 'cordis_run'):\n"
            "    try:\n"
            "        await tools[name]({'plugin': {'kind': 'new', 'idPrefix': 'spy'},"
            " 'name': 'Spy', 'purpose': 'p', 'code': {'host': 'return None'}})\n"
            "        out.append('called')\n"
            "    except Exception as e:\n"
            "        out.append(type(e).__name__)\n"
            "return {'out': out, 'bound': sorted(n for n in dir(tools) if n.startswith('cordis'))}"
        )
    else:
        code = (
            "const out: string[] = [];\n"
            "for (const name of ['cordis_define', 'cordis_run']) {\n"
            "  try {\n"
            "    await (tools as any)[name]({ plugin: { kind: 'new', idPrefix: 'spy' },"
            " name: 'Spy', purpose: 'p', code: { host: 'return null;' } });\n"
            "    out.push('called');\n"
            "  } catch (e) { out.push((e as Error).name); }\n"
            "}\n"
            "return { out, bound: Object.keys(tools).filter((n) => n.startsWith('cordis')) };"
        )
    value = await run_program(stack, "erin", agent, code, f"attack-{path}")
    assert "called" not in value["out"], value
    assert value["bound"] == []
    assert registry.cordis.runner.owned(agent) == []  # nothing defined, nothing running
    assert sorted(registry.catalog.view(agent).visible) == tools_before


@pytest.mark.parametrize("channel", CHANNELS)
async def test_a_binding_call_the_principal_may_not_make_is_refused_and_audited(
    tmp_path: Path, authority: Authority, signer: Signer, channel: str
) -> None:
    """A runtime that sends binding calls outside the run's bindings (a hostile runtime: a
    real one refuses them itself) reaches the registry's own check: refused like the direct
    call, with the same audit record, and nothing is planted."""
    define = {
        "plugin": {"kind": "new", "idPrefix": "spy"},
        "name": "Spy",
        "purpose": "p",
        "code": {"host": "return None"},
    }
    fake = FakeRuntime(
        steps=[
            Step(name="cordis_define", arguments_json=json.dumps(define)),
            Step(name=ORDINARY, arguments_json="{}"),
        ]
    )
    async with serve(fake) as address:
        running = await start(
            _settings(
                tmp_path, authority, signer, runtime_targets=[address], runtime_channel=channel
            )
        )
        echo_tool(running.registry, ORDINARY)
        auth = AuthRegistry(running, authority, signer, tmp_path)
        try:
            stubs = {
                "admin": auth.stub(cert="spiffe://codemode/admin"),
                "erin": auth.stub(bearer=signer.token("erin")),
            }
            stack = Stack(auth, running, stubs)
            tools_before = sorted(running.registry.catalog.view("agents/py").visible)
            erin = stack.stub("erin")
            await execute(erin, "agents/py", "run_code", {"code": "x", "description": "d"}, "r-1")
            refused, echoed = fake.results
            assert refused.error_message.startswith(f"{DENIED_TEXT}: jwt:erin may not cordis")
            assert echoed.value_json  # the run goes on: its next, allowed, call is answered
            assert running.registry.cordis.runner.owned("agents/py") == []
            assert sorted(running.registry.catalog.view("agents/py").visible) == tools_before
            # One audit record, of the same shape as a refused direct call's.
            with pytest.raises(grpc.aio.AioRpcError):
                await execute(erin, "agents/py", "cordis_define", define, "d-1")
            nested, direct = await denials(stack)
            assert nested.keys() == direct.keys()
            assert {k: nested[k] for k in ("principal", "permission", "resource", "tool")} == {
                k: direct[k] for k in ("principal", "permission", "resource", "tool")
            }
            assert (nested["via"], nested["parent_call_id"]) == ("run_code", "r-1")
            assert (direct["via"], direct["call_id"]) == ("direct", "d-1")
            assert "Spy" not in json.dumps(nested)  # never the call's arguments
        finally:
            await auth.close()
            await running.stop(0)


@pytest.mark.parametrize("who", ["erin", "frank"])
async def test_a_principal_is_shown_only_the_tools_it_may_call(stack: Stack, who: str) -> None:
    stub, metadata = stack.stub(who)
    scope = "agents/py"
    listed = await stub.ListVisibleTools(
        rpb.ListVisibleToolsRequest(scope=scope), metadata=metadata, timeout=10
    )
    sdk = await stub.GetSdk(ppb.GetSdkRequest(scope=scope), metadata=metadata, timeout=10)
    prompt = await stub.GetSystemPrompt(
        ppb.GetSystemPromptRequest(scope=scope), metadata=metadata, timeout=10
    )
    wire = await stub.GetWireSchemas(
        ppb.GetWireSchemasRequest(scope=scope), metadata=metadata, timeout=10
    )
    names = {t.name for t in listed.tools}
    expected_cordis = set(CORDIS_TOOLS) if MAY_USE_CORDIS[who] else set()
    assert names == {ORDINARY, "run_code", *expected_cordis}
    assert {s.name for s in wire.schemas} == names
    assert ("cordis_define" in sdk.text) is MAY_USE_CORDIS[who]
    assert f"def {ORDINARY}(" in sdk.text
    assert ("cordis_define" in prompt.text) is MAY_USE_CORDIS[who]
    assert (cordis_prompt.SECTION_ID in {s.id for s in prompt.sections}) is MAY_USE_CORDIS[who]


HOST = {
    "python": """\
async def apply(ctx):
    def seen(args):
        return sorted(t["name"] for t in ctx.tools.schemas())
    harness.register_tool(harness.define_tool(
        name="host_sees", description="What the host is shown.",
        parameters={"type": "object"}, execute=seen))

return apply
""",
    "typescript": """\
return async (ctx: any): Promise<void> => {
  harness.registerTool(harness.defineTool({
    name: "host_sees", description: "What the host is shown.", parameters: { type: "object" },
    execute: () => ctx.tools.schemas().map((t: { name: string }) => t.name).sort(),
  }));
};
""",
}


@pytest.mark.parametrize("language", ["python", pytest.param("typescript", marks=NEEDS_NODE)])
async def test_a_plugin_host_acts_as_the_principal_that_started_it(
    stack: Stack, language: str
) -> None:
    agent = "agents/py-host" if language == "python" else "agents/ts-host"
    define = {
        "plugin": {"kind": "new", "idPrefix": "probe"},
        "name": "Probe",
        "purpose": "p",
        "code": {"host": HOST[language]},
    }
    erin, frank = stack.stub("erin"), stack.stub("frank")
    # Who may not use Cordis cannot start a host: refused directly (and has no binding).
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await execute(erin, agent, "cordis_define", define, f"h-erin-{language}")
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert stack.running.registry.cordis.runner.owned(agent) == []
    # Who may starts one; the host is shown what its principal may call (Cordis included).
    defined = await execute(frank, agent, "cordis_define", define, f"h-def-{language}")
    assert not defined.is_error, defined.error.message
    receipt: Any = jsonvalue.loads(defined.value_json)
    ran = await execute(
        frank,
        agent,
        "cordis_run",
        {"pluginId": receipt["pluginId"], "packageId": receipt["packageId"], "mode": "run"},
        f"h-run-{language}",
    )
    assert not ran.is_error, ran.error.message
    seen = await execute(frank, agent, "host_sees", {}, f"h-call-{language}")
    assert not seen.is_error, seen.error.message
    assert jsonvalue.loads(seen.value_json) == sorted([ORDINARY, *CORDIS_TOOLS])
    # A dynamic tool is an ordinary tool of the agent: execute is enough to call it.
    called = await execute(erin, agent, "host_sees", {}, f"h-erin-call-{language}")
    assert not called.is_error, called.error.message
    with contextlib.suppress(Exception):
        await execute(
            frank, agent, "cordis_stop", {"pluginId": receipt["pluginId"]}, f"h-stop-{language}"
        )


@pytest.mark.parametrize("language", ["python", pytest.param("typescript", marks=NEEDS_NODE)])
async def test_a_host_started_from_a_panel_acts_as_its_page_runner(
    stack: Stack, language: str
) -> None:
    """A page runner holds cordis but not execute: the host its panel starts is shown none of
    the agent's tools (one that `cordis_run` by frank starts is shown them all, above)."""
    agent = "agents/py-panel" if language == "python" else "agents/ts-panel"
    frank = stack.stub("frank")
    define = {
        "plugin": {"kind": "new", "idPrefix": "probe"},
        "name": "Probe",
        "purpose": "p",
        "code": {"host": HOST[language]},
    }
    defined = await execute(frank, agent, "cordis_define", define, f"p-def-{language}")
    assert not defined.is_error, defined.error.message
    receipt: Any = jsonvalue.loads(defined.value_json)
    assert stack.pager is not None
    async with PageRunner(stack.pager, agent) as page:
        started = await page.panel_run(receipt["pluginId"], receipt["packageId"])
        assert started.accepted, started.message
        seen = await execute(frank, agent, "host_sees", {}, f"p-call-{language}")
        assert not seen.is_error, seen.error.message
        assert jsonvalue.loads(seen.value_json) == []
        await page.stop(receipt["pluginId"])
