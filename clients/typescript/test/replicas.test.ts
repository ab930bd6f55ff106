/**
 * One provider and one approver serving every registry replica behind a name, against
 * two REAL registries (Python processes); the name's resolution is a function the test changes,
 * as a headless Service's DNS does when pods come and go.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { Approver, RegistryClient, ReplicaSet, ToolProvider, resolveAll, splitTarget } from "../src/index";
import { freePort, startRegistry, stopService, type Service } from "./services";

let tmp: string;
let rules: string;
const services: Service[] = [];
const clients: RegistryClient[] = [];
let ports: number[] = [];

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), "codemode-ts-replicas-"));
  rules = join(tmp, "rules.yaml");
  writeFileSync(rules, "rules:\n  - tool: deploy\n    action: ask\n");
  ports = [await freePort(), await freePort()];
  for (const port of ports) services.push(await startRegistry(port, { CODEMODE_REGISTRY_POLICY_RULES: rules }));
});

after(async () => {
  for (const c of clients.splice(0)) c.close();
  await Promise.all(services.map((s) => stopService(s)));
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

function client(address: string): RegistryClient {
  const c = new RegistryClient(address, { timeoutMs: 10_000, executeTimeoutMs: 30_000 });
  clients.push(c);
  return c;
}

async function until(condition: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 500; i++) {
    if (await condition()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`never happened: ${what}`);
}

async function has(address: string, tool: string): Promise<boolean> {
  return (await client(address).listVisibleTools()).tools.some((t) => t.name === tool);
}

describe("ReplicaSet", () => {
  it("serves a provider on every replica and follows the resolution", async () => {
    const [a, b] = ports.map((p) => `127.0.0.1:${p}`);
    const resolution = [a];
    const servedBy: string[] = [];
    const provider = new ToolProvider(undefined, "echoes").tool({ name: "echo", inputSchema: { type: "object" } }, (args, ctx) => {
      servedBy.push(ctx.agent);
      return args;
    });
    const replicas = new ReplicaSet("registry.test:1", (c) => provider.onClient(c), {
      refreshMs: 50,
      resolve: async () => [...resolution],
    });
    const serving = replicas.serve();
    await replicas.resolved();
    await until(() => has(a, "echo"), "echo on the first replica");
    assert.equal(await has(b, "echo"), false);
    resolution.push(b); // a replica appears
    await until(() => has(b, "echo"), "echo on the second replica");
    assert.deepEqual(replicas.addresses, [a, b].sort());
    for (const [address, agent] of [[a, "ts-on-a"], [b, "ts-on-b"]]) {
      const c = client(address);
      const name = (await c.createAgent(agent, { mode: "native" })).name;
      const result = await c.executeToolCall({ agent: name, toolName: "echo", arguments: { from: agent } }).result;
      assert.equal(result.isError, false, result.error?.message);
      assert.deepEqual(result.value, { from: agent });
    }
    assert.deepEqual(servedBy, ["agents/ts-on-a", "agents/ts-on-b"]);
    resolution.splice(0, 1); // a replica goes away: its stream is closed
    await until(async () => !(await has(a, "echo")), "echo gone from the first replica");
    assert.deepEqual(replicas.addresses, [b]);
    await replicas.close();
    await serving;
    await until(async () => !(await has(b, "echo")), "echo gone from the second replica");
  });

  it("answers approvals pending on any replica", async () => {
    const addresses = ports.map((p) => `127.0.0.1:${p}`);
    const deployers = addresses.map((address) =>
      new ToolProvider(client(address), "deployer").tool({ name: "deploy", description: "Deploys" }, () => "deployed"),
    );
    for (const d of deployers) await d.start();
    const asked: string[] = [];
    const replicas = new ReplicaSet(
      "registry.test:1",
      (c) =>
        new Approver(c, "oncall", (request) => {
          asked.push(request.agent);
          return "allow";
        }),
      { refreshMs: 50, resolve: async () => addresses },
    );
    const serving = replicas.serve();
    await replicas.resolved();
    try {
      for (const [address, agent] of [[addresses[0], "ts-ops-a"], [addresses[1], "ts-ops-b"]]) {
        const c = client(address);
        const name = (await c.createAgent(agent, { mode: "native" })).name;
        const result = await c.executeToolCall({ agent: name, toolName: "deploy" }).result;
        assert.equal(result.isError, false, result.error?.message);
        assert.equal(result.value, "deployed");
      }
      assert.deepEqual(asked, ["agents/ts-ops-a", "agents/ts-ops-b"]);
    } finally {
      await replicas.close();
      await serving;
      for (const d of deployers) await d.close();
    }
  });

  it("resolves names to every address with the port, and refuses what is not host:port", async () => {
    assert.deepEqual(await resolveAll("127.0.0.1:5005"), ["127.0.0.1:5005"]);
    assert.deepEqual(await resolveAll("[::1]:5005"), ["[::1]:5005"]);
    assert.ok((await resolveAll("localhost:5005")).includes("127.0.0.1:5005"));
    assert.deepEqual(splitTarget("registry.codemode.svc:50051"), ["registry.codemode.svc", 50051]);
    for (const bad of ["registry", "registry:", ":50051", "registry:http", "registry:70000"]) {
      assert.throws(() => splitTarget(bad), /host:port/);
    }
  });

  it("a provider without a client says how to serve it", async () => {
    await assert.rejects(new ToolProvider(undefined, "nowhere").start(), /onClient/);
  });
});
