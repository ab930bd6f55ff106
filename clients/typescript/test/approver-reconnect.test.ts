/**
 * `Approver.serve()` against REAL registries (Python processes) on a fixed port, whose rules ask
 * for approval of `deploy` (served by a TS ToolProvider, itself serving across restarts): the
 * approver answers again after a registry restart (graceful SIGTERM, or a registry killed under a
 * pending request), it waits for a registry that is not up yet, and close() ends it.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, before, describe, it } from "node:test";
import {
  Approver,
  CodemodeError,
  RegistryClient,
  ToolProvider,
  status,
  type ApprovalHandler,
  type ToolCallResult,
} from "../src/index";
import {
  freePort,
  quicklyReconnectingClient,
  startRegistry,
  startService,
  stopService,
  type Service,
} from "./services";

const services: Service[] = [];
const clients: RegistryClient[] = [];
const closers: { close(): Promise<void> }[] = [];
let tmp: string;
let rules: string;

before(() => {
  tmp = mkdtempSync(join(tmpdir(), "codemode-ts-approver-"));
  rules = join(tmp, "rules.yaml");
  writeFileSync(rules, "rules:\n  - tool: deploy\n    action: ask\n");
});

afterEach(async () => {
  await Promise.all(closers.splice(0).map((c) => c.close()));
  await Promise.all(services.splice(0).map((s) => stopService(s)));
  for (const c of clients.splice(0)) c.close();
});

after(async () => {
  await Promise.all(services.map((s) => stopService(s)));
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

async function registry(port: number): Promise<Service> {
  const service = await startRegistry(port, { CODEMODE_REGISTRY_POLICY_RULES: rules });
  services.push(service);
  return service;
}

function client(port: number): RegistryClient {
  const c = quicklyReconnectingClient(port);
  clients.push(c);
  return c;
}

/** Serves `deploy` across registry restarts, so that only the approver is under test. */
function deployer(c: RegistryClient): void {
  const provider = new ToolProvider(c, "deployer").tool({ name: "deploy", description: "Deploys" }, () => "deployed");
  closers.push(provider);
  provider.serve().catch(() => undefined);
}

function approver(c: RegistryClient, handler: ApprovalHandler): Approver {
  const a = new Approver(c, "oncall", handler);
  closers.push(a);
  return a;
}

/** The promise's outcome as it is now, without waiting for it. */
function track(promise: Promise<void>): { settled: boolean; error: unknown } {
  const state = { settled: false, error: undefined as unknown };
  promise.then(
    () => (state.settled = true),
    (e: unknown) => ((state.settled = true), (state.error = e)),
  );
  return state;
}

/**
 * Calls `deploy` until a call succeeds, within 10 s: meanwhile the registry may still be starting,
 * the tool not registered again, or no approver connected (the call is denied).
 */
async function deploy(c: RegistryClient): Promise<{ callId: string; result: ToolCallResult }> {
  const end = Date.now() + 10_000;
  let agentExists = false;
  let last: unknown;
  for (;;) {
    const callId = `deploy-${randomUUID()}`;
    try {
      // Approvals are routed through an agent; a restarted registry (in-memory) has none yet.
      if (!agentExists) await c.createAgent("ops").catch((e: unknown) => {
        if (!(e instanceof CodemodeError && e.code === status.ALREADY_EXISTS)) throw e;
      });
      agentExists = true;
      const result = await c.executeToolCall({ agent: "agents/ops", callId, toolName: "deploy" }).result;
      if (!result.isError) return { callId, result };
      last = result.error?.message;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`deploy was not approved within 10 s: ${String(last)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("Approver.serve() against real registries", () => {
  it("keeps answering across a registry restart on the same port", async () => {
    const port = await freePort();
    const first = await registry(port);
    const c = client(port);
    deployer(c);
    const asked: string[] = [];
    const a = approver(c, (request) => (asked.push(request.callId), "allow"));
    const serving = track(a.serve());

    const before = await deploy(c);
    assert.equal(before.result.value, "deployed");
    assert.ok(asked.includes(before.callId), "the call was approved by the approver");
    assert.notEqual(a.approverId, "");

    const firstStream = a.closed;
    await stopService(first); // graceful: the registry ends the approver stream with UNAVAILABLE
    const lost = await firstStream;
    assert.ok(lost instanceof CodemodeError, "the first stream ended with an error");
    assert.equal(lost.code, status.UNAVAILABLE);
    assert.equal(lost.reason, "REGISTRY_SHUTTING_DOWN");
    assert.equal(serving.settled, false, "serve() outlives the registry");

    await registry(port);
    const after = await deploy(c);
    assert.equal(after.result.value, "deployed");
    assert.ok(asked.includes(after.callId), "the approver answered the restarted registry");
    assert.equal(serving.settled, false, "serve() is still running");

    await a.close();
    assert.equal(serving.settled, true, "close() resolves after serve() did");
    assert.equal(serving.error, undefined);
    assert.equal(await a.closed, undefined);
  });

  it("aborts a request pending on a lost stream and answers a registry that was killed and restarted", async () => {
    const port = await freePort();
    const first = await registry(port);
    const c = client(port);
    deployer(c);
    let started!: () => void;
    const handlerStarted = new Promise<void>((r) => (started = r));
    let onAbort!: (reason: unknown) => void;
    const aborted = new Promise<unknown>((r) => (onAbort = r));
    const a = approver(c, (request, ctx) => {
      if (request.callId !== "hang") return "allow";
      started();
      return new Promise((_resolve, reject) => {
        ctx.signal.addEventListener("abort", () => {
          onAbort(ctx.signal.reason);
          reject(ctx.signal.reason);
        });
      });
    });
    const serving = track(a.serve());
    await assert.rejects(a.serve(), /already serving/); // the first keeps running
    await assert.rejects(a.start(), /serving/);

    await deploy(c); // the approver is connected
    const hanging = c.executeToolCall({ agent: "agents/ops", callId: "hang", toolName: "deploy" }).result;
    hanging.catch(() => undefined);
    await handlerStarted;
    first.proc.kill("SIGKILL"); // no graceful end: the connection just breaks
    const reason = await aborted;
    assert.ok(reason instanceof CodemodeError && reason.code === status.UNAVAILABLE, `aborted with ${String(reason)}`);

    await registry(port);
    assert.equal((await deploy(c)).result.value, "deployed");
    assert.equal(serving.settled, false, "serve() is still running");
  });

  it("waits for a registry that is not up yet", async () => {
    const port = await freePort();
    const c = client(port);
    let attempts = 0;
    const approve = c.stub.approve.bind(c.stub);
    c.stub.approve = ((...args: Parameters<typeof approve>) => (attempts++, approve(...args))) as typeof c.stub.approve;
    const asked: string[] = [];
    const a = approver(c, (request) => (asked.push(request.callId), "allow"));
    const serving = track(a.serve());
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(serving.settled, false, "serve() waits instead of failing");
    assert.equal(attempts, 1, "one stream waits for the registry (no retry loop)");

    await registry(port);
    deployer(c);
    const { callId } = await deploy(c);
    assert.ok(asked.includes(callId));
    await a.close();
    assert.equal(serving.settled, true);
    assert.equal(serving.error, undefined);
  });

  it("close() ends serve() while it waits for a registry", async () => {
    const c = client(await freePort());
    const a = approver(c, () => "allow");
    const serving = track(a.serve());
    await new Promise((r) => setTimeout(r, 300));
    const t0 = Date.now();
    await a.close();
    assert.ok(Date.now() - t0 < 2000, "close() does not wait out the connection attempt");
    assert.equal(serving.settled, true, "close() resolves after serve() did");
    assert.equal(serving.error, undefined);
    assert.equal(await a.closed, undefined);
  });

  it("rejects when the target is not a registry (UNIMPLEMENTED)", async () => {
    // A runtime service is a real gRPC server without the registry's service: no retry fixes that.
    const runtime = await startService("runtime_service", "runtime listening on port ", { CODEMODE_RUNTIME_POOL_SIZE: "1" });
    services.push(runtime);
    const a = approver(client(runtime.port), () => "allow");
    await assert.rejects(a.serve(), (e: unknown) => e instanceof CodemodeError && e.code === status.UNIMPLEMENTED);
    await a.close(); // closing again does not hang
  });
});
