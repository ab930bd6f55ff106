"""Both plugin host harnesses against the one façade specification, through
``RuntimeService.Host``.

``codemode_wire/host_facade.json`` specifies the façade; ``host_facade_corpus.jsonl`` (beside this
file) holds its conformance cases: a host half per language, what its start registers, then
invocations (tools, handlers, events, service methods, service changes) with the value or the
error each one ends with, and the log lines of the retract. Expected errors name the
specification's texts (``{"spec": "member:harness.define_tool#name"}``), so the corpus and the
harnesses are held to the same file. Every case runs in every language it is written for.

A second test opens the objects each harness hands to the host half (its globals, ``harness``,
``ctx``, ``ctx.tools``, ``ctx.timer``, ``console``) from inside a real host half and compares
their members with the specification's: no more, no fewer. The registry's description of the
façade is held to the same file by tests/registry/cordis/test_facade_description.py.

To add a member: specify it in ``host_facade.json``, implement it in both harnesses, describe it
in the registry, and add a case (or a step) here that ``covers`` it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from codemode_wire.host_facade import FacadeError, HostFacade, load
from runtime_service.languages import typescript
from runtime_service.worker_process import WorkerSpec
from tests.runtime.conftest import child_pids, connected, grpc_settings, serving

FACADE: HostFacade = load()
CORPUS_FILE = Path(__file__).with_name("host_facade_corpus.jsonl")
CASES: list[dict[str, Any]] = [
    json.loads(line) for line in CORPUS_FILE.read_text(encoding="utf-8").splitlines() if line
]
NEEDS_NODE = pytest.mark.skipif(
    typescript.BACKEND.unavailable(WorkerSpec()) is not None, reason="no Node 20+ on this host"
)
PLUGIN_ID = "facade-1"
TAG = f"[cordis:{PLUGIN_ID}] "
# A guard against a harness that never answers, not a measurement: the test fails instead.
NO_ANSWER_S = 60.0


def _language_param(language: str) -> Any:
    return pytest.param(language, marks=NEEDS_NODE) if language == "typescript" else language


def _spec_error(ref: str) -> FacadeError:
    """``member:<name>#<id>``, ``object:<path>#<id>``, ``host_half#<id>``, ``invocations#<id>``."""
    where, error_id = ref.split("#", 1)
    if where == "host_half":
        errors = FACADE.host_half_errors
    elif where == "invocations":
        errors = FACADE.invocation_errors
    elif where.startswith("member:"):
        member = FACADE.member(where.removeprefix("member:"))
        found = member.error(error_id)
        return FACADE.member(found.same_as).error(error_id) if found.same_as else found
    elif where.startswith("object:"):
        errors = FACADE.object(where.removeprefix("object:")).errors
    else:
        raise AssertionError(f"unknown error reference {ref!r}")
    (found,) = [e for e in errors if e.id == error_id]
    return found


def _text(expected: Any, language: str) -> str:
    """An expected text: a string, one per language, or a reference to the specification's."""
    if isinstance(expected, str):
        return expected
    if "spec" in expected:
        error = _spec_error(expected["spec"])
        assert language in error.languages, f"{expected['spec']} is not {language}'s"
        return error.text_for(language, **expected.get("fill", {}))
    text = expected[language]
    assert isinstance(text, str)
    return text


class Host:
    """One Host stream: requests in, responses read in order (logs set aside, untagged)."""

    def __init__(self, stub: runtime_pb2_grpc.RuntimeServiceStub, language: str) -> None:
        self.call = stub.Host()
        self.language = language
        self.logs: list[str] = []
        self.changes: list[runtime_pb2.HostRegistrations] = []

    async def next(self) -> runtime_pb2.HostResponse:
        """The next response that is not a log line (``changed`` ones are kept, then skipped)."""
        while True:
            message: runtime_pb2.HostResponse = await asyncio.wait_for(
                self.call.read(), NO_ANSWER_S
            )
            assert message is not grpc.aio.EOF, "the stream ended"
            kind = message.WhichOneof("kind")
            if kind == "log":
                text = message.log.text
                assert text.startswith(TAG), text
                self.logs.append(text.removeprefix(TAG))
            elif kind == "changed":
                self.changes.append(message.changed)
            else:
                return message

    async def write(self, **request: Any) -> None:
        await self.call.write(runtime_pb2.HostRequest(**request))

    async def result(self, invocation: int) -> runtime_pb2.HostInvokeResult:
        message = await self.next()
        assert message.WhichOneof("kind") == "result", message
        assert message.result.invocation_id == invocation, message
        return message.result


def _services(raw: list[dict[str, Any]]) -> list[runtime_pb2.HostService]:
    return [runtime_pb2.HostService(**item) for item in raw]


def _check_registrations(
    regs: runtime_pb2.HostRegistrations, expected: dict[str, Any], where: str
) -> None:
    if "tools" in expected:
        assert [t.name for t in regs.tools] == expected["tools"], where
    for field in ("handlers", "provides", "events", "waiting_for"):
        if field in expected:
            assert list(getattr(regs, field)) == expected[field], (where, field)
    if "services" in expected:
        got = [
            {"name": s.name, "methods": list(s.methods), "data_json": s.data_json}
            for s in regs.services
        ]
        assert got == expected["services"], where


def _check_outcome(
    result: runtime_pb2.HostInvokeResult, step: dict[str, Any], language: str, where: str
) -> None:
    if "error" in step:
        assert result.error_message == _text(step["error"], language), where
        assert not result.HasField("value_json"), where
        assert result.method_not_found is step.get("not_found", False), where
        assert result.cancelled is step.get("cancelled", False), where
    else:
        assert result.HasField("value_json"), (where, result.error_message)
        assert json.loads(result.value_json) == step["value"], where


async def _run_step(host: Host, step: dict[str, Any], invocation: int, where: str) -> None:
    changes_before = len(host.changes)
    if "services" in step:
        await host.write(services=runtime_pb2.HostServices(services=_services(step["services"])))
        wanted = step["changed_waiting_for"]
        # Parking takes several changes (tools, services withdrawn): up to the one that parks.
        while len(host.changes) == changes_before or list(host.changes[-1].waiting_for) != wanted:
            message = await asyncio.wait_for(host.call.read(), NO_ANSWER_S)
            assert message is not grpc.aio.EOF, where
            if message.WhichOneof("kind") == "changed":
                host.changes.append(message.changed)
    else:
        args = json.dumps(step.get("args", {}))
        if "invoke" in step:
            invoke = runtime_pb2.HostInvoke(tool_name=step["invoke"], arguments_json=args)
        elif "handler" in step:
            invoke = runtime_pb2.HostInvoke(handler_method=step["handler"], arguments_json=args)
        elif "event" in step:
            invoke = runtime_pb2.HostInvoke(event=step["event"], arguments_json=args)
        else:
            invoke = runtime_pb2.HostInvoke(
                service=step["service"], tool_name=step["method"], arguments_json=args
            )
        invoke.invocation_id = invocation
        await host.write(invoke=invoke)
        if "cancel_after" in step:
            # The invocation is running once a later one, queued behind it, has answered.
            barrier = runtime_pb2.HostInvoke(
                invocation_id=invocation + 1000, tool_name=step["cancel_after"], arguments_json="{}"
            )
            await host.write(invoke=barrier)
            assert (await host.result(invocation + 1000)).HasField("value_json"), where
            await host.write(cancel=runtime_pb2.HostCancel(invocation_id=invocation))
        _check_outcome(await host.result(invocation), step, host.language, where)
    if "changed_tools" in step or "changed_events" in step:
        assert len(host.changes) > changes_before, f"{where}: no registration change"
        last = host.changes[-1]
        if "changed_tools" in step:
            assert [t.name for t in last.tools] == step["changed_tools"], where
        if "changed_events" in step:
            assert list(last.events) == step["changed_events"], where


@pytest.fixture
async def stub() -> AsyncIterator[runtime_pb2_grpc.RuntimeServiceStub]:
    async with serving(grpc_settings(pool_size=0)) as running, connected(running) as client:
        yield client


@pytest.mark.parametrize(
    ("case", "language"),
    [
        pytest.param(
            case,
            language,
            id=f"{case['id']}-{language}",
            marks=[NEEDS_NODE] if language == "typescript" else [],
        )
        for case in CASES
        for language in case["source"]
    ],
)
async def test_each_harness_passes_the_facade_corpus(
    stub: runtime_pb2_grpc.RuntimeServiceStub, case: dict[str, Any], language: str
) -> None:
    host = Host(stub, language)
    start = case.get("start", {})
    await host.write(
        start=runtime_pb2.HostStart(
            source=case["source"][language],
            language=language,
            plugin_id=PLUGIN_ID,
            package_id="pkg-1",
            run_id="run-1",
            visible_tools_json=json.dumps(start.get("visible_tools", [])),
            services=_services(start.get("services", [])),
        )
    )
    first = await host.next()
    if "failed" in case:
        assert first.WhichOneof("kind") == "failed", first
        assert first.failed.phase == case["failed"]["phase"]
        assert first.failed.message == _text(case["failed"]["message"], language)
        assert await host.call.read() is grpc.aio.EOF
        assert child_pids() == []
        return
    assert first.WhichOneof("kind") == "started", first
    _check_registrations(first.started, case["started"], f"{case['id']}: started")
    if "logs" in case["started"]:
        assert host.logs == case["started"]["logs"]
    for name, schemas in case.get("tool_schemas", {}).items():
        (tool,) = [t for t in first.started.tools if t.name == name]
        assert json.loads(tool.input_schema_json) == schemas["input"], name
        output = json.loads(tool.output_schema_json) if tool.output_schema_json else None
        assert output == schemas["output"], name

    for number, step in enumerate(case["steps"], start=1):
        if language in step.get("languages", [language]):
            await _run_step(host, step, number, f"{case['id']} step {number}")

    logs_before_retract = len(host.logs)
    await host.write(retract=runtime_pb2.HostRetract())
    retracted = await host.next()
    assert retracted.WhichOneof("kind") == "retracted", retracted
    assert host.logs[logs_before_retract:] == case.get("retract_logs", [])
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []


def test_the_corpus_covers_every_member_and_every_member_error() -> None:
    covered = {name for case in CASES for name in case["covers"]}
    assert covered == {m.name for m in FACADE.members}
    referenced: set[tuple[str, str]] = set()

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            if "spec" in value:
                where, error_id = value["spec"].split("#", 1)
                referenced.add((where, error_id))
                _spec_error(value["spec"])  # every reference resolves
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    collect(CASES)
    specified = {(f"member:{m.name}", e.id) for m in FACADE.members for e in m.errors}
    specified |= {("host_half", e.id) for e in FACADE.host_half_errors}
    assert specified <= referenced, specified - referenced
    for case in CASES:
        assert set(case["source"]) <= set(FACADE.languages), case["id"]


# Opens, from inside a host half, every object the harness hands it; the tool `members`
# returns their public member names (a TypeScript ctx lists its façade as its own keys).
INTROSPECT: dict[str, str] = {
    "python": """
import builtins as real
def public(obj):
    return sorted(n for n in dir(obj) if not n.startswith("_"))
names = globals()
own = sorted(n for n in names if not n.startswith("__"))
replaced = sorted(n for n, v in names["__builtins__"].items() if v is not getattr(real, n, None))
def plugin(ctx):
    seen = {
        "global": sorted(own + replaced), "withheld": [],
        "harness": public(harness), "ctx": public(ctx), "ctx.tools": public(ctx.tools),
        "timer": public(ctx.timer),
    }
    harness.register_tool(harness.define_tool(name="members", execute=lambda a: seen))
plugin.inject = ["timer"]
return plugin
""",
    "typescript": """
const given = [...arguments];
const globals = given.filter((v) => typeof v === "object" && v !== null)
  .map((v) => (v === harness ? "harness" : v === console ? "console" : "?"));
const withheld = given.filter((v) => typeof v === "function").map((f) => f.name);
if (typeof process === "undefined") withheld.push("process");
if (typeof Buffer === "undefined") withheld.push("Buffer");
const keys = (o: object) => Object.keys(o).sort();
const plugin = (ctx: any) => {
  const seen = {
    global: globals.sort(), withheld, harness: keys(harness), ctx: keys(ctx),
    "ctx.tools": keys(ctx.tools), timer: keys(ctx.timer), console: keys(console),
    arity: given.length,
  };
  harness.registerTool(harness.defineTool({ name: "members", execute: () => seen }));
};
plugin.inject = ["timer"];
return plugin;
""",
}


def test_the_specification_is_consistent_with_itself() -> None:
    for language in FACADE.languages:
        assert FACADE.attributes("global", language) == set(FACADE.globals[language])
        for member in FACADE.members_for(language):
            assert member.signature.get(language), (member.name, language)
            assert member.owner in {"global", "plugin"} | {o.path for o in FACADE.objects}


@pytest.mark.parametrize("language", [_language_param(x) for x in FACADE.languages])
async def test_each_harness_exposes_exactly_the_specified_members(
    stub: runtime_pb2_grpc.RuntimeServiceStub, language: str
) -> None:
    host = Host(stub, language)
    await host.write(
        start=runtime_pb2.HostStart(
            source=INTROSPECT[language], language=language, plugin_id=PLUGIN_ID
        )
    )
    started = await host.next()
    assert started.WhichOneof("kind") == "started", started
    members = runtime_pb2.HostInvoke(invocation_id=1, tool_name="members", arguments_json="{}")
    await host.write(invoke=members)
    result = await host.result(1)
    assert result.HasField("value_json"), result.error_message
    seen = json.loads(result.value_json)

    expected: dict[str, Any] = {
        "global": sorted(FACADE.globals[language]),
        "withheld": list(FACADE.withheld[language]),
        "harness": sorted(FACADE.attributes("harness", language)),
        "ctx": sorted(FACADE.attributes("ctx", language)),
        "ctx.tools": sorted(FACADE.attributes("ctx.tools", language)),
        "timer": sorted(m.name for m in FACADE.member("timer").methods),
    }
    if language == "typescript":
        expected["console"] = sorted(m.name for m in FACADE.member("console").methods)
        # Every parameter of the host half is a façade object or a withheld name.
        expected["arity"] = len(FACADE.globals[language]) + len(FACADE.withheld[language])
    assert seen == expected
    await host.write(retract=runtime_pb2.HostRetract())
    assert (await host.next()).WhichOneof("kind") == "retracted"
