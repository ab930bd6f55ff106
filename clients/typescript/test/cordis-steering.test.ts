/**
 * Steering records through the TypeScript client against the REAL services: a dynamic Cordis
 * plugin whose tool kills its own plugin host (a real runtime worker) produces exactly one
 * `agent/steer` record, which `watchAgentMessages` delivers as a typed `AgentMessage`.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { RegistryClient, agentMessage, type AgentMessage, type JsonObject, type ToolCallEvent } from "../src/index";
import { startService, stopService, type Service } from "./services";

const DYING = `import os

def die(args):
    os._exit(3)

async def apply(ctx):
    harness.register_tool(harness.define_tool(
        name="doomed", description="Kills its plugin host.",
        parameters={"type": "object"}, execute=die))

return apply
`;

let runtime: Service | undefined;
let registry: Service | undefined;
let client: RegistryClient;

async function program(agent: string, code: string): Promise<JsonObject> {
  let last: ToolCallEvent | undefined;
  for await (const event of client.runCode(agent, code, "cordis")) last = event;
  assert.ok(last?.type === "result");
  assert.ok(!last.result.isError, last.result.error?.message);
  return last.result.value as JsonObject;
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

describe("Cordis steering", () => {
  it("a crashed plugin host steers its owner once, typed by watchAgentMessages", async () => {
    const agent = (await client.createAgent("ts-coder", { mode: "code", selfModification: true })).name;
    const started = await program(
      agent,
      `d = await tools.cordis_define({'plugin': {'kind': 'new', 'idPrefix': 'doom'}, 'name': 'Doom', ` +
        `'purpose': 'Die.', 'code': {'host': ${JSON.stringify(DYING)}}})\n` +
        "return await tools.cordis_run({'pluginId': d['pluginId'], 'packageId': d['packageId'], 'mode': 'run'})",
    );
    assert.equal((started.result as JsonObject).status, "running");

    const stop = new AbortController();
    const messages = client.watchAgentMessages(agent, { signal: stop.signal });
    const first = messages.next();
    await program(agent, "try:\n    await tools.doomed({})\nexcept Exception as e:\n    print(str(e))\n");
    const next = await first;
    stop.abort();
    await messages.return(undefined);
    assert.ok(!next.done);
    const message: AgentMessage = next.value;
    assert.equal(message.kind, "steer");
    assert.equal(message.source, "cordis-host-runner");
    assert.deepEqual(message.metadata, { pluginId: "doom-1", packageId: "pkg-1", pluginRunId: "run-1" });
    const lines = message.text.split("\n");
    assert.equal(lines[0], "Cordis run doom-1/pkg-1 (run-1) failed after cordis_run returned running: plugin-host-lost");
    assert.match(lines[1]!, /^the plugin host of doom-1 stopped unexpectedly: .+/);
    assert.deepEqual(lines.slice(2), [
      "currentPackageId: pkg-1",
      "nextPackageId: pkg-1",
      "Inspect the failed Package, correct it on the same Plugin when needed, and retry the activation autonomously.",
    ]);

    // After a later call, still exactly one steer record (once per distinct kind per run).
    await program(agent, "return await tools.cordis_inspect_self({'pluginId': 'doom-1'})");
    const { records } = await client.listHistory(agent, { pageSize: 500 });
    const steers = records.filter((r) => r.kind === "agent/steer");
    assert.equal(steers.length, 1);
    assert.deepEqual(agentMessage(steers[0]!), message);
  });
});
