/**
 * A TS ToolProvider declares tools with zod 4 schemas: converted to JSON Schema, registered, and
 * validated by the REAL registry (a Python process on 127.0.0.1:0) like hand-written JSON Schema.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { resolve } from "node:path";
import { after, before, describe, it } from "node:test";
import { z } from "zod";
import { RegistryClient, ToolProvider, parseJson, type ToolCallResult } from "../src/index";
import { startService, stopService, type Service } from "./services";

const Repeat = z.object({
  word: z.string().min(1).describe("The word to repeat"),
  times: z.number().int().min(1).max(5).default(2),
});
const Repeated = z.object({ text: z.string(), length: z.number().int() });

let registry: Service | undefined;
let client: RegistryClient;
let provider: ToolProvider;

before(async () => {
  registry = await startService("registry_service", "registry listening on port ", {
    CODEMODE_REGISTRY_HISTORY_PATH: ":memory:",
  });
  client = new RegistryClient(`127.0.0.1:${registry.port}`, { timeoutMs: 10_000, executeTimeoutMs: 30_000 });
  provider = new ToolProvider(client, "zod-tools")
    .tool(
      { name: "repeat", description: "Repeats a word", inputSchema: Repeat, outputSchema: Repeated },
      // Typed from the schema: `args.word` is a string, `args.times` a number or undefined.
      async (args) => {
        const text = args.word.repeat(args.times ?? 2);
        return { text, length: text.length };
      },
    )
    .tool({ name: "liar", description: "Breaks its output schema", outputSchema: Repeated }, async () => ({ text: 1 }));
  await provider.start();
  await client.createAgent("zod", { mode: "native" });
});

after(async () => {
  await provider?.close();
  client?.close();
  await stopService(registry);
});

async function call(toolName: string, args: object): Promise<ToolCallResult> {
  return client.executeToolCall({ agent: "agents/zod", toolName, arguments: args as never }).result;
}

describe("zod schemas", () => {
  it("register as the JSON Schema zod derives (input side for input, output side for output)", async () => {
    const { tools } = await client.listVisibleTools("agents/zod");
    const repeat = tools.find((t) => t.name === "repeat");
    assert.ok(repeat !== undefined);
    assert.deepEqual(parseJson(repeat.inputSchemaJson), z.toJSONSchema(Repeat, { io: "input" }));
    assert.deepEqual(parseJson(repeat.outputSchemaJson), z.toJSONSchema(Repeated, { io: "output" }));
    assert.deepEqual((parseJson(repeat.inputSchemaJson) as { required: string[] }).required, ["word"]);
  });

  it("are enforced by the registry: arguments and outputs", async () => {
    const ok = await call("repeat", { word: "ab", times: 3 });
    assert.equal(ok.isError, false, ok.error?.message);
    assert.deepEqual(ok.value, { text: "ababab", length: 6 });
    const defaulted = await call("repeat", { word: "ab" });
    assert.deepEqual(defaulted.value, { text: "abab", length: 4 });
    for (const bad of [{ word: "" }, { word: "ab", times: 9 }, { word: "ab", times: 1.5 }, { times: 1 }]) {
      const refused = await call("repeat", bad);
      assert.equal(refused.error?.code, "INVALID_ARGS", JSON.stringify(bad));
    }
    const liar = await call("liar", {});
    assert.equal(liar.error?.code, "INVALID_TOOL_OUTPUT");
  });

  it("that JSON Schema cannot express, or from zod 3, are refused at declaration", () => {
    const p = new ToolProvider(client, "refused");
    assert.throws(() => p.tool({ name: "when", inputSchema: z.object({ at: z.date() }) }, async () => null), {
      name: "TypeError",
      message: /tool "when" inputSchema: the zod schema cannot be expressed as JSON Schema/,
    });
    const zod3Like = { _def: { typeName: "ZodString" }, safeParse: () => ({ success: true }) };
    assert.throws(() => p.tool({ name: "old", inputSchema: zod3Like as never }, async () => null), /zod 3 schema/);
  });

  it("are recognized without loading zod: a provider with JSON Schema never loads it", () => {
    const index = resolve(__dirname, "..", "src", "index.js");
    const script = `
      const { ToolProvider } = require(${JSON.stringify(index)});
      new ToolProvider({}, "json").tool({ name: "t", inputSchema: { type: "object" } }, async () => null);
      const loaded = Object.keys(require.cache).some((k) => k.includes("/node_modules/zod/"));
      process.stdout.write(String(loaded));`;
    assert.equal(execFileSync(process.execPath, ["-e", script]).toString(), "false");
  });
});
