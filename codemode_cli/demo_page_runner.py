"""The client-bearing part of `codemode demo --cordis`: a scripted page runner answers a code
agent's activation requests over `PageRunnerService.Attach` (the Python client's `PageRunner`).

1. the agent defines a plugin with a Host half (a `harness.handle` handler) and a Client half,
   and runs it: `cordis_run` returns `awaiting-approval` at once;
2. the page hears of the request (with its source to review), approves it by running the Host
   half on the runtime's plugin host, fetches the Client half of the exact active run, calls
   the Host handler as the Client half's `host.call` would, and settles the request: the agent
   is steered that the run completed;
3. the agent updates the plugin to a second package; the page rejects that request: the agent
   is steered not to ask again.

A scripted page does not evaluate the Client half (a browser page runner does): it prints it.
"""

from __future__ import annotations

import asyncio
import contextlib

from codemode_client import AgentMessage, RegistryClient, ToolCallResult
from codemode_client.page_runner import PageRunner
from codemode_wire import jsonvalue

GREETER_HOST = """\
def greet(args):
    return {"greeting": f"hello, {args['name']}"}

async def apply(ctx):
    harness.handle("greet", greet)

return apply
"""
GREETER_CLIENT = """\
const { greeting } = await host.call("greet", { name: "console" });
return { apply(ctx) { console.log(greeting) } };
"""

PROGRAMS: list[tuple[str, str]] = [
    (
        "define a client-bearing plugin and run it",
        "d = await tools.cordis_define({'plugin': {'kind': 'new', 'idPrefix': 'greet'},\n"
        "    'name': 'Greeter', 'purpose': 'Greet in the page.',\n"
        "    'code': {'host': GREETER_HOST, 'client': GREETER_CLIENT}})\n"
        "r = await tools.cordis_run({'pluginId': d['pluginId'], 'packageId': d['packageId'],\n"
        "    'mode': 'run'})\n"
        "return {k: r[k] for k in ('status', 'pluginId', 'packageId', 'pluginRunId')}",
    ),
    (
        "update it to a second package (the page will reject it)",
        "d = await tools.cordis_define({'plugin': {'kind': 'existing', 'pluginId': 'PLUGIN'},\n"
        "    'name': 'Greeter v2', 'purpose': 'Greet louder.',\n"
        "    'code': {'host': GREETER_HOST, 'client': GREETER_CLIENT}})\n"
        "r = await tools.cordis_run({'pluginId': 'PLUGIN', 'packageId': d['packageId'],\n"
        "    'mode': 'update'})\n"
        "return {k: r[k] for k in ('status', 'packageId', 'pluginRunId')}",
    ),
]


async def page_runner_walkthrough(client: RegistryClient) -> None:
    agent = (await client.create_agent("page-agent", mode="code", self_modification=True)).name
    print(f"\n{agent}: a client-bearing plugin, answered by a scripted page runner")
    steered: asyncio.Queue[AgentMessage] = asyncio.Queue()

    async def watch() -> None:
        async for message in client.watch_agent_messages(agent):
            await steered.put(message)

    watcher = asyncio.ensure_future(watch())
    try:
        async with PageRunner(client.channel, agent, "scripted") as page:
            print(f"  page attached for {page.agent}\n")
            plugin = ""
            for number, (title, code) in enumerate(PROGRAMS, start=1):
                source = (
                    code.replace("GREETER_HOST", repr(GREETER_HOST))
                    .replace("GREETER_CLIENT", repr(GREETER_CLIENT))
                    .replace("PLUGIN", plugin)
                )
                print(f"program {number}: {title}")
                result = await client.run_code(source, title, agent=agent, call_id=f"page-{number}")
                plugin = plugin or _print_result(result)
                await (_approve(page) if number == 1 else _reject(page))
                message = await asyncio.wait_for(steered.get(), 60)
                print(f"  WatchHistory delivered agent/{message.kind} from {message.source}:")
                print("".join(f"    ▏ {line}\n" for line in message.text.splitlines()))
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def _print_result(result: ToolCallResult) -> str:
    value = result.value if isinstance(result.value, dict) else {}
    out = value.get("result") if isinstance(value.get("result"), dict) else {}
    print(f"  result: {jsonvalue.dumps(out)}")
    return str(out.get("pluginId", "")) if isinstance(out, dict) else ""


async def _approve(page: PageRunner) -> None:
    request = (await page.next_event("run_requested")).run_requested
    print(
        f"  page: {request.request_id} asks to {request.mode} {request.plugin_id}/"
        f"{request.package_id} ({request.name}: {request.purpose}); approval required: "
        f"{request.requires_approval}"
    )
    started = await page.run_host_half(request)
    print(f"  page: approved; Host half running as {started.plugin_run_id}")
    code = await page.client_code(request.plugin_id, started.plugin_run_id)
    print(f"  page: Client half of {code.client_code.plugin_run_id}:")
    print("".join(f"    │ {line}\n" for line in code.client_code.code.splitlines()), end="")
    called = await page.invoke(
        request.plugin_id, started.plugin_run_id, "greet", {"name": "console"}
    )
    print(f"  page: host.call('greet') -> {called.value_json}")
    settled = await page.settle(request.request_id, started.plugin_run_id)
    resolved = (await page.next_event("run_resolved")).run_resolved
    print(f"  page: settled (accepted: {settled.accepted}); request {resolved.outcome}")


async def _reject(page: PageRunner) -> None:
    request = (await page.next_event("run_requested")).run_requested
    print(f"  page: {request.request_id} asks to {request.mode} to {request.package_id}; rejected")
    await page.settle(request.request_id, outcome="rejected")
    resolved = (await page.next_event("run_resolved")).run_resolved
    print(f"  page: request {resolved.outcome}")
