/**
 * A run_code result's logs travel once on the wire (`sharedLogs`) and the client restores the
 * result whole: against the REAL services, a registry with a small `max_message_bytes`.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { RegistryClient, stringifyJson, type ToolResult } from "../src/index";
import { wholeResult } from "../src/shared-logs";
import { startService, stopService, type Service } from "./services";

const MESSAGE_BYTES = 64 * 1024;
// ~60% of the limit: fits once, not twice.
const COUNT = Math.floor((MESSAGE_BYTES * 0.6) / 90);
const LINES = Array.from({ length: COUNT }, (_, i) => `line ${String(i).padStart(4, "0")} ${"é".repeat(40)}`);
const PROGRAM = `for i in range(${COUNT}):\n    print('line %04d ' % i + 'é' * 40)\nreturn 'done'`;

let runtime: Service | undefined;
let registry: Service | undefined;
let client: RegistryClient;

before(async () => {
  runtime = await startService("runtime_service", "runtime listening on port ", { CODEMODE_RUNTIME_POOL_SIZE: "1" });
  registry = await startService("registry_service", "registry listening on port ", {
    CODEMODE_REGISTRY_RUNTIME_TARGETS: JSON.stringify([`127.0.0.1:${runtime.port}`]),
    CODEMODE_REGISTRY_HISTORY_PATH: ":memory:",
    CODEMODE_REGISTRY_MAX_MESSAGE_BYTES: String(MESSAGE_BYTES),
  });
  client = new RegistryClient(`127.0.0.1:${registry.port}`, { timeoutMs: 10_000, executeTimeoutMs: 30_000 });
  await client.createAgent("coder", { mode: "code" });
});

after(async () => {
  client?.close();
  await stopService(registry);
  await stopService(runtime);
});

describe("shared logs", () => {
  it("output over half the message limit arrives, with the value and text of the whole form", async () => {
    assert.ok(Buffer.byteLength(stringifyJson(LINES)) > 0.55 * MESSAGE_BYTES);
    const result = await client.runCode("agents/coder", PROGRAM, "print a lot").result;
    assert.equal(result.isError, false, result.error?.message);
    assert.deepEqual(result.value, { logs: LINES, result: "done" });
    assert.equal(result.valueJson, stringifyJson({ logs: LINES, result: "done" }));
    assert.equal(result.text, `${LINES.join("\n")}\ndone`);
    assert.equal(result.content.length, 1);
  });

  it("a string result over half the limit travels once and arrives; another value does not", async () => {
    const size = Math.floor(MESSAGE_BYTES * 0.6);
    const code = `print('a')\nreturn 'r' * ${size}`;
    const result = await client.runCode("agents/coder", code, "a big string").result;
    assert.equal(result.isError, false, result.error?.message);
    assert.deepEqual(result.value, { logs: ["a"], result: "r".repeat(size) });
    assert.equal(result.text, `a\n${"r".repeat(size)}`);
    const other = await client.runCode("agents/coder", `return ['r' * ${size}]`, "a big list").result;
    assert.equal(other.error?.code, "RESULT_TOO_LARGE");
  });

  it("a failure's captured output travels once and is restored", async () => {
    const code = "print('a')\nprint('b')\nraise ValueError('boom')";
    const result = await client.runCode("agents/coder", code, "fails").result;
    assert.equal(result.error?.code, "CODE_RUN_FAILED");
    assert.ok(result.error?.message.startsWith("code run failed (exception): "), result.error?.message);
    assert.ok(result.error?.message.endsWith("\nCaptured output:\na\nb"), result.error?.message);
    assert.equal(result.text, `Error: ${result.error?.message}`);
  });

  it("restores logs only, and refuses shared logs with nothing to restore them into", () => {
    const shared: ToolResult = {
      content: [{ block: { $case: "text", value: { text: "" } } }],
      valueJson: "{}",
      isError: false,
      error: undefined,
      additionalContexts: [],
      concludesTurn: false,
      sharedLogs: ["a", 'b"'],
      sharedResult: false,
    };
    const whole = wholeResult(shared);
    assert.equal(whole.valueJson, '{"logs":["a","b\\""]}');
    assert.deepEqual(whole.content, [{ block: { $case: "text", value: { text: 'a\nb"' } } }]);
    assert.deepEqual(whole.sharedLogs, []);
    assert.throws(() => wholeResult({ ...shared, valueJson: undefined }), /no object valueJson/);
    assert.throws(() => wholeResult({ ...shared, content: [] }), /no text block/);
  });
});
