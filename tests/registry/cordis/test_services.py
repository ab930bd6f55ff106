"""Services between one owner's plugins, with real plugin hosts (each plugin its own sandboxed
process): a consumer whose injected service is missing parks `waiting`, starts when a provider
appears, calls the provider's methods through the registry, parks again when the provider
stops, and starts again when it is back. Through the gRPC API only, for both host languages
(each plugin written once per language)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.registry.cordis.conftest import CordisHarness
from tests.registry.cordis.real_stack import LANGUAGES, real_stack

PROVIDER_PY = """\
class Counter:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self.n

    async def total(self):
        return self.n

def apply(ctx):
    ctx.provide("counter", Counter())
    ctx.provide("config", {"unit": "apples"})
    ctx.provide("leaky", {"ctx": lambda: ctx})

return apply
"""

CONSUMER_PY = """\
class Plugin:
    inject = ["counter", "config"]

    async def apply(self, ctx):
        counter = ctx.counter
        unit = ctx.config["unit"]

        async def count(args):
            return {"total": await counter.add(args["k"]), "unit": unit}

        harness.register_tool(harness.define_tool(
            name="count_up", description="Counts up.",
            parameters={"type": "object", "properties": {"k": {"type": "integer"}}},
            execute=count))

return Plugin()
"""

# Injects nothing: reaches another plugin's service only through ctx.get.
LOOKUP_PY = """\
def apply(ctx):
    async def probe(args):
        out = {}
        try:
            ctx.counter
        except AttributeError as exc:
            out["undeclared"] = str(exc)
        out["missing"] = ctx.get("nothing") is None
        out["viaGet"] = await ctx.get("counter").add(10)
        try:
            await ctx.get("leaky").ctx()
        except Exception as exc:
            out["leak"] = str(exc)
        try:
            await ctx.get("counter").nope()
        except AttributeError as exc:
            out["noMethod"] = str(exc)
        return out

    harness.register_tool(harness.define_tool(
        name="lookup_probe", description="Probes services.", execute=probe))

return apply
"""

PROVIDER = {
    "python": PROVIDER_PY,
    "typescript": """\
class Counter {
  n = 0;

  add(k: number): number {
    this.n += k;
    return this.n;
  }

  async total(): Promise<number> {
    return this.n;
  }
}

return (ctx: any) => {
  ctx.provide("counter", new Counter());
  ctx.provide("config", { unit: "apples" });
  ctx.provide("leaky", { ctx: () => ctx });
};
""",
}
CONSUMER = {
    "python": CONSUMER_PY,
    "typescript": """\
class Plugin {
  inject = ["counter", "config"];

  async apply(ctx: any): Promise<void> {
    const counter = ctx.counter;
    const unit: string = ctx.config.unit;
    const count = async (args: { k: number }) => ({ total: await counter.add(args.k), unit });
    harness.registerTool(harness.defineTool({
      name: "count_up", description: "Counts up.",
      parameters: { type: "object", properties: { k: { type: "integer" } } },
      execute: count,
    }));
  }
}

return new Plugin();
""",
}
LOOKUP = {
    "python": LOOKUP_PY,
    "typescript": """\
return (ctx: any) => {
  const probe = async () => {
    const out: Record<string, unknown> = {};
    try {
      ctx.counter;
    } catch (error) {
      out.undeclared = (error as Error).message;
    }
    out.missing = ctx.get("nothing") === undefined;
    out.viaGet = await ctx.get("counter").add(10);
    try {
      await ctx.get("leaky").ctx();
    } catch (error) {
      out.leak = (error as Error).message;
    }
    try {
      await ctx.get("counter").nope();
    } catch (error) {
      out.noMethod = (error as Error).message;
    }
    return out;
  };
  harness.registerTool(harness.defineTool({
    name: "lookup_probe", description: "Probes services.", execute: probe,
  }));
};
""",
}


async def _state(h: CordisHarness, agent: str, plugin_id: str) -> Any:
    return (await h.ok(agent, "cordis_inspect_self", {"pluginId": plugin_id}))["state"]


async def _host_half(h: CordisHarness, agent: str, plugin_id: str, package_id: str) -> Any:
    view = await h.ok(
        agent, "cordis_inspect_self", {"pluginId": plugin_id, "packageId": package_id}
    )
    return view["runtime"]["host"]


async def _visible_soon(h: CordisHarness, agent: str, name: str, present: bool) -> None:
    for _ in range(500):
        if (name in await h.visible(agent)) == present:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name} {'never appeared' if present else 'never went away'}")


@pytest.mark.parametrize("language", LANGUAGES)
async def test_a_consumer_parks_starts_with_its_provider_and_parks_again_when_it_stops(
    language: str,
) -> None:
    async with real_stack() as h:
        agent = await h.agent("composer", language=language)
        consumer = await h.define(agent, CONSUMER[language], prefix="cons", name="Consumer")
        started = await h.ok(
            agent,
            "cordis_run",
            {"pluginId": consumer["pluginId"], "packageId": consumer["packageId"], "mode": "run"},
        )
        # Parked: a successful activation that waits for both services.
        assert started["host"] == {
            "status": "waiting",
            "provides": [],
            "waitingFor": ["counter", "config"],
        }
        assert started["currentPackageId"] == consumer["packageId"]
        assert await _state(h, agent, consumer["pluginId"]) == "waiting"
        assert "count_up" not in await h.visible(agent)

        provider = await h.define(agent, PROVIDER[language], prefix="prov", name="Provider")
        provided = await h.ok(
            agent,
            "cordis_run",
            {"pluginId": provider["pluginId"], "packageId": provider["packageId"], "mode": "run"},
        )
        assert provided["host"]["provides"] == ["config", "counter", "leaky"]
        await _visible_soon(h, agent, "count_up", present=True)
        assert await _state(h, agent, consumer["pluginId"]) == "running"
        half = await _host_half(h, agent, consumer["pluginId"], consumer["packageId"])
        assert half["status"] == "running" and half["waitingFor"] == []

        # The consumer's tool calls the provider's method: state lives in the provider's host.
        assert await h.ok(agent, "count_up", {"k": 2}, "c1") == {"total": 2, "unit": "apples"}
        assert await h.ok(agent, "count_up", {"k": 3}, "c2") == {"total": 5, "unit": "apples"}

        # The provider stops: the consumer is disposed and parks again.
        await h.ok(agent, "cordis_stop", {"pluginId": provider["pluginId"]})
        await _visible_soon(h, agent, "count_up", present=False)
        for _ in range(500):
            if await _state(h, agent, consumer["pluginId"]) == "waiting":
                break
            await asyncio.sleep(0.02)
        half = await _host_half(h, agent, consumer["pluginId"], consumer["packageId"])
        assert half["status"] == "waiting"
        assert sorted(half["waitingFor"]) == ["config", "counter"]

        # Back again: the consumer starts again, against a fresh provider.
        await h.ok(
            agent,
            "cordis_run",
            {"pluginId": provider["pluginId"], "packageId": provider["packageId"], "mode": "run"},
        )
        await _visible_soon(h, agent, "count_up", present=True)
        assert await h.ok(agent, "count_up", {"k": 1}, "c3") == {"total": 1, "unit": "apples"}

        # Another agent's plugins provide nothing to this owner's.
        other = await h.agent("stranger", language=language)
        lonely = await h.define(other, CONSUMER[language], prefix="cons", name="Consumer")
        parked = await h.ok(
            other,
            "cordis_run",
            {"pluginId": lonely["pluginId"], "packageId": lonely["packageId"], "mode": "run"},
        )
        assert parked["host"]["status"] == "waiting"


@pytest.mark.parametrize("language", LANGUAGES)
async def test_ctx_get_reaches_a_service_without_inject_and_the_facade_refuses_the_rest(
    language: str,
) -> None:
    async with real_stack() as h:
        agent = await h.agent("composer", language=language)
        provider = await h.define(agent, PROVIDER[language], prefix="prov", name="Provider")
        await h.ok(
            agent,
            "cordis_run",
            {"pluginId": provider["pluginId"], "packageId": provider["packageId"], "mode": "run"},
        )
        lookup = await h.define(agent, LOOKUP[language], prefix="look", name="Lookup")
        await h.ok(
            agent,
            "cordis_run",
            {"pluginId": lookup["pluginId"], "packageId": lookup["packageId"], "mode": "run"},
        )
        out = await h.ok(agent, "lookup_probe", {}, "p1")
        assert out["undeclared"].startswith('service "counter" is not injected. Declare it:')
        assert out["missing"] is True
        assert out["viaGet"] == 10
        assert out["leak"] == (
            'service "leaky" returned a cordis Context, which the sandbox does not expose; '
            "return data instead"
        )
        assert out["noMethod"] == 'service "counter" has no method "nope"'
        counter = await h.ok(
            agent,
            "cordis_inspect_query",
            {
                "platform": "host",
                "provider": "Service",
                "method": "listService",
                "input": {"service": "counter"},
            },
        )
        assert counter["data"]["service"]["kind"] == "methods"
        assert counter["data"]["service"]["methods"] == ["add", "total"]
        assert counter["data"]["service"]["providedBy"] == provider["pluginId"]


GATE = """\
import asyncio

class Gate:
    def __init__(self):
        self.waiting = 0
        self.cancelled = 0

    async def wait(self):
        self.waiting += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def status(self):
        return {"waiting": self.waiting, "cancelled": self.cancelled}

def apply(ctx):
    ctx.provide("gate", Gate())

return apply
"""

HOLDER = """\
class Plugin:
    inject = ["gate"]

    async def apply(self, ctx):
        gate = ctx.gate

        async def hold(args):
            await gate.wait()
            return "released"

        async def status(args):
            return await gate.status()

        harness.register_tool(harness.define_tool(
            name="gate_hold", description="Waits at the gate.", execute=hold))
        harness.register_tool(harness.define_tool(
            name="gate_status", description="The gate's counts.", execute=status))

return Plugin()
"""


async def test_a_cancelled_call_cancels_the_service_call_it_was_waiting_on() -> None:
    async with real_stack() as h:
        agent = await h.agent("composer")
        for source, prefix in ((GATE, "gate"), (HOLDER, "hold")):
            defined = await h.define(agent, source, prefix=prefix, name=prefix.title())
            args = {"pluginId": defined["pluginId"], "packageId": defined["packageId"]}
            await h.ok(agent, "cordis_run", {**args, "mode": "run"})
        await _visible_soon(h, agent, "gate_hold", present=True)
        call = h.stub.ExecuteToolCall(
            rpb.ExecuteToolCallRequest(
                agent=agent, call_id="held", tool_name="gate_hold", arguments_json="{}"
            )
        )
        status: Any = {}
        for attempt in range(500):  # the provider's method is running
            status = await h.ok(agent, "gate_status", {}, f"s{attempt}")
            if status["waiting"] == 1:
                break
            await asyncio.sleep(0.02)
        assert status == {"waiting": 1, "cancelled": 0}
        call.cancel()
        for attempt in range(500):  # the consumer's cancel reaches the provider's method
            status = await h.ok(agent, "gate_status", {}, f"t{attempt}")
            if status["cancelled"] == 1:
                break
            await asyncio.sleep(0.02)
        assert status == {"waiting": 1, "cancelled": 1}
