/**
 * `ToolProvider.serve()` against REAL registries (Python processes) on a fixed port: the tools come
 * back after a registry restart (graceful SIGTERM, or a registry killed under a running call), it
 * waits for a registry that is not up yet, and a refused registration ends it.
 */
import assert from "node:assert/strict";
import { after, afterEach, describe, it } from "node:test";
import { CodemodeError, RegistryClient, ToolProvider, status } from "../src/index";
import { freePort, quicklyReconnectingClient, startRegistry, stopService, type Service } from "./services";

const services: Service[] = [];
const clients: RegistryClient[] = [];
const providers: ToolProvider[] = [];

async function registry(port: number): Promise<Service> {
  const service = await startRegistry(port);
  services.push(service);
  return service;
}

function client(port: number): RegistryClient {
  const c = quicklyReconnectingClient(port);
  clients.push(c);
  return c;
}

function echoProvider(c: RegistryClient, name = "echoes"): ToolProvider {
  const provider = new ToolProvider(c, name).tool({ name: "echo", description: "Echo" }, (args) => args);
  providers.push(provider);
  return provider;
}

/** The promise's outcome as it is now, without waiting for it. */
function track(promise: Promise<void>): { settled: boolean; error: unknown; done: Promise<void> } {
  const state = { settled: false, error: undefined as unknown, done: promise };
  promise.then(
    () => (state.settled = true),
    (e: unknown) => ((state.settled = true), (state.error = e)),
  );
  return state;
}

async function eventually<T>(probe: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe().catch(() => undefined); // a registry restarting refuses calls meanwhile
    if (value !== undefined) return value;
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function echoIsVisible(c: RegistryClient): Promise<void> {
  await eventually(async () => ((await c.listVisibleTools("")).tools.some((t) => t.name === "echo") ? true : undefined));
}

async function echo(c: RegistryClient, value: number): Promise<unknown> {
  const result = await c.executeToolCall({ toolName: "echo", arguments: { n: value } }).result;
  assert.equal(result.isError, false, result.error?.message);
  return result.value;
}

afterEach(async () => {
  await Promise.all(providers.splice(0).map((p) => p.close()));
  await Promise.all(services.splice(0).map((s) => stopService(s)));
  for (const c of clients.splice(0)) c.close();
});

after(async () => {
  await Promise.all(services.map((s) => stopService(s)));
});

describe("ToolProvider.serve() against real registries", () => {
  it("registers the tools again on a registry restarted on the same port", async () => {
    const port = await freePort();
    const first = await registry(port);
    const c = client(port);
    const provider = echoProvider(c);
    const serving = track(provider.serve());
    await echoIsVisible(c);
    assert.deepEqual(await echo(c, 1), { n: 1 });
    await provider.register([{ definition: { name: "late", description: "Added on the stream" }, handler: () => "late" }]);

    const firstStream = provider.closed;
    await stopService(first); // graceful: the registry ends the provider stream with UNAVAILABLE
    const lost = await firstStream;
    assert.ok(lost instanceof CodemodeError, "the first stream ended with an error");
    assert.equal(lost.code, status.UNAVAILABLE);
    assert.equal(lost.reason, "REGISTRY_SHUTTING_DOWN");
    assert.equal(serving.settled, false, "serve() outlives the registry");

    await registry(port);
    await echoIsVisible(c);
    assert.deepEqual(await echo(c, 2), { n: 2 });
    const late = await c.executeToolCall({ toolName: "late" }).result;
    assert.equal(late.value, "late", "a tool added by register() is registered again too");
    assert.equal(serving.settled, false, "serve() is still running");

    await provider.close();
    assert.equal(serving.settled, true, "close() resolves after serve() did");
    assert.equal(serving.error, undefined);
    assert.equal(await provider.closed, undefined);
  });

  it("aborts handlers whose stream was lost and comes back after a registry was killed", async () => {
    const port = await freePort();
    const first = await registry(port);
    const c = client(port);
    let started!: () => void;
    const handlerStarted = new Promise<void>((r) => (started = r));
    let onAbort!: (reason: unknown) => void;
    const aborted = new Promise<unknown>((r) => (onAbort = r));
    const provider = echoProvider(c).tool({ name: "hang", description: "Waits until aborted" }, (_args, ctx) => {
      started();
      return new Promise((_resolve, reject) => {
        ctx.signal.addEventListener("abort", () => {
          onAbort(ctx.signal.reason);
          reject(ctx.signal.reason);
        });
      });
    });
    const serving = track(provider.serve());
    await assert.rejects(provider.serve(), /already serving/); // the first keeps running

    await echoIsVisible(c);
    const hanging = c.executeToolCall({ toolName: "hang" }).result;
    hanging.catch(() => undefined);
    await handlerStarted;
    first.proc.kill("SIGKILL"); // no graceful end: the connection just breaks
    const reason = await aborted;
    assert.ok(reason instanceof CodemodeError && reason.code === status.UNAVAILABLE, `aborted with ${String(reason)}`);
    await assert.rejects(hanging, (e: unknown) => e instanceof CodemodeError && e.code === status.UNAVAILABLE);

    await registry(port);
    await echoIsVisible(c);
    assert.deepEqual(await echo(c, 3), { n: 3 });
    assert.equal(serving.settled, false, "serve() is still running");
  });

  it("waits for a registry that is not up yet", async () => {
    const port = await freePort();
    const c = client(port);
    let attempts = 0;
    const connect = c.stub.connect.bind(c.stub);
    c.stub.connect = ((...args: Parameters<typeof connect>) => (attempts++, connect(...args))) as typeof c.stub.connect;
    const provider = echoProvider(c);
    const serving = track(provider.serve());
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(serving.settled, false, "serve() waits instead of failing");
    assert.equal(attempts, 1, "one stream waits for the registry (no retry loop)");

    await registry(port);
    await echoIsVisible(c);
    assert.deepEqual(await echo(c, 4), { n: 4 });
    await provider.close();
    assert.equal(serving.settled, true);
    assert.equal(serving.error, undefined);
  });

  it("rejects when the registry refuses the tools", async () => {
    const port = await freePort();
    await registry(port);
    const c = client(port);
    await echoProvider(c, "first").start(); // takes the name "echo"

    const provider = echoProvider(c, "second");
    await assert.rejects(
      provider.serve(),
      (e: unknown) => e instanceof CodemodeError && e.reason === "TOOL_ALREADY_REGISTERED",
    );
    // The refused stream was closed, and the provider can be closed again without hanging.
    assert.equal(await provider.closed, undefined);
    await provider.close();
  });
});
