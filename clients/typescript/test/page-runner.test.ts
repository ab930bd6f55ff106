/**
 * The page-runner protocol through the TypeScript client against the REAL services (a runtime
 * whose plugin hosts run the Host halves, a registry): activation requests and every settle
 * rule, grants, direct panel gestures, `invoke` codes, render failures, client inspect
 * manifests and queries. Outcomes are read back as the agent's `agent/steer` / `agent/inject`
 * records.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  PageRunner,
  RegistryClient,
  agentMessage,
  type AgentMessage,
  type InspectProvider,
  type JsonObject,
  type JsonValue,
  type RunRequest,
} from "../src/index";
import { startService, stopService, type Service } from "./services";

const HOST = `def greet(args):
    return {"hello": args["name"]}

def boom(args):
    raise ValueError("no greeting today")

async def apply(ctx):
    harness.handle("greet", greet)
    harness.handle("boom", boom)

return apply
`;
const BROKEN = "async def apply(ctx):\n    raise RuntimeError('cannot start')\n\nreturn apply\n";
const CLIENT = "return { apply(ctx) { ctx.log('hello') } }";

let runtime: Service | undefined;
let registry: Service | undefined;
let client: RegistryClient;
let agents = 0;

async function tool(agent: string, toolName: string, args: JsonValue): Promise<JsonObject> {
  const result = await client.executeToolCall({ agent, toolName, arguments: args }).result;
  assert.ok(!result.isError, result.error?.message);
  return result.value as JsonObject;
}

/** A fresh agent with a client-bearing plugin `panel-<n>` defined (package `pkg-<m>`). */
async function defined(host = HOST): Promise<{ agent: string; pluginId: string; packageId: string }> {
  const agent = (await client.createAgent(`page-${++agents}`, { selfModification: true })).name;
  const out = await tool(agent, "cordis_define", {
    plugin: { kind: "new", idPrefix: "panel" },
    name: "Panel",
    purpose: "Greets.",
    code: { host, client: CLIENT },
  });
  return { agent, pluginId: out.pluginId as string, packageId: out.packageId as string };
}

function run(agent: string, pluginId: string, packageId: string, mode = "run"): Promise<JsonObject> {
  return tool(agent, "cordis_run", { pluginId, packageId, mode });
}

async function messages(agent: string, count: number): Promise<AgentMessage[]> {
  for (let i = 0; i < 500; i++) {
    const { records } = await client.listHistory(agent);
    const found = records.map(agentMessage).filter((m): m is AgentMessage => m !== undefined);
    if (found.length >= count) return found;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`${count} steer/inject records were not written`);
}

async function state(agent: string, pluginId: string): Promise<JsonObject> {
  return tool(agent, "cordis_inspect_self", { pluginId });
}

before(async () => {
  runtime = await startService("runtime_service", "runtime listening on port ", { CODEMODE_RUNTIME_POOL_SIZE: "1" });
  registry = await startService("registry_service", "registry listening on port ", {
    CODEMODE_REGISTRY_RUNTIME_TARGETS: JSON.stringify([`127.0.0.1:${runtime.port}`]),
    CODEMODE_REGISTRY_HISTORY_PATH: ":memory:",
  });
  client = new RegistryClient(`127.0.0.1:${registry.port}`, { timeoutMs: 10_000, executeTimeoutMs: 30_000 });
});

after(async () => {
  client?.close();
  await stopService(registry);
  await stopService(runtime);
});

describe("page runners", () => {
  it("an approved request runs the Host half, gives the exact run's Client half, commits and steers", async () => {
    const { agent, pluginId, packageId } = await defined();
    const page = await PageRunner.attach(client, agent);
    try {
      const out = await run(agent, pluginId, packageId);
      assert.equal(out.status, "awaiting-approval");
      const { request } = await page.nextEvent("run-requested");
      assert.deepEqual(request, {
        requestId: request.requestId,
        agent,
        pluginId,
        packageId,
        pluginRunId: out.pluginRunId as string,
        mode: "run",
        name: "Panel",
        purpose: "Greets.",
        requiresApproval: true,
        hasHostHalf: true,
        source: { host: HOST, client: CLIENT, truncated: false }, // for the person to review
      } satisfies RunRequest);
      assert.match(request.requestId, /^approval-\d+$/);
      const early = await page.clientCode(pluginId, request.pluginRunId);
      assert.equal(early.accepted, false);
      const started = await page.runHostHalf(request);
      assert.ok(started.accepted, started.message);
      assert.equal(started.startedHere, true);
      assert.equal((await state(agent, pluginId)).state, "client-pending");
      const code = await page.clientCode(pluginId, started.pluginRunId);
      assert.deepEqual(code.clientCode, { code: CLIENT, name: "Panel", pluginId, packageId, pluginRunId: started.pluginRunId });
      assert.equal((await page.clientCode(pluginId, "run-0")).clientCode, undefined);
      assert.equal((await page.settle(request.requestId, started.pluginRunId)).accepted, true);
      assert.deepEqual(await page.nextEvent("run-resolved"), { type: "run-resolved", requestId: request.requestId, outcome: "approved" });
      const duplicate = await page.settle(request.requestId, started.pluginRunId);
      assert.deepEqual([duplicate.accepted, duplicate.code], [false, "request-unknown"]);
      const plugin = await state(agent, pluginId);
      assert.equal(plugin.state, "running");
      assert.equal(plugin.currentPackageId, packageId);
      const [steer] = await messages(agent, 1);
      assert.equal(steer!.kind, "steer");
      assert.equal(
        steer!.text,
        `Cordis run ${pluginId}/${packageId} (${started.pluginRunId}) completed successfully. ` +
          `currentPackageId is ${packageId}. Continue using the running Plugin.`,
      );
    } finally {
      page.close();
    }
  });

  it("invoke reaches harness.handle handlers with their result and codes", async () => {
    const { agent, pluginId, packageId } = await defined();
    const page = await PageRunner.attach(client, agent);
    try {
      assert.deepEqual(
        await page.invoke(pluginId, "run-0", "greet", { name: "Ada" }),
        { ok: false, code: "plugin-not-running", message: `dynamic plugin "${pluginId}" is not running` },
      );
      await run(agent, pluginId, packageId);
      const { request } = await page.nextEvent("run-requested");
      const started = await page.runHostHalf(request);
      await page.settle(request.requestId, started.pluginRunId);
      const runId = started.pluginRunId;
      assert.deepEqual(await page.invoke(pluginId, runId, "greet", { name: "Ada" }), { ok: true, value: { hello: "Ada" } });
      const stale = await page.invoke(pluginId, "run-0", "greet", {});
      assert.equal(stale.ok === false && stale.code, "stale-run");
      const missing = await page.invoke(pluginId, runId, "nope");
      assert.equal(missing.ok === false && missing.code, "method-not-found");
      const failed = await page.invoke(pluginId, runId, "boom", {});
      assert.ok(failed.ok === false);
      assert.equal(failed.code, "handler-error");
      assert.equal(failed.message, "no greeting today");
      assert.match(failed.stack ?? "", /ValueError/);
      const steers = (await messages(agent, 2)).filter((m) => m.kind === "steer");
      assert.match(steers[1]!.text, /failed after cordis_run returned running: handler-error\nhost\.call\('boom'\) failed/);
    } finally {
      page.close();
    }
  });

  it("a rejection runs nothing and steers; answers after it and after stop are refused", async () => {
    const { agent, pluginId, packageId } = await defined();
    const page = await PageRunner.attach(client, agent);
    try {
      await run(agent, pluginId, packageId);
      const { request } = await page.nextEvent("run-requested");
      assert.equal((await page.settle(request.requestId, "", "rejected")).accepted, true);
      assert.equal((await page.nextEvent("run-resolved")).outcome, "rejected");
      assert.equal((await page.runHostHalf(request)).code, "request-unknown");
      const [steer] = await messages(agent, 1);
      assert.equal(
        steer!.text,
        `The user rejected Cordis run ${pluginId}/${packageId} (${request.pluginRunId}). ` +
          "Do not request the same activation again unless the user asks.",
      );

      await run(agent, pluginId, packageId); // still no grant: asks again
      const second = (await page.nextEvent("run-requested")).request;
      assert.equal(second.requiresApproval, true);
      await tool(agent, "cordis_stop", { pluginId });
      assert.deepEqual(await page.nextEvent("run-resolved"), { type: "run-resolved", requestId: second.requestId, outcome: "cancelled" });
      assert.equal((await page.runHostHalf(second)).accepted, false);
      assert.equal((await page.settle(second.requestId, second.pluginRunId)).accepted, false);
    } finally {
      page.close();
    }
  });

  it("unknown and stale answers change nothing; a request is answerable by a page attaching after the tool returned", async () => {
    const { agent, pluginId, packageId } = await defined();
    await run(agent, pluginId, packageId); // no page yet: the tool returned anyway
    const page = await PageRunner.attach(client, agent);
    try {
      const { request } = await page.nextEvent("run-requested"); // replayed on attach
      assert.equal((await page.settle("approval-999", request.pluginRunId)).code, "request-unknown");
      assert.equal((await page.settle(request.requestId, request.pluginRunId)).code, "stale-run"); // no run yet
      const started = await page.runHostHalf(request);
      assert.equal((await page.settle(request.requestId, "run-999", "client-half-failed")).code, "stale-run");
      assert.equal((await state(agent, pluginId)).state, "client-pending");
      assert.equal((await page.settle(request.requestId, started.pluginRunId)).accepted, true);
      assert.equal((await state(agent, pluginId)).state, "running");
    } finally {
      page.close();
    }
  });

  it("grants per package and for future versions; a grant survives a failed Host half", async () => {
    const { agent, pluginId, packageId } = await defined(BROKEN);
    const page = await PageRunner.attach(client, agent);
    try {
      await run(agent, pluginId, packageId);
      const { request } = await page.nextEvent("run-requested");
      const started = await page.runHostHalf(request, { approveFutureVersions: true });
      assert.deepEqual([started.accepted, started.code], [false, "host-half-failed"]);
      assert.match(started.message, /cannot start/);
      assert.equal((await page.settle(request.requestId, "", "host-half-failed", { message: started.message })).accepted, true);
      assert.equal((await page.nextEvent("run-resolved")).outcome, "failed");
      const [steer] = await messages(agent, 1);
      assert.match(steer!.text, /failed after cordis_run returned awaiting-approval: host-half-failed\n/);
      assert.match(steer!.text, /currentPackageId: none\nnextPackageId: pkg-\d+\n/);

      const fixed = await tool(agent, "cordis_define", {
        plugin: { kind: "existing", pluginId },
        name: "Panel",
        purpose: "Greets.",
        code: { host: HOST, client: CLIENT },
      });
      const again = await run(agent, pluginId, fixed.packageId as string);
      assert.equal(again.status, "starting"); // future versions were approved with the failed one
      const next = (await page.nextEvent("run-requested")).request;
      assert.equal(next.requiresApproval, false);
      const ok = await page.runHostHalf(next);
      await page.settle(next.requestId, ok.pluginRunId);
      assert.equal((await page.nextEvent("run-resolved")).outcome, "completed");
    } finally {
      page.close();
    }
  });

  it("two pages share one activation; the first valid settlement wins; panel gestures inject", async () => {
    const { agent, pluginId, packageId } = await defined();
    const one = await PageRunner.attach(client, agent);
    const two = await PageRunner.attach(client, agent);
    try {
      await run(agent, pluginId, packageId);
      const { request } = await one.nextEvent("run-requested");
      await two.nextEvent("run-requested");
      const [a, b] = await Promise.all([one.runHostHalf(request), two.runHostHalf(request)]);
      assert.ok(a.accepted && b.accepted);
      assert.equal(a.pluginRunId, b.pluginRunId);
      assert.deepEqual([a.startedHere, b.startedHere].sort(), [false, true]);
      assert.equal((await two.settle(request.requestId, b.pluginRunId)).accepted, true);
      assert.equal((await one.settle(request.requestId, a.pluginRunId)).accepted, false);

      const attached = await two.panelRun(pluginId, packageId); // identical attempt: shared
      assert.deepEqual([attached.accepted, attached.startedHere, attached.pluginRunId], [true, false, a.pluginRunId]);
      await two.settlePanelRun(pluginId, attached.pluginRunId, "client-half-failed", { message: "no DOM" });
      assert.equal((await state(agent, pluginId)).state, "running"); // its failure does not stop the run

      assert.equal((await one.stop(pluginId)).accepted, true);
      const direct = await one.panelRun(pluginId, packageId);
      assert.ok(direct.accepted && direct.startedHere);
      assert.equal((await one.settlePanelRun(pluginId, direct.pluginRunId)).accepted, true);
      assert.equal((await one.remove(pluginId)).accepted, true);
      const all = await messages(agent, 4);
      assert.deepEqual(
        all.map((m) => m.kind),
        ["steer", "inject", "inject", "inject"],
      );
      assert.equal(all[1]!.text, `The user stopped Cordis Plugin ${pluginId} from the plugin panel; its definition and versions remain.`);
      assert.match(all[2]!.text, new RegExp(`^The user ran Cordis run ${pluginId}/${packageId} \\(${direct.pluginRunId}\\) from the plugin panel; it completed successfully`));
      assert.equal(all[3]!.text, `The user removed Cordis Plugin ${pluginId} and all of its Packages from the plugin panel.`);
    } finally {
      one.close();
      two.close();
    }
  });

  it("render failures are kept per run, dropped for foreign agents, cleared by a stop", async () => {
    const { agent, pluginId, packageId } = await defined();
    const stranger = (await client.createAgent(`page-${++agents}`, { selfModification: true })).name;
    const page = await PageRunner.attach(client, agent);
    const foreign = await PageRunner.attach(client, stranger);
    try {
      await run(agent, pluginId, packageId);
      const { request } = await page.nextEvent("run-requested");
      const started = await page.runHostHalf(request);
      await page.settle(request.requestId, started.pluginRunId);
      assert.equal((await foreign.reportRenderFailure(pluginId, started.pluginRunId, "not yours")).accepted, false);
      assert.equal((await page.reportRenderFailure(pluginId, started.pluginRunId, "TypeError: x is null")).accepted, true);
      const view = async (): Promise<JsonObject> =>
        ((await tool(agent, "cordis_inspect_self", { pluginId, packageId })).runtime as JsonObject).client as JsonObject;
      const failure = (await view()).renderFailure as JsonObject;
      assert.equal(failure.phase, "client-render");
      assert.equal(failure.message, "TypeError: x is null");
      await page.stop(pluginId);
      assert.equal((await view()).renderFailure, undefined);
    } finally {
      page.close();
      foreign.close();
    }
  });

  it("client manifests sync wholesale; queries take the first valid successful answer; cancellation resolves them", async () => {
    const agent = (await client.createAgent(`page-${++agents}`, { selfModification: true })).name;
    const page = await PageRunner.attach(client, agent);
    const manifest: InspectProvider[] = [
      {
        id: "Theme",
        description: "The page's theme tokens.",
        methods: [
          {
            name: "listTokens",
            description: "Token names.",
            inputSchema: { type: "object", properties: {} },
            outputSchema: { type: "object", properties: { tokens: { type: "array", items: { type: "string" } } }, required: ["tokens"] },
          },
        ],
      },
    ];
    try {
      assert.equal((await page.syncManifest([{ id: "", description: "x", methods: [] }])).code, "invalid-manifest");
      assert.equal((await page.syncManifest(manifest)).accepted, true);
      const listed = await tool(agent, "cordis_inspect_list", {});
      const clients = (listed.providers as JsonObject[]).filter((p) => p.platform === "client");
      assert.deepEqual(clients.map((p) => p.id), ["Theme"]);

      const call = client.executeToolCall({
        agent,
        toolName: "cordis_inspect_query",
        arguments: { platform: "client", provider: "Theme", method: "listTokens" },
      });
      const { query } = await page.nextEvent("inspect-query");
      assert.deepEqual([query.provider, query.method, query.input], ["Theme", "listTokens", {}]);
      assert.equal((await page.failQuery(query.queryId, "no DOM")).code, "answer-failed");
      assert.equal((await page.answerQuery(query.queryId, { tokens: "red" })).code, "invalid-output");
      assert.equal((await page.answerQuery(query.queryId, { tokens: ["red"] })).accepted, true);
      const result = await call.result;
      assert.deepEqual(result.value, { platform: "client", provider: "Theme", method: "listTokens", data: { tokens: ["red"] } });
      assert.equal((await page.nextEvent("inspect-query-resolved")).outcome, "answered");

      const cancelled = client.executeToolCall({
        agent,
        toolName: "cordis_inspect_query",
        arguments: { platform: "client", provider: "Theme", method: "listTokens" },
      });
      const asked = (await page.nextEvent("inspect-query")).query;
      cancelled.cancel();
      await cancelled.result.catch(() => undefined);
      assert.deepEqual(await page.nextEvent("inspect-query-resolved"), {
        type: "inspect-query-resolved",
        queryId: asked.queryId,
        outcome: "cancelled",
      });
      assert.equal((await page.answerQuery(asked.queryId, { tokens: [] })).accepted, false);

      assert.equal((await page.syncManifest([])).accepted, true); // wholesale: now none
      const after = await tool(agent, "cordis_inspect_list", {});
      assert.deepEqual((after.providers as JsonObject[]).filter((p) => p.platform === "client"), []);
    } finally {
      page.close();
    }
  });
});
