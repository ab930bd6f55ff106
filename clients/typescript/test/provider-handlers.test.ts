/**
 * How a TS ToolProvider calls its handlers, against the REAL registry (a Python process): handlers
 * checked at `tool()`, zod arguments parsed before the handler (refusals are INVALID_ARGS naming
 * the field), unexpected throws hidden behind an error id and logged, explicit `ToolError`s shown
 * as written, no registry a clear error, and `serve()` saying when it loses and regains a registry.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { z } from "zod";
import {
  CodemodeError,
  RegistryClient,
  ToolError,
  ToolFailed,
  ToolProvider,
  status,
  type ProviderLogger,
  type ToolCallResult,
} from "../src/index";
import { freePort, quicklyReconnectingClient, startRegistry, stopService, type Service } from "./services";

const SECRET = "hunter2-db-password";

class Recording implements ProviderLogger {
  readonly errors: { message: string; error: unknown }[] = [];
  readonly warnings: string[] = [];
  error(message: string, error: unknown): void {
    this.errors.push({ message, error });
  }
  warn(message: string): void {
    this.warnings.push(message);
  }
}

const Trip = z.object({
  city: z.string(),
  stops: z.array(z.object({ name: z.string().refine((s) => s.trim() !== "", "must not be blank") })).default([]),
});

let registry: Service | undefined;
let client: RegistryClient;
let provider: ToolProvider;
const logged = new Recording();
const seen: unknown[] = [];

before(async () => {
  registry = await startRegistry(await freePort());
  client = new RegistryClient(`127.0.0.1:${registry.port}`, { timeoutMs: 10_000, executeTimeoutMs: 30_000 });
  provider = new ToolProvider(client, "handlers", { logger: logged })
    .tool({ name: "trip", description: "Plans a trip", inputSchema: Trip }, async (args) => {
      seen.push(args);
      return { stops: args.stops?.length ?? -1 };
    })
    .tool({ name: "connect", description: "Fails with a secret" }, async () => {
      throw new Error(`cannot connect to postgres://admin:${SECRET}@db`);
    })
    .tool({ name: "throws_string", description: "Throws a string" }, () => {
      throw SECRET; // eslint-disable-line no-throw-literal
    })
    .tool({ name: "quota", description: "Fails on purpose" }, () => {
      throw new ToolError("quota exceeded, try after 5pm", "QUOTA");
    })
    .tool({ name: "ping", description: "No arguments, no ctx" }, () => "pong");
  await provider.start();
  await client.createAgent("handlers", { mode: "native" });
});

after(async () => {
  await provider?.close();
  client?.close();
  await stopService(registry);
});

async function call(toolName: string, args: object): Promise<ToolCallResult> {
  return client.executeToolCall({ agent: "agents/handlers", toolName, arguments: args as never }).result;
}

describe("tool() checks the handler", () => {
  const cases: [string, unknown, string][] = [
    ["not a function", "nope", "tool 'bad': the handler is not a function"],
    ["a generator", async function* gen() {}, "tool 'bad': the handler is a generator; a tool returns one value"],
    ["three parameters", (a: unknown, b: unknown, c: unknown) => [a, b, c], "tool 'bad': the handler declares 3 parameters"],
  ];
  for (const [what, handler, message] of cases) {
    it(`refuses ${what} with a TypeError naming the tool`, () => {
      const declaring = new ToolProvider(undefined, "p");
      assert.throws(
        () => declaring.tool({ name: "bad" }, handler as never),
        (e: unknown) => e instanceof TypeError && e.message.startsWith(message),
      );
    });
  }
  it("refuses a definition without a name", () => {
    assert.throws(() => new ToolProvider(undefined, "p").tool({ name: "" }, () => 1), TypeError);
  });
  it("keeps ToolFailed as the same class", () => {
    assert.equal(ToolFailed, ToolError);
  });
});

describe("handlers against the real registry", () => {
  it("get zod-parsed arguments; what only zod knows is INVALID_ARGS naming the field", async () => {
    const ok = await call("trip", { city: "Oslo" });
    assert.equal(ok.isError, false, ok.error?.message);
    assert.deepEqual(ok.value, { stops: 0 }); // the default was filled in by zod
    assert.deepEqual(seen.pop(), { city: "Oslo", stops: [] });

    const bad = await call("trip", { city: "Oslo", stops: [{ name: "a" }, { name: "  " }] });
    assert.equal(bad.error?.code, "INVALID_ARGS");
    assert.equal(bad.error?.message, 'invalid arguments: "stops[1].name": must not be blank');
    assert.equal(seen.length, 0, "the handler did not run");
  });

  it("hide an unexpected error behind an error id, log it, and keep it out of history", async () => {
    const ids: string[] = [];
    for (const tool of ["connect", "throws_string"]) {
      const failed = await call(tool, {});
      assert.equal(failed.isError, true);
      const message = failed.error?.message ?? "";
      const match = new RegExp(`^tool '${tool}' failed unexpectedly \\(error id ([0-9a-f]{12})\\); the provider logged the details$`).exec(message);
      assert.ok(match, message);
      assert.equal(failed.error?.code, "TOOL_FAILED");
      assert.ok(!JSON.stringify(failed.content).includes(SECRET));
      ids.push(match[1]);
    }
    assert.notEqual(ids[0], ids[1]);
    assert.deepEqual(
      logged.errors.map((e) => ids.some((id) => e.message.includes(id))),
      [true, true],
    );
    assert.ok(String((logged.errors[0].error as Error).message).includes(SECRET), "the log keeps the details");
    const { records } = await client.listHistory("agents/handlers");
    assert.ok(records.length > 0);
    assert.ok(!JSON.stringify(records, (_k, v: unknown) => (typeof v === "bigint" ? String(v) : v)).includes(SECRET));
  });

  it("show an explicit ToolError as written, with its code", async () => {
    const refused = await call("quota", {});
    assert.deepEqual([refused.error?.code, refused.error?.message], ["QUOTA", "quota exceeded, try after 5pm"]);
    assert.equal((await call("ping", {})).value, "pong");
  });
});

describe("no registry", () => {
  it("start() rejects with a CodemodeError naming the address", async () => {
    const port = await freePort();
    const lonely = new RegistryClient(`127.0.0.1:${port}`, { timeoutMs: 10_000 });
    try {
      const p = new ToolProvider(lonely, "lonely").tool({ name: "ping" }, () => "pong");
      await assert.rejects(p.start(), (e: unknown) => {
        assert.ok(e instanceof CodemodeError);
        assert.equal(e.code, status.UNAVAILABLE);
        assert.ok(e.message.startsWith(`tool provider 'lonely': no registry reachable at 127.0.0.1:${port} (`), e.message);
        assert.ok(e.message.endsWith("; serve() waits for one"), e.message);
        return true;
      });
    } finally {
      lonely.close();
    }
  });

  it("serve() logs a lost registry and its return", async () => {
    const port = await freePort();
    let first: Service | undefined = await startRegistry(port);
    let second: Service | undefined;
    const c = quicklyReconnectingClient(port);
    const log = new Recording();
    const p = new ToolProvider(c, "restarts", { logger: log }).tool({ name: "ping" }, () => "pong");
    const serving = p.serve();
    try {
      await until(async () => (await c.listVisibleTools("")).tools.some((t) => t.name === "ping"));
      await stopService(first);
      first = undefined;
      await until(async () => log.warnings.length > 0);
      assert.match(log.warnings[0], /^tool provider 'restarts': the stream to the registry ended \(UNAVAILABLE: .*\); reconnecting$/);
      second = await startRegistry(port);
      await until(async () => log.warnings.length > 1);
      assert.equal(log.warnings[1], "tool provider 'restarts': reconnected, tools registered again");
    } finally {
      await p.close();
      await serving;
      c.close();
      await stopService(first);
      await stopService(second);
    }
    assert.equal(log.warnings.length, 2, "close() is not logged as a loss");
  });
});

async function until(probe: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await probe().catch(() => false))) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 50));
  }
}
