"""Cordis plugin hosts through ``RuntimeService.Host``: a host half in a real sandboxed worker,
from start to retract (docs/cordis.md, docs/runtime-and-sandbox.md).

Every behaviour runs for both host languages (``language`` is parametrized): the host half is
written once per language, next to each other, and both must end exactly alike -- only the
texts that name a language's own terms (``None``/``undefined``, ``define_tool``/``defineTool``)
differ, and those are spelled per language too."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from runtime_service.errors import RunRequestError
from runtime_service.languages import typescript
from runtime_service.runtime import Runtime, RuntimeOptions
from runtime_service.worker.ledger import LOG_LINE_OVERHEAD
from runtime_service.worker_process import WorkerSpec
from tests.runtime.conftest import can_isolate, child_pids, connected, grpc_settings, serving

NEEDS_NODE = pytest.mark.skipif(
    typescript.BACKEND.unavailable(WorkerSpec()) is not None, reason="no Node 20+ on this host"
)
LANGUAGES = ["python", pytest.param("typescript", marks=NEEDS_NODE)]
THIS_FILE = os.path.realpath(__file__)  # the runtime's tree: not in any sandbox
Sources = dict[str, str]  # one host half per language

CLOCK: Sources = {
    "python": """
def plugin(ctx):
    async def now(args):
        return {"echo": args, "tools": [t["name"] for t in ctx.tools.schemas()]}
    harness.register_tool(harness.define_tool(
        name="clock_now", description="the time, or an echo",
        parameters={"type": "object", "properties": {"x": {"type": "integer"}}},
        execute=now,
    ))
    ctx.effect(lambda: (lambda: print("effect one disposed")))
    ctx.effect(lambda: (lambda: print("effect two disposed")))
    print("started")
return plugin
""",
    "typescript": """
function plugin(ctx: any): void {
  async function now(args: unknown) {
    return { echo: args, tools: ctx.tools.schemas().map((t: { name: string }) => t.name) };
  }
  harness.registerTool(harness.defineTool({
    name: "clock_now", description: "the time, or an echo",
    parameters: { type: "object", properties: { x: { type: "integer" } } },
    execute: now,
  }));
  ctx.effect(() => () => console.log("effect one disposed"));
  ctx.effect(() => () => console.log("effect two disposed"));
  console.log("started");
}
return plugin;
""",
}


class HostStream:
    """One Host stream in one language: send requests, read responses in order."""

    def __init__(self, stub: runtime_pb2_grpc.RuntimeServiceStub, language: str = "python") -> None:
        self.call = stub.Host()
        self.language = language
        self.seen: list[runtime_pb2.HostResponse] = []

    async def start(self, source: Sources | str, **fields: Any) -> runtime_pb2.HostResponse:
        text = source if isinstance(source, str) else source[self.language]
        start = runtime_pb2.HostStart(
            source=text,
            plugin_id="clock-1",
            package_id="pkg-2",
            run_id="run-3",
            language=self.language,
            **fields,
        )
        await self.call.write(runtime_pb2.HostRequest(start=start))
        return await self.next_not_log()

    async def next(self) -> runtime_pb2.HostResponse:
        message: runtime_pb2.HostResponse = await self.call.read()
        assert message is not grpc.aio.EOF, "the stream ended"
        self.seen.append(message)
        return message

    async def next_not_log(self) -> runtime_pb2.HostResponse:
        while (message := await self.next()).WhichOneof("kind") == "log":
            pass
        return message

    async def invoke(self, invocation: int, name: str, args: object) -> None:
        request = runtime_pb2.HostInvoke(
            invocation_id=invocation, tool_name=name, arguments_json=json.dumps(args)
        )
        await self.call.write(runtime_pb2.HostRequest(invoke=request))

    async def retract(self) -> None:
        await self.call.write(runtime_pb2.HostRequest(retract=runtime_pb2.HostRetract()))

    def logs(self) -> list[str]:
        return [m.log.text for m in self.seen if m.WhichOneof("kind") == "log"]


@pytest.fixture
async def stub() -> AsyncIterator[runtime_pb2_grpc.RuntimeServiceStub]:
    async with serving(grpc_settings(pool_size=0)) as running, connected(running) as client:
        yield client


@pytest.fixture(params=LANGUAGES)
def host(request: pytest.FixtureRequest, stub: runtime_pb2_grpc.RuntimeServiceStub) -> HostStream:
    """A Host stream of the parametrized language."""
    return HostStream(stub, request.param)


async def test_a_host_half_registers_a_tool_serves_it_and_retracts_in_reverse_order(
    host: HostStream,
) -> None:
    visible = [{"name": "search", "description": "d", "inputSchema": {"type": "object"}}]
    started = await host.start(CLOCK, visible_tools_json=json.dumps(visible))
    assert started.WhichOneof("kind") == "started", started
    (tool,) = started.started.tools
    assert tool.name == "clock_now"
    assert json.loads(tool.input_schema_json)["properties"] == {"x": {"type": "integer"}}
    assert "[cordis:clock-1] started\n" in host.logs()

    await host.invoke(1, "clock_now", {"x": 12345678901234567890})
    result = await host.next_not_log()
    assert result.result.invocation_id == 1
    assert json.loads(result.result.value_json) == {
        "echo": {"x": 12345678901234567890},  # beyond 2**64: exact
        "tools": ["search"],
    }

    await host.invoke(2, "no_such_tool", {})
    missing = await host.next_not_log()
    assert missing.result.error_message == 'the plugin has no tool "no_such_tool"'

    await host.retract()
    retracted = await host.next_not_log()
    assert retracted.WhichOneof("kind") == "retracted"
    disposals = [text for text in host.logs() if "disposed" in text]
    assert disposals == [
        "[cordis:clock-1] effect two disposed\n",
        "[cordis:clock-1] effect one disposed\n",
    ]
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []  # the plugin host's processes are gone before the stream ends


# (language, source, phase, text): the same failure in each language, with its own terms.
NO_PLUGIN: list[tuple[str, str, str, str]] = [
    ("python", "x = 1", "host-load", "the Host half returned `None` -- did you forget `return`?"),
    (
        "typescript",
        "const x: number = 1;",
        "host-load",
        "the Host half returned `undefined` — did you forget `return`?",
    ),
    (
        "python",
        "return 42",
        "host-load",
        "the Host half must return a Plugin function or an object",
    ),
    (
        "typescript",
        "return 42;",
        "host-load",
        "the Host half must return a Plugin function or an object",
    ),
    ("python", "return (", "host-load", "SyntaxError"),
    ("typescript", "const a = 1;\nreturn (", "host-load", "SyntaxError"),
    ("python", "raise ValueError('boom at load')", "host-load", "boom at load"),
    ("typescript", "throw new Error('boom at load');", "host-load", "boom at load"),
    (
        "python",
        "def p(ctx):\n    raise RuntimeError('boom at start')\nreturn p",
        "host-apply",
        "boom",
    ),
    ("typescript", "return (ctx) => { throw new Error('boom at start'); };", "host-apply", "boom"),
    (
        "python",
        "def p(ctx):\n    harness.register_tool({'name': 'forged'})\nreturn p",
        "host-apply",
        "dynamic tool registration must use a tool returned by harness.define_tool(...)",
    ),
    (
        "typescript",
        "return (ctx) => { harness.registerTool({ name: 'forged' }); };",
        "host-apply",
        "dynamic tool registration must use a tool returned by harness.defineTool(...)",
    ),
    (
        "typescript",  # a definition's copy is no definition: the marker is private
        "return (ctx) => { harness.registerTool({ ...harness.defineTool({ name: 'a', "
        "execute: () => 1 }) }); };",
        "host-apply",
        "dynamic tool registration must use a tool returned by harness.defineTool(...)",
    ),
    (
        "python",
        "def p(ctx):\n    ctx.anything = 1\nreturn p",
        "host-apply",
        'sandbox ctx is read-only; cannot assign "anything"',
    ),
    (
        "typescript",
        "return (ctx) => { ctx.anything = 1; };",
        "host-apply",
        'sandbox ctx is read-only; cannot assign "anything"',
    ),
    (
        "python",
        "def p(ctx):\n    ctx.network\nreturn p",
        "host-apply",
        'sandbox ctx does not expose "network"',
    ),
    (
        "typescript",
        "return (ctx) => { ctx.network; };",
        "host-apply",
        'sandbox ctx does not expose "network"',
    ),
    (
        "python",
        "def p(ctx):\n    ctx.timer\nreturn p",
        "host-apply",
        'service "timer" is not injected',
    ),
    (
        "typescript",
        "return (ctx) => { ctx.timer; };",
        "host-apply",
        'service "timer" is not injected',
    ),
    # The façade's JavaScript traps teach what to use instead.
    (
        "typescript",
        "return (ctx) => { require('node:fs'); };",
        "host-apply",
        "require is not available in a Host half",
    ),
    (
        "typescript",
        "return (ctx) => { setTimeout(() => {}, 1); };",
        "host-apply",
        'setTimeout is not available in a Host half: inject "timer"',
    ),
    (
        "typescript",
        "return (ctx) => { fetch('http://127.0.0.1/'); };",
        "host-apply",
        "fetch is not available in a Host half: a plugin host has no network",
    ),
    (
        "typescript",
        "return (ctx) => { process.exit(1); };",
        "host-apply",
        "Cannot read properties of undefined (reading 'exit')",
    ),
]


@pytest.mark.parametrize(
    ("language", "source", "phase", "text"),
    [pytest.param(*row, marks=NEEDS_NODE) if row[0] == "typescript" else row for row in NO_PLUGIN],
)
async def test_a_host_half_that_is_no_plugin_fails_with_its_phase_and_leaves_nothing(
    stub: runtime_pb2_grpc.RuntimeServiceStub, language: str, source: str, phase: str, text: str
) -> None:
    host = HostStream(stub, language)
    failed = await host.start(source)
    assert failed.WhichOneof("kind") == "failed", failed
    assert failed.failed.phase == phase
    assert text in failed.failed.message, failed.failed.message
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []


@NEEDS_NODE
async def test_a_typescript_syntax_error_names_its_line_with_a_caret(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    host = HostStream(stub, "typescript")
    failed = await host.start("const a: number = 1;\nconst b = (a +;\nreturn () => {};")
    assert failed.failed.phase == "host-load"
    head, line, caret = failed.failed.message.split("\n")[-3:]
    assert head.startswith("    at program.ts:2:")  # the body's own line: types stripped in place
    assert line == "const b = (a +;"
    assert caret.endswith("^")


NEVER_STARTS: Sources = {
    "python": "import asyncio\ndef p(ctx):\n    return asyncio.sleep(3600)\nreturn p",
    "typescript": "return (ctx) => new Promise(() => {});",
}
BUSY_START: Sources = {
    "python": "def p(ctx):\n    while True:\n        pass\nreturn p",
    "typescript": "return (ctx) => { while (true) {} };",
}
BUSY_LOAD: Sources = {
    "python": "while True:\n    pass",
    "typescript": "while (true) {}",
}


@pytest.mark.parametrize(
    ("source", "phase", "text"),
    [
        (NEVER_STARTS, "host-apply", "the Plugin did not start within 0.3 s"),
        (BUSY_START, "host-apply", "the Plugin did not start within 0.3 s"),
        (BUSY_LOAD, "host-load", "the Host half did not finish within 0.3 s"),
    ],
    ids=["waits", "busy-apply", "busy-load"],
)
async def test_a_start_that_never_ends_is_bounded_by_the_start_timeout(
    host: HostStream, source: Sources, phase: str, text: str
) -> None:
    failed = await host.start(source, start_timeout=Duration(nanos=300_000_000))
    assert (failed.failed.phase, failed.failed.message) == (phase, text)
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []


@NEEDS_NODE
async def test_a_start_busy_after_an_await_is_ended_by_the_runtime(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    # V8 interrupts only the synchronous part of a start; once the start has awaited, a busy
    # loop holds the worker's only thread and nothing inside can stop it: the runtime does.
    host = HostStream(stub, "typescript")
    source = "return async (ctx: unknown) => {\n  await null;\n  while (true) {}\n};"
    failed = await host.start(source, start_timeout=Duration(nanos=300_000_000))
    assert (failed.failed.phase, failed.failed.message) == (
        "host-apply",
        "the Plugin did not start within 0.3 s",
    )
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []


PARKS: Sources = {
    "python": (
        "def p(ctx):\n    raise AssertionError('must not start')\np.inject = ['db']\nreturn p"
    ),
    "typescript": (
        "const p = (ctx: unknown) => { throw new Error('must not start'); };\n"
        "p.inject = ['db'];\nreturn p;"
    ),
}


async def test_a_plugin_injecting_a_service_nobody_provides_parks_waiting(
    host: HostStream,
) -> None:
    started = await host.start(PARKS)
    assert started.WhichOneof("kind") == "started"
    assert list(started.started.waiting_for) == ["db"]
    assert list(started.started.tools) == []


TICKS: Sources = {
    "python": (
        "def p(ctx):\n"
        "    ctx.timer.interval(lambda: print('tick'), 10)\n"
        "    ctx.effect(lambda: (lambda: print('bye')))\n"
        "p.inject = ['timer']\n"
        "return p"
    ),
    "typescript": (
        "const p = (ctx: any) => {\n"
        "  ctx.timer.interval(() => console.log('tick'), 10);\n"
        "  ctx.effect(() => () => console.log('bye'));\n"
        "};\n"
        "p.inject = ['timer'];\n"
        "return p;"
    ),
}


async def test_timers_run_while_active_and_stop_with_the_retract(host: HostStream) -> None:
    assert (await host.start(TICKS)).WhichOneof("kind") == "started"
    while (await host.next()).log.text != "[cordis:clock-1] tick\n":
        pass
    await host.retract()
    assert (await host.next_not_log()).WhichOneof("kind") == "retracted"
    logs = host.logs()
    assert logs[-1] == "[cordis:clock-1] bye\n"  # disposers ran after the last tick
    assert await host.call.read() is grpc.aio.EOF


CANCELS: Sources = {
    "python": (
        "import asyncio\n"
        "def p(ctx):\n"
        "    async def slow(args):\n"
        "        await asyncio.sleep(3600)\n"
        "    def bad(args):\n"
        "        raise ValueError('the plugin refused')\n"
        "    def lossy(args):\n"
        "        return {1, 2}\n"
        "    for name, fn in [('slow', slow), ('bad', bad), ('lossy', lossy)]:\n"
        "        harness.register_tool(harness.define_tool(name=name, execute=fn))\n"
        "return p"
    ),
    "typescript": (
        "return (ctx: unknown) => {\n"
        "  const slow = (_args: unknown, { signal }: { signal: AbortSignal }) =>\n"
        "    new Promise((resolve) => signal.addEventListener('abort', () => resolve('late')));\n"
        "  const bad = () => { throw new Error('the plugin refused'); };\n"
        "  const lossy = () => new Set([1, 2]);\n"
        "  const all = [['slow', slow], ['bad', bad], ['lossy', lossy]] as const;\n"
        "  for (const [name, execute] of all)\n"
        "    harness.registerTool(harness.defineTool({ name, execute }));\n"
        "};"
    ),
}


async def test_an_invocation_is_cancelled_and_a_failing_tool_reports_its_message(
    host: HostStream,
) -> None:
    assert (await host.start(CANCELS)).WhichOneof("kind") == "started"
    await host.invoke(1, "slow", {})
    await host.invoke(2, "bad", {})
    bad = await host.next_not_log()
    assert (bad.result.invocation_id, bad.result.error_message) == (2, "the plugin refused")
    assert not bad.result.cancelled
    await host.call.write(runtime_pb2.HostRequest(cancel=runtime_pb2.HostCancel(invocation_id=1)))
    slow = await host.next_not_log()
    assert (slow.result.invocation_id, slow.result.error_message) == (1, "the call was cancelled")
    assert slow.result.cancelled  # so the registry settles it ABORTED, as every cancelled call
    await host.invoke(3, "lossy", {})
    lossy = await host.next_not_log()
    assert lossy.result.error_message.startswith('the result of tool "lossy" must be lossless')
    await host.invoke(4, "bad", {})  # the slow call's late resolution was dropped: 4 is next
    assert (await host.next_not_log()).result.invocation_id == 4


FORKS: Sources = {
    "python": (
        "import os, time\n"
        "def p(ctx):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid = None\n"
        "        while True: time.sleep(1)\n"
        "return p"
    ),
    # The attack: the real `process` (the host half's own is undefined), a child process.
    "typescript": (
        "return (ctx: unknown) => {\n"
        "  const real = (globalThis as any).process;\n"
        "  const cp = real.getBuiltinModule('node:child_process');\n"
        "  cp.spawn(real.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });\n"
        "};"
    ),
}


async def test_closing_the_stream_retracts_and_kills_everything_the_plugin_started(
    host: HostStream,
) -> None:
    assert (await host.start(FORKS)).WhichOneof("kind") == "started"
    for _ in range(200):  # the child may still be starting
        if len(child_pids()) > 1:
            break
        await asyncio.sleep(0.05)
    assert len(child_pids()) > 1  # the host and what it started
    host.call.cancel()
    for _ in range(200):  # the runtime reaps it right after it sees the cancel
        if child_pids() == []:
            break
        await asyncio.sleep(0.05)
    assert child_pids() == []


DIES: Sources = {
    "python": (
        "import os\n"
        "def p(ctx):\n"
        "    die = harness.define_tool(name='die', execute=lambda a: os._exit(3))\n"
        "    harness.register_tool(die)\n"
        "return p"
    ),
    "typescript": (
        "return (ctx: unknown) => {\n"
        "  const die = harness.defineTool({ name: 'die',"
        " execute: () => (globalThis as any).process.reallyExit(3) });\n"
        "  harness.registerTool(die);\n"
        "};"
    ),
}


async def test_a_plugin_host_that_dies_after_its_start_is_reported_lost(host: HostStream) -> None:
    assert (await host.start(DIES)).WhichOneof("kind") == "started"
    await host.invoke(7, "die", {})
    first = await host.next_not_log()
    assert first.result.invocation_id == 7
    assert first.result.error_message == "the plugin host ended before the call did"
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost"
    assert lost.lost.phase == "host-lost"
    assert lost.lost.message == "the plugin host exited (status 3)"


async def test_bad_host_input_is_refused_with_canonical_codes(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    call = stub.Host()
    await call.write(runtime_pb2.HostRequest(retract=runtime_pb2.HostRetract()))
    with pytest.raises(grpc.aio.AioRpcError) as first:
        await call.read()
    assert first.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be a start message" in (first.value.details() or "")

    call = stub.Host()
    start = runtime_pb2.HostStart(source="return 1", language="cobol")
    await call.write(runtime_pb2.HostRequest(start=start))
    with pytest.raises(grpc.aio.AioRpcError) as language:
        await call.read()
    assert language.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unsupported language 'cobol'" in (language.value.details() or "")


async def test_typescript_host_halves_are_refused_where_typescript_is_not_served() -> None:
    runtime = Runtime(
        RuntimeOptions(pool_size=0, worker=WorkerSpec(executables={"typescript": None}))
    )
    try:
        assert runtime.languages == ("python",)
        with pytest.raises(RunRequestError, match=r"'typescript' \(supported: python\)$"):
            runtime.create_plugin_host(
                source="return () => {};",
                plugin_id="clock-1",
                package_id="pkg-2",
                run_id="run-3",
                emit=lambda _event: None,
                language="typescript",
            )
    finally:
        await runtime.dispose()


GROWS: Sources = {
    "python": (
        "def p(ctx):\n"
        "    hoard = []\n"
        "    def grow(args):\n"
        "        while True:\n"
        "            hoard.append(bytearray(8 << 20))\n"
        "    harness.register_tool(harness.define_tool(name='grow', execute=grow))\n"
        "return p"
    ),
    "typescript": (
        "return (ctx: unknown) => {\n"
        "  const hoard: number[][] = [];\n"
        "  const grow = () => { for (;;) hoard.push(new Array(1 << 20).fill(1.5)); };\n"
        "  harness.registerTool(harness.defineTool({ name: 'grow', execute: grow }));\n"
        "};"
    ),
}


async def test_a_plugin_over_its_memory_budget_is_lost_and_the_runtime_stays_healthy(
    host: HostStream, stub: runtime_pb2_grpc.RuntimeServiceStub
) -> None:
    budgets = runtime_pb2.RunBudgets(memory_bytes=96 << 20)
    assert (await host.start(GROWS, budgets=budgets)).WhichOneof("kind") == "started"
    await host.invoke(1, "grow", {})
    failed = await host.next_not_log()
    assert failed.result.error_message == "the plugin host ended before the call did"
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost"
    assert lost.lost.message == "the plugin host exceeded its memory budget (96 MiB)"
    assert child_pids() == []
    # The runtime still serves.
    again = HostStream(stub, host.language)
    assert (await again.start(CLOCK)).WhichOneof("kind") == "started"


PROBES: Sources = {
    "python": (
        "import os, socket\n"
        "def attempts():\n"
        "    out = {}\n"
        "    s = socket.socket()\n"
        "    s.settimeout(2)\n"
        "    try:\n"
        "        s.connect(('1.1.1.1', 80)); out['net'] = 'connected'\n"
        "    except OSError as e:\n"
        "        out['net'] = type(e).__name__\n"
        "    try:\n"
        f"        open({THIS_FILE!r}).read(1); out['file'] = 'read'\n"
        "    except OSError as e:\n"
        "        out['file'] = type(e).__name__\n"
        "    out['pids'] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "    out['uid'] = os.getuid()\n"
        "    return out\n"
        "def p(ctx):\n"
        "    probe = harness.define_tool(name='probe', execute=lambda a: attempts())\n"
        "    harness.register_tool(probe)\n"
        "return p"
    ),
    # The attack: Node's own modules through the real `process` (process.binding included).
    "typescript": (
        "const real = (globalThis as any).process;\n"
        "async function attempts() {\n"
        "  const out: Record<string, unknown> = {};\n"
        "  const net = real.getBuiltinModule('node:net');\n"
        "  out.net = await new Promise((resolve) => {\n"
        "    const socket = net.connect(80, '1.1.1.1');\n"
        "    socket.on('connect', () => resolve('connected'));\n"
        "    socket.on('error', (error: any) => resolve(error.code));\n"
        "  });\n"
        "  const fs = real.getBuiltinModule('node:fs');\n"
        "  try {\n"
        f"    fs.readFileSync({json.dumps(THIS_FILE)}); out.file = 'read';\n"
        "  } catch (error: any) { out.file = error.code; }\n"
        "  try {\n"
        f"    real.binding('fs').open({json.dumps(THIS_FILE)}, 0, 0); out.binding = 'opened';\n"
        "  } catch (error: any) { out.binding = String(error.code ?? error.message); }\n"
        "  out.pids = fs.readdirSync('/proc').filter((p: string) => /^[0-9]+$/.test(p))\n"
        "    .map(Number).sort((a: number, b: number) => a - b);\n"
        "  out.uid = real.getuid();\n"
        "  return out;\n"
        "}\n"
        "return (ctx: unknown) => {\n"
        "  harness.registerTool(harness.defineTool({ name: 'probe', execute: attempts }));\n"
        "};"
    ),
}


async def test_a_host_half_is_sandboxed_like_a_program(host: HostStream) -> None:
    # The attack: a host half that reaches for the network, the runtime's files and other
    # processes.
    if not can_isolate():
        pytest.skip("this host cannot build the sandbox (needs root with CAP_SYS_ADMIN)")
    assert (await host.start(PROBES)).WhichOneof("kind") == "started"
    await host.invoke(1, "probe", {})
    reply = await host.next_not_log()
    assert reply.result.WhichOneof("outcome") == "value_json", reply
    result = json.loads(reply.result.value_json)
    assert result["net"] != "connected"
    assert result["file"] != "read"
    assert result.get("binding") != "opened"
    assert result["pids"] == [1, 2]  # the host's init and itself: nothing else is visible
    assert result["uid"] >= 60000
    await host.invoke(2, "probe", {})
    again = await host.next_not_log()
    assert again.result.invocation_id == 2


LOUD: Sources = {
    "python": (
        "import sys\n"
        "def p(ctx):\n"
        "    def shout(args):\n"
        "        print('x' * 100_000)\n"
        "        sys.stderr.write('y' * 100_000)\n"
        "        return 'z' * 100_000\n"
        "    harness.register_tool(harness.define_tool(name='shout', execute=shout))\n"
        "    harness.register_tool(harness.define_tool(name='ok', execute=lambda a: 'ok'))\n"
        "return p"
    ),
    "typescript": (
        "return (ctx: unknown) => {\n"
        "  const shout = () => {\n"
        "    console.log('x'.repeat(100_000));\n"
        "    (globalThis as any).process.stderr.write('y'.repeat(100_000));\n"
        "    return 'z'.repeat(100_000);\n"
        "  };\n"
        "  harness.registerTool(harness.defineTool({ name: 'shout', execute: shout }));\n"
        "  harness.registerTool(harness.defineTool({ name: 'ok', execute: () => 'ok' }));\n"
        "};"
    ),
}


async def test_output_past_the_budget_is_cut_and_ends_the_call_and_the_host(
    host: HostStream, stub: runtime_pb2_grpc.RuntimeServiceStub
) -> None:
    # Each line is cut to the budget by the harness; two such lines in one call are more than
    # the call's output budget: the host is stopped, as for a call past its compute budget.
    budgets = runtime_pb2.RunBudgets(max_output_bytes=1000)
    assert (await host.start(LOUD, budgets=budgets)).WhichOneof("kind") == "started"
    await host.invoke(1, "ok", {})
    assert json.loads((await host.next_not_log()).result.value_json) == "ok"
    await host.invoke(2, "shout", {})
    shout = await host.next_not_log()
    assert shout.result.error_message == "the plugin host ended before the call did"
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost"
    assert lost.lost.message.startswith("the plugin host's output exceeded its budget (1000 ")
    (log,) = host.logs()
    assert log.startswith("[cordis:clock-1] xxx") and len(json.dumps(log)) <= 1000
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []
    # A result over the budget still fails only its call.
    again = HostStream(stub, host.language)
    assert (await again.start(LOUD_RESULT, budgets=budgets)).WhichOneof("kind") == "started"
    await again.invoke(1, "big", {})
    big = await again.next_not_log()
    assert big.result.error_message == "the result exceeds the output budget of 1000 bytes"
    await again.invoke(2, "ok", {})
    assert json.loads((await again.next_not_log()).result.value_json) == "ok"


LOUD_RESULT: Sources = {
    "python": (
        "def p(ctx):\n"
        "    harness.register_tool(harness.define_tool(name='big', execute=lambda a: 'z' * 5000))\n"
        "    harness.register_tool(harness.define_tool(name='ok', execute=lambda a: 'ok'))\n"
        "return p"
    ),
    "typescript": (
        "return (ctx: unknown) => {\n"
        "  const big = () => 'z'.repeat(5000);\n"
        "  harness.registerTool(harness.defineTool({ name: 'big', execute: big }));\n"
        "  harness.registerTool(harness.defineTool({ name: 'ok', execute: () => 'ok' }));\n"
        "};"
    ),
}


FLOODS: Sources = {
    "python": (
        "def p(ctx):\n"
        "    def flood(args):\n"
        "        while True:\n"
        "            print('x')\n"
        "    harness.register_tool(harness.define_tool(name='flood', execute=flood))\n"
        "    harness.register_tool(harness.define_tool(name='ok', execute=lambda a: 'ok'))\n"
        "return p"
    ),
    "typescript": (
        "return (ctx: unknown) => {\n"
        "  const flood = () => { while (true) console.log('x'); };\n"
        "  harness.registerTool(harness.defineTool({ name: 'flood', execute: flood }));\n"
        "  harness.registerTool(harness.defineTool({ name: 'ok', execute: () => 'ok' }));\n"
        "};"
    ),
}


async def test_a_print_flood_is_stopped_by_the_output_budget(host: HostStream) -> None:
    # The attack: a call that prints forever. Each line draws on the host's output budget (its
    # text plus the per-line overhead, refilled when a call begins): the host is stopped after
    # a bounded number of lines instead of streaming (and the runtime holding) them forever.
    budget = 64 << 10
    budgets = runtime_pb2.RunBudgets(max_output_bytes=budget)
    assert (await host.start(FLOODS, budgets=budgets)).WhichOneof("kind") == "started"
    for invocation in (1, 2):  # the budget refills per call: two calls of small output pass
        await host.invoke(invocation, "ok", {})
        assert json.loads((await host.next_not_log()).result.value_json) == "ok"
    await host.invoke(3, "flood", {})
    ended = await host.next_not_log()
    assert ended.result.error_message == "the plugin host ended before the call did"
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost", lost
    assert lost.lost.message == (
        f"the plugin host's output exceeded its budget ({budget} bytes of logs since its last "
        f"call began, each line also costing {LOG_LINE_OVERHEAD}); the plugin host was stopped"
    )
    logs = host.logs()
    (line,) = set(logs)
    assert line.rstrip("\n") == "[cordis:clock-1] x"
    assert len(logs) * (len(json.dumps(line)) + LOG_LINE_OVERHEAD) <= budget
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []


LISTENING: Sources = {
    "python": """
def plugin(ctx):
    ctx.on("tool/result", lambda event: print("result of", event["name"]))
    ctx.once("tool/call", lambda event: print("first call", event["name"]))
    ctx.on("plugin/dispose", lambda event: print("disposing:", event["reason"]))
    ctx.effect(lambda: (lambda: print("effect disposed")))
return plugin
""",
    "typescript": """
function plugin(ctx: any) {
  ctx.on("tool/result", (event: any) => console.log("result of", event.name));
  ctx.once("tool/call", (event: any) => console.log("first call", event.name));
  ctx.on("plugin/dispose", (event: any) => console.log("disposing:", event.reason));
  ctx.effect(() => () => console.log("effect disposed"));
}
return plugin;
""",
}


async def test_events_reach_listeners_once_fires_once_and_dispose_precedes_disposers(
    host: HostStream,
) -> None:
    started = await host.start(LISTENING)
    assert sorted(started.started.events) == ["plugin/dispose", "tool/call", "tool/result"]
    for invocation, (event, name) in enumerate(
        [("tool/call", "a"), ("tool/call", "b"), ("tool/result", "a")], start=1
    ):
        request = runtime_pb2.HostInvoke(
            invocation_id=invocation, event=event, arguments_json=json.dumps({"name": name})
        )
        await host.call.write(runtime_pb2.HostRequest(invoke=request))
        if invocation == 1:
            # `once` is spent before its listener runs: the plugin no longer observes
            # tool/call (the registry stops delivering it).
            changed = await host.next_not_log()
            assert sorted(changed.changed.events) == ["plugin/dispose", "tool/result"]
        delivered = await host.next_not_log()
        assert delivered.result.invocation_id == invocation
        assert delivered.result.WhichOneof("outcome") == "value_json"
    await host.retract()
    assert (await host.next_not_log()).WhichOneof("kind") == "retracted"
    said = [text.removeprefix("[cordis:clock-1] ") for text in host.logs()]
    assert said == [
        "first call a\n",
        "result of a\n",
        "disposing: stop\n",
        "effect disposed\n",
    ]


BUSY: Sources = {
    "python": """
def plugin(ctx):
    def spin(args):
        while True:
            pass
    async def fine(args):
        return "fine"
    harness.register_tool(harness.define_tool(name="spin", description="d", execute=spin))
    harness.register_tool(harness.define_tool(name="fine", description="d", execute=fine))
return plugin
""",
    "typescript": """
function plugin(ctx: unknown) {
  const spin = () => { while (true) {} };
  const fine = async () => "fine";
  harness.registerTool(harness.defineTool({ name: "spin", description: "d", execute: spin }));
  harness.registerTool(harness.defineTool({ name: "fine", description: "d", execute: fine }));
}
return plugin;
""",
}


async def test_an_invocation_past_its_compute_budget_ends_with_the_budget_text_and_the_host(
    host: HostStream,
) -> None:
    started = await host.start(BUSY, budgets=runtime_pb2.RunBudgets(compute_ms=300))
    assert started.WhichOneof("kind") == "started", started
    await host.invoke(1, "fine", {})
    assert json.loads((await host.next_not_log()).result.value_json) == "fine"
    await host.invoke(2, "spin", {})
    result = await host.next_not_log()
    assert result.result.invocation_id == 2
    assert result.result.error_message == "compute budget exhausted (300ms busy)"
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost"
    assert lost.lost.message.startswith("a call ran past its compute budget (300ms busy)")
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []


UNPARKS: Sources = {
    "python": (
        "def p(ctx):\n"
        "    print('applied with', ctx.db['url'])\n"
        "    ctx.effect(lambda: (lambda: print('disposed')))\n"
        "p.inject = ['db']\n"
        "return p"
    ),
    "typescript": (
        "const p = (ctx: any) => {\n"
        "  console.log('applied with', ctx.db.url);\n"
        "  ctx.effect(() => () => console.log('disposed'));\n"
        "};\n"
        "p.inject = ['db'];\n"
        "return p;"
    ),
}


async def test_a_parked_plugin_starts_when_its_service_appears_and_parks_when_it_goes(
    host: HostStream,
) -> None:
    started = await host.start(UNPARKS)
    assert list(started.started.waiting_for) == ["db"]
    db = runtime_pb2.HostService(name="db", data_json='{"url": "mem://"}')
    services = runtime_pb2.HostServices(services=[db])
    await host.call.write(runtime_pb2.HostRequest(services=services))
    running = await host.next_not_log()
    assert running.WhichOneof("kind") == "changed" and not running.changed.waiting_for
    await host.call.write(runtime_pb2.HostRequest(services=runtime_pb2.HostServices()))
    parked = await host.next_not_log()
    assert list(parked.changed.waiting_for) == ["db"]
    said = [text.removeprefix("[cordis:clock-1] ") for text in host.logs()]
    assert said == ["applied with mem://\n", "disposed\n"]


FAILS_UNPARKED: Sources = {
    "python": "def p(ctx):\n    raise RuntimeError('no schema')\np.inject = ['db']\nreturn p",
    "typescript": (
        "const p = (ctx: unknown) => { throw new Error('no schema'); };\n"
        "p.inject = ['db'];\nreturn p;"
    ),
}


async def test_a_parked_plugin_whose_start_fails_once_unparked_ends_its_host(
    host: HostStream,
) -> None:
    assert list((await host.start(FAILS_UNPARKED)).started.waiting_for) == ["db"]
    services = runtime_pb2.HostServices(
        services=[runtime_pb2.HostService(name="db", data_json="1")]
    )
    await host.call.write(runtime_pb2.HostRequest(services=services))
    lost = await host.next_not_log()
    assert lost.WhichOneof("kind") == "lost"
    assert lost.lost.message == "its injected services appeared, but its start failed: no schema"
    assert await host.call.read() is grpc.aio.EOF
    assert child_pids() == []


FACADE_TS = """
const probe = (ctx: any) => async () => {
  const out: Record<string, unknown> = {};
  const attempt = (key: string, fn: () => unknown) => {
    try {
      fn();
      out[key] = "allowed";
    } catch (error) {
      out[key] = (error as Error).message;
    }
  };
  attempt("harness", () => { (harness as any).defineTool = null; });
  attempt("tools", () => { ctx.tools.schemas = null; });
  attempt("asyncEffect", () => ctx.effect(async () => {}));
  attempt("timerService", () => ctx.provide("timer", 1));
  attempt("noExecute", () => harness.defineTool({ name: "x" }));
  attempt("noName", () => harness.defineTool({ execute: () => 1 }));
  attempt("lossySchema", () => harness.defineTool({ name: "x", execute: () => 1,
    parameters: { type: "object", default: new Date(0) } }));
  attempt("twice", () => harness.registerTool(tool));
  attempt("notAService", () => ctx.provide("empty", () => 1));
  out.has = ["tools" in ctx, "get" in ctx, "timer" in ctx, "anything" in ctx];
  out.known = ctx.tools.get("search")?.name ?? null;
  out.unknown = ctx.tools.get("nope") === undefined;
  out.symbol = ctx[Symbol.iterator] === undefined;
  return out;
};
let tool: unknown;
return (ctx: any) => {
  tool = harness.defineTool({ name: "facade", execute: probe(ctx) });
  harness.registerTool(tool);
};
"""


@NEEDS_NODE
async def test_the_typescript_facade_refuses_with_the_reference_texts(
    stub: runtime_pb2_grpc.RuntimeServiceStub,
) -> None:
    host = HostStream(stub, "typescript")
    visible = [{"name": "search", "description": "d", "inputSchema": {"type": "object"}}]
    started = await host.start(FACADE_TS, visible_tools_json=json.dumps(visible))
    assert started.WhichOneof("kind") == "started", started
    await host.invoke(1, "facade", {})
    reply = await host.next_not_log()
    assert reply.result.WhichOneof("outcome") == "value_json", reply
    assert json.loads(reply.result.value_json) == {
        "harness": 'harness is read-only; cannot assign "defineTool"',
        "tools": 'ctx.tools is read-only; cannot assign "schemas"',
        "asyncEffect": "ctx.effect runs its function synchronously: it may not be async",
        "timerService": 'service "timer" is built in; provide it under another name',
        "noExecute": "harness.defineTool needs a function `execute(args)`",
        "noName": "harness.defineTool needs a non-empty string `name`",
        "lossySchema": (
            "harness.defineTool `parameters` must be lossless JSON data (objects, arrays, "
            "strings, numbers, booleans, null) — not a class instance, function, Map/Set, "
            "Date, or undefined"
        ),
        "twice": (
            'tool "facade" is already registered by this plugin; to replace it, keep the '
            "disposer registerTool returned and call it first"
        ),
        "notAService": (
            "ctx.provide needs lossless JSON data, or an object with public methods, as the "
            "service: it crosses to the owner's other plugins, which run in other processes"
        ),
        "has": [True, True, False, False],
        "known": "search",
        "unknown": True,
        "symbol": True,
    }


AWAITS_SERVICE: Sources = {
    "python": (
        "class P:\n"
        "    inject = ['gate']\n"
        "    def apply(self, ctx):\n"
        "        gate = ctx.gate\n"
        "        async def hold(args):\n"
        "            return await gate.wait()\n"
        "        harness.register_tool(harness.define_tool(name='hold', execute=hold))\n"
        "return P()"
    ),
    "typescript": (
        "const p = (ctx: any) => {\n"
        "  const gate = ctx.gate;\n"
        "  const hold = harness.defineTool({ name: 'hold', execute: () => gate.wait() });\n"
        "  harness.registerTool(hold);\n"
        "};\n"
        "p.inject = ['gate'];\n"
        "return p;"
    ),
}


async def test_a_cancelled_invocation_withdraws_the_service_call_it_was_waiting_on(
    host: HostStream,
) -> None:
    gate = runtime_pb2.HostService(name="gate", methods=["wait"])
    started = await host.start(AWAITS_SERVICE, services=[gate])
    assert started.WhichOneof("kind") == "started" and not started.started.waiting_for
    await host.invoke(1, "hold", {})
    call = await host.next_not_log()
    assert call.WhichOneof("kind") == "service_call", call
    assert (call.service_call.service, call.service_call.method) == ("gate", "wait")
    await host.call.write(runtime_pb2.HostRequest(cancel=runtime_pb2.HostCancel(invocation_id=1)))
    withdrawn = await host.next_not_log()
    assert withdrawn.WhichOneof("kind") == "service_call_cancel", withdrawn
    assert withdrawn.service_call_cancel.call_id == call.service_call.call_id
    cancelled = await host.next_not_log()
    assert (cancelled.result.invocation_id, cancelled.result.error_message) == (
        1,
        "the call was cancelled",
    )
