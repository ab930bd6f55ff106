"""`codemode demo --cordis`: a `code` agent extends itself with a dynamic Cordis plugin.

It starts a runtime (its own process) and a registry wired to it, creates an agent in `code`
mode with `self_modification`, and runs its programs through the Python client:

1. the agent defines a plugin whose host half registers a tool, and activates it;
2. a second program calls that tool (through the pipeline, into the plugin host on the runtime);
3. a tool of the plugin kills its own plugin host: the registry steers the agent (`agent/steer`);
4. the agent reactivates the package, then an update with a broken package fails and keeps
   `current`;
5. a rollback to `current` (the tool is back for the next program);
6. a program calls the tool, stops the plugin, and calls the tool again: it fails as an unknown
   tool (the plugin's tools left the catalog with its run).

Each program's nested calls are printed as a trajectory, and the steering records as
`WatchHistory` delivers them (and as the history keeps them) at the end. Then a second agent's
client-bearing plugin is answered by a scripted page runner (`demo_page_runner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path

from codemode_cli.demo_page_runner import page_runner_walkthrough
from codemode_cli.processes import running
from codemode_client import AgentMessage, RegistryClient, ToolCallResult, agent_message
from codemode_wire import jsonvalue
from registry_service.config import RegistrySettings
from registry_service.server import start as start_registry

HOST_HALF = """\
import os

def now(args):
    return {"time": "12:00", "zone": args.get("zone", "utc")}

def panic(args):
    os._exit(3)  # the plugin host dies, as a crash or an OOM kill would

async def apply(ctx):
    harness.register_tool(harness.define_tool(
        name="clock_now", description="The time in a zone.",
        parameters={"type": "object", "properties": {"zone": {"type": "string"}}},
        execute=now))
    harness.register_tool(harness.define_tool(
        name="clock_panic", description="Crashes the clock's plugin host.",
        parameters={"type": "object"}, execute=panic))

return apply
"""
BROKEN_HALF = (
    "async def apply(ctx):\n    raise RuntimeError('clock face missing')\n\nreturn apply\n"
)

STEPS: list[tuple[str, str]] = [
    (
        "define a plugin and activate it",
        "d = await tools.cordis_define({'plugin': {'kind': 'new', 'idPrefix': 'clock'},\n"
        "    'name': 'Clock', 'purpose': 'Tell the time.', 'code': {'host': HOST_HALF}})\n"
        "print(f\"defined {d['pluginId']}/{d['packageId']}\")\n"
        "r = await tools.cordis_run({'pluginId': d['pluginId'], 'packageId': d['packageId'],\n"
        "    'mode': 'run'})\n"
        "return {k: r[k] for k in ('status', 'pluginRunId', 'currentPackageId')}",
    ),
    ("a second program calls the new tool", "return await tools.clock_now({'zone': 'cet'})"),
    (
        "a tool of the plugin kills its plugin host",
        "try:\n"
        "    await tools.clock_panic({})\n"
        "except ToolCallError as e:\n"
        "    print(f'clock_panic failed: {e}')",
    ),
    (
        "reactivate, then an update with a broken package fails and keeps current",
        "r = await tools.cordis_run({'pluginId': 'clock-1', 'packageId': 'pkg-1', 'mode': 'run'})\n"
        "print(f\"reactivated: {r['status']} ({r['pluginRunId']})\")\n"
        "d = await tools.cordis_define({'plugin': {'kind': 'existing', 'pluginId': 'clock-1'},\n"
        "    'name': 'Clock v2', 'purpose': 'Broken.', 'code': {'host': BROKEN_HALF}})\n"
        "try:\n"
        "    await tools.cordis_run({'pluginId': 'clock-1', 'packageId': d['packageId'],\n"
        "        'mode': 'update'})\n"
        "except ToolCallError as e:\n"
        "    print(f'update failed: {e}')\n"
        "p = await tools.cordis_inspect_self({'pluginId': 'clock-1'})\n"
        "return {k: p.get(k) for k in ('state', 'currentPackageId', 'nextPackageId')}",
    ),
    (
        "roll back to current",
        "r = await tools.cordis_run({'pluginId': 'clock-1', 'packageId': 'pkg-1', 'mode': 'run'})\n"
        "return {k: r[k] for k in ('status', 'pluginRunId', 'currentPackageId')}",
    ),
    (
        "call the tool, stop the plugin, call the tool again",
        "before = await tools.clock_now({})\n"
        "await tools.cordis_stop({'pluginId': 'clock-1'})\n"
        "try:\n"
        "    await tools.clock_now({})\n"
        "except ToolCallError as e:\n"
        "    print(f'after stop: {e}')\n"
        "return before",
    ),
]


async def run_cordis_demo() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        async with running(
            "-m", "runtime_service", "--listen", "127.0.0.1:0", ready="runtime listening on port "
        ) as runtime:
            settings = RegistrySettings(
                listen="127.0.0.1:0",
                runtime_targets=[f"127.0.0.1:{runtime.rest}"],
                history_path=str(Path(tmp) / "history.sqlite3"),
            )
            registry = await start_registry(settings)
            client = RegistryClient(registry.address)
            try:
                print(f"runtime on 127.0.0.1:{runtime.rest} · registry up\n")
                await _walkthrough(client)
                await page_runner_walkthrough(client)
            finally:
                await client.close()
                await registry.stop(1)
    return 0


async def _walkthrough(client: RegistryClient) -> None:
    agent = (await client.create_agent("cordis-agent", mode="code", self_modification=True)).name
    print(f"{agent} (mode code, self_modification on)")
    print(f"  tools behind the SDK: {', '.join(await _tools(client, agent))}\n")
    steered: asyncio.Queue[AgentMessage] = asyncio.Queue()

    async def watch() -> None:
        async for message in client.watch_agent_messages(agent):
            await steered.put(message)

    watcher = asyncio.ensure_future(watch())
    try:
        for number, (title, code) in enumerate(STEPS, start=1):
            await _step(client, agent, number, title, code)
            if "kills its plugin host" in title:
                message = await asyncio.wait_for(steered.get(), 60)
                print(f"  WatchHistory delivered agent/{message.kind} from {message.source}:")
                print("".join(f"    ▏ {line}\n" for line in message.text.splitlines()))
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    print(f"tools behind the SDK now: {', '.join(await _tools(client, agent))}")
    records = [m for r in await client.history(agent) if (m := agent_message(r)) is not None]
    print(f"\nsteering records in {agent}'s history: {len(records)}")
    for m in records:
        first = m.text.splitlines()[0]
        print(f"  #{m.seq} agent/{m.kind} {m.metadata.get('pluginRunId', '')}: {first}")


async def _tools(client: RegistryClient, agent: str) -> list[str]:
    return [t.name for t in await client.list_tools(agent) if t.name != "run_code"]


async def _step(client: RegistryClient, agent: str, number: int, title: str, code: str) -> None:
    print(f"program {number}: {title}")
    print("".join(f"  │ {line}\n" for line in code.splitlines()))
    source = code.replace("HOST_HALF", repr(HOST_HALF)).replace("BROKEN_HALF", repr(BROKEN_HALF))
    result = await client.run_code(source, title, agent=agent, call_id=f"cordis-{number}")
    _print_trajectory(number, result)


def _print_trajectory(number: int, result: ToolCallResult) -> None:
    settled = [e.nested_settled for e in result.events if e.WhichOneof("event") == "nested_settled"]
    print(f"  trajectory: run_code cordis-{number} ({len(settled)} nested calls)")
    for i, s in enumerate(settled):
        branch = "└─" if i == len(settled) - 1 else "├─"
        status = f"error {s.error_code}".strip() if s.is_error else "ok"
        print(f"  {branch} {s.sub_call_id:<18} {s.tool_name:<20} {status}")
    if result.is_error:
        print(f"  result [error {result.error_code}]: {result.error_message}\n")
        return
    value = result.value if isinstance(result.value, dict) else {}
    logs = value.get("logs")
    for line in logs if isinstance(logs, list) else []:
        print(f"  log: {line}")
    if "result" in value:
        print(f"  result: {jsonvalue.dumps(value['result'])}")
    print()
