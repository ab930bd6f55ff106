"""The demo: both services, a provider process, and a real `run_code` program.

It starts a runtime (its own process), a registry wired to it, and a tool provider serving a
small workspace (another process); creates an agent in `code` mode; shows that the model sees
only `run_code` and that a direct call is refused; runs a program that fans out over the tools;
and prints the nested trajectory as a tree with timings, then the outer result, and finally
the call's trace. Both services append their spans to `var/traces.jsonl` in the current
folder, where `codemode trace call-1` looks afterwards (the history is temporary). A program
whose result is an error ends the demo with status 1.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from codemode_cli.demo_model import model_walkthrough
from codemode_cli.exit_codes import ExitCode
from codemode_cli.processes import running
from codemode_cli.trace import find_call, render
from codemode_client import open_channel
from codemode_common.settings import ServiceSettings
from codemode_common.telemetry.jsonl import read_spans
from codemode_common.telemetry.setup import configure
from codemode_wire.api.registry.v1 import presentation_pb2, scope_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from registry_service.config import RegistrySettings
from registry_service.server import start as start_registry

PROGRAM = """\
import asyncio

files = await tools.list_files({})
print(f"{len(files)} files in the workspace")
texts = await asyncio.gather(*(tools.read_file({"path": p}) for p in files))
todos = {p: t["text"].count("TODO") for p, t in zip(files, texts) if "TODO" in t["text"]}
try:
    await tools.read_file({"path": "missing.txt"})
except ToolCallError as e:
    print(f"expected failure from {e.toolName}: {e}")
return {"files_with_todos": todos, "total": sum(todos.values())}
"""

TYPESCRIPT_PROGRAM = """\
const files: string[] = await tools.list_files({});
console.log(`${files.length} files in the workspace`);
const texts = await Promise.all(files.map((path) => tools.read_file({ path })));
const todos: Record<string, number> = {};
files.forEach((path, i) => {
  const count = texts[i].text.split("TODO").length - 1;
  if (count > 0) todos[path] = count;
});
try {
  await tools.read_file({ path: "missing.txt" });
} catch (e) {
  if (!(e instanceof ToolCallError)) throw e;
  console.log(`expected failure from ${e.toolName}: ${e.message}`);
}
const total = Object.values(todos).reduce((sum, n) => sum + n, 0);
return { files_with_todos: todos, total };
"""
PROGRAMS = {"python": PROGRAM, "typescript": TYPESCRIPT_PROGRAM}
"""The same trajectory in each program language (`codemode demo --language`)."""


def _tree(
    started: dict[str, tuple[str, float]], settled: list[rpb.ExecuteToolCallResponse]
) -> list[str]:
    rows = []
    for event in settled:
        s = event.nested_settled
        status = f"error {s.error_code or ''}".strip() if s.is_error else "ok"
        rows.append(f"{s.sub_call_id:<16} {s.tool_name:<12} {status:<16} {s.duration_ms:8.1f} ms")
    return [("└─ " if i == len(rows) - 1 else "├─ ") + row for i, row in enumerate(rows)]


TRACE_FILE = ServiceSettings.model_fields["trace_file"].default
"""The services' default trace file, relative to the current folder: `codemode trace` reads it."""


def trace_file_here() -> str:
    """TRACE_FILE as an absolute path (its folder created), for the services and the demo."""
    path = Path(TRACE_FILE).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)


async def run_demo(
    program: str | None = None,
    language: str = "python",
    model: str | None = None,
    model_name: str | None = None,
    trace_file: str | None = None,
) -> int:
    """`model`: none for the scripted walkthrough below, else a model drives the agent
    (`scripted`, `openai`, `anthropic`: codemode_cli.demo_model). Spans go to `trace_file`
    (default: `trace_file_here()`)."""
    program = program or PROGRAMS[language]
    call_id = "call-1"
    failed = False
    trace_file = trace_file or trace_file_here()
    with tempfile.TemporaryDirectory() as tmp:
        runtime_env = {**os.environ, "CODEMODE_RUNTIME_TRACE_FILE": trace_file}
        async with running(
            "-m",
            "runtime_service",
            "--listen",
            "127.0.0.1:0",
            ready="runtime listening on port ",
            env=runtime_env,
        ) as runtime:
            port = runtime.rest
            settings = RegistrySettings(
                listen="127.0.0.1:0",
                runtime_targets=[f"127.0.0.1:{port}"],
                history_path=str(Path(tmp) / "history.sqlite3"),
                trace_file=trace_file,
                # The runtime serves TypeScript where Node is installed (its own check).
                runtime_languages=["python", "typescript"],
            )
            telemetry = configure(settings.telemetry_config())
            registry = await start_registry(
                settings,
                tracer_provider=telemetry.tracer_provider,
                meter_provider=telemetry.meter_provider,
            )
            channel = open_channel(registry.address)
            try:
                async with running(
                    "-m", "codemode_client.demo_tools", registry.address, ready="ready"
                ):
                    if model is None:
                        failed = await _walkthrough(
                            rpb_grpc.RegistryServiceStub(channel), program, language, port
                        )
                    else:
                        call_id = await model_walkthrough(
                            registry.address, language, model, model_name, program
                        )
            finally:
                await channel.close()
                await registry.stop(1)
                telemetry.shutdown()
        # The runtime has exited: its spans are flushed.
        if call_id:
            _print_trace(trace_file, call_id, telemetry.destination)
    return ExitCode.FAILED if failed else ExitCode.OK


def _print_trace(trace_file: str, call_id: str, destination: str) -> None:
    if destination.startswith("otlp") or not Path(trace_file).exists():
        # An OTLP endpoint in the environment sends the spans there instead of to the file.
        print(f"\ntrace of {call_id}: exported to {destination}")
        return
    tree = find_call(read_spans(trace_file), call_id)
    if tree is None:
        return
    print(f"\ntrace of {call_id} (what `codemode trace {call_id}` prints from {trace_file}):")
    print("".join(f"  {line}\n" for line in render(tree)), end="")


async def _walkthrough(
    stub: rpb_grpc.RegistryServiceStub, program: str, language: str, runtime_port: str
) -> bool:
    """The walkthrough; True when the program's result is an error."""
    print(f"runtime on 127.0.0.1:{runtime_port} · registry up · provider 'demo-files' serving\n")
    declared = scope_pb2.Agent(mode=scope_pb2.PRESENTATION_MODE_CODE, code_language=language)
    request = rpb.CreateAgentRequest(agent_id="demo-agent", agent=declared)
    agent = (await stub.CreateAgent(request)).agent.name
    visible = await stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=agent))
    wire = await stub.GetWireSchemas(presentation_pb2.GetWireSchemasRequest(scope=agent))
    print(f"{agent} (mode code)" if language == "python" else f"{agent} (mode code, {language})")
    behind = ", ".join(t.name for t in visible.tools if t.name != "run_code")
    print(f"  tools behind the SDK: {behind}")
    print(f"  schemas the model sees: {[s.name for s in wire.schemas]}")
    direct = rpb.ExecuteToolCallRequest(
        agent=agent,
        call_id="direct-1",
        tool_name="read_file",
        arguments_json='{"path":"README.md"}',
    )
    async for event in stub.ExecuteToolCall(direct):
        if event.WhichOneof("event") == "result":
            print(f"  a direct read_file call is refused: {event.result.error.code}\n")
    print("program (run_code):")
    print("".join(f"  │ {line}\n" for line in program.rstrip().splitlines()))
    arguments = json.dumps(
        {"code": program, "description": "Count TODO markers across the workspace"}
    )
    call = rpb.ExecuteToolCallRequest(
        agent=agent, call_id="call-1", tool_name="run_code", arguments_json=arguments
    )
    started: dict[str, tuple[str, float]] = {}
    settled: list[rpb.ExecuteToolCallResponse] = []
    begin = time.perf_counter()
    result = None
    async for event in stub.ExecuteToolCall(call):
        kind = event.WhichOneof("event")
        if kind == "nested_started":
            started[event.nested_started.sub_call_id] = (
                event.nested_started.tool_name,
                time.perf_counter(),
            )
        elif kind == "nested_settled":
            settled.append(event)
        elif kind == "result":
            result = event.result
    elapsed = (time.perf_counter() - begin) * 1000
    assert result is not None
    print(f"trajectory: run_code call-1 ({elapsed:.1f} ms, {len(settled)} nested calls)")
    print("\n".join(_tree(started, settled)))
    status = "error " + result.error.code if result.is_error else "ok"
    print(f"\nouter result [{status}] — the only thing the model sees:")
    for block in result.content:
        print("".join(f"  {line}\n" for line in block.text.text.splitlines()), end="")
    history = await stub.ListHistory(rpb.ListHistoryRequest(agent=agent, call_id="call-1"))
    kinds: dict[str, int] = {}
    for record in history.records:
        kinds[record.kind] = kinds.get(record.kind, 0) + 1
    print(f"\nhistory for call-1: {kinds}")
    return bool(result.is_error)
