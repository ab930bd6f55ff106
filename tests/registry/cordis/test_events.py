"""Events a plugin observes (`ctx.on` / `ctx.once`) with a real plugin host: the owner's
history records as they are written, in order; `once` fires once; a disposer stops a listener;
another agent's activity is not delivered. Through the gRPC API only."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.registry.cordis.conftest import CordisHarness
from tests.registry.cordis.real_stack import LANGUAGES, real_stack

LISTENER_PY = """\
results = []
first_calls = []
dropped = []

def apply(ctx):
    ctx.on("tool/result", lambda event: results.append([event["name"], event["isError"]]))
    ctx.once("tool/call", lambda event: first_calls.append(event["name"]))
    off = ctx.on("tool/call", lambda event: dropped.append(event["name"]))
    off()  # disposed at once: never called

    async def seen(args):
        return {"results": results, "first": first_calls, "dropped": dropped}

    harness.register_tool(harness.define_tool(
        name="seen_events", description="What the plugin observed.", execute=seen))

return apply
"""

LISTENER = {
    "python": LISTENER_PY,
    "typescript": """\
const results: unknown[] = [];
const firstCalls: string[] = [];
const dropped: string[] = [];

return (ctx: any) => {
  ctx.on("tool/result", (event: any) => { results.push([event.name, event.isError]); });
  ctx.once("tool/call", (event: any) => { firstCalls.push(event.name); });
  const off = ctx.on("tool/call", (event: any) => { dropped.push(event.name); });
  off(); // disposed at once: never called

  const seen = async () => ({ results, first: firstCalls, dropped });
  harness.registerTool(harness.defineTool({
    name: "seen_events", description: "What the plugin observed.", execute: seen,
  }));
};
""",
}


async def _seen_until(h: CordisHarness, agent: str, done: Any) -> Any:
    for attempt in range(500):
        seen = await h.ok(agent, "seen_events", {}, f"s{attempt}")
        if done(seen):
            return seen
        await asyncio.sleep(0.02)
    raise AssertionError(f"the plugin never observed enough: {seen}")


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_plugin_observes_its_owners_tool_records_in_order(language: str) -> None:
    async with real_stack() as h:
        agent = await h.agent("watcher", language=language)
        other = await h.agent("stranger")
        defined = await h.define(agent, LISTENER[language], prefix="seen", name="Seen")
        await h.ok(
            agent,
            "cordis_run",
            {"pluginId": defined["pluginId"], "packageId": defined["packageId"], "mode": "run"},
        )
        await h.ok(agent, "cordis_inspect_self", {}, "i1")
        await h.ok(other, "cordis_inspect_self", {}, "x1")  # another agent's: not delivered
        refused = await h.call(agent, "cordis_stop", {"pluginId": "nope-9"}, "i2")
        assert refused.is_error

        def enough(seen: Any) -> bool:
            return [r for r in seen["results"] if r[0] != "seen_events"][:3] == [
                ["cordis_run", False],  # its own activation's result, written after it started
                ["cordis_inspect_self", False],
                ["cordis_stop", True],
            ]

        seen = await _seen_until(h, agent, enough)
        assert seen["first"] == ["cordis_inspect_self"]  # once: the first call only
        assert seen["dropped"] == []
        listed = await h.ok(agent, "cordis_inspect_self", {"pluginId": defined["pluginId"]}, "i3")
        assert listed["state"] == "running"
