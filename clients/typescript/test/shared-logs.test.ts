/**
 * A run_code result's logs travel once on the wire (`sharedLogs`) and the client restores the
 * result whole: against the REAL services, a registry with a small `max_message_bytes`.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { RegistryClient, stringifyJson, type ToolResult } from "../src/index";
import { wholeResult } from "../src/shared-logs";
import { PYTHON, REPO_ROOT, startService, stopService, type Service } from "./services";

const MESSAGE_BYTES = 64 * 1024;
// ~60% of the limit: fits once, not twice.
const COUNT = Math.floor((MESSAGE_BYTES * 0.6) / 90);
const LINES = Array.from({ length: COUNT }, (_, i) => `line ${String(i).padStart(4, "0")} ${"é".repeat(40)}`);
const PROGRAM = `for i in range(${COUNT}):\n    print('line %04d ' % i + 'é' * 40)\nreturn 'done'`;
// ~60% of the limit as valueJson, ~1.8 times that as its pretty text: whole, over the limit.
// Floats like 1.0 and 1e+16, which a JavaScript number cannot spell as Python does, included.
const BIG_OBJECT =
  "{'k%05d' % i: {'f': i + 0.5, 'one': 1.0, 'e': 1e16, 'big': 2**70 + i, 's': 'é😀' * 3, " +
  `'deep': [[[[[[i, 1.0]]]]]], 'empty': {}} for i in range(${Math.floor((MESSAGE_BYTES * 0.6) / 130)})}`;

/** The whole result the registry would send for `{logs, result: <expression>}`, written by the
 * registry's own code (`dumps`, `render_output`): what the client must restore byte for byte. */
function wholeForm(logs: string[], expression: string): { valueJson: string; text: string } {
  const script = [
    "import json, sys",
    "from codemode_wire import jsonvalue",
    "from registry_service.codemode.bridge import render_output",
    "value = {'logs': json.loads(sys.argv[1]), 'result': eval(sys.argv[2])}",
    "print(json.dumps({'valueJson': jsonvalue.dumps(value), 'text': render_output(value)}))",
  ].join("\n");
  const out = execFileSync(PYTHON, ["-c", script, JSON.stringify(logs), expression], { cwd: REPO_ROOT, encoding: "utf8" });
  return JSON.parse(out) as { valueJson: string; text: string };
}

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

  it("a string result over half the limit travels once and arrives", async () => {
    const size = Math.floor(MESSAGE_BYTES * 0.6);
    const code = `print('a')\nreturn 'r' * ${size}`;
    const result = await client.runCode("agents/coder", code, "a big string").result;
    assert.equal(result.isError, false, result.error?.message);
    assert.deepEqual(result.value, { logs: ["a"], result: "r".repeat(size) });
    assert.equal(result.text, `a\n${"r".repeat(size)}`);
  });

  it("an object result over half the limit travels once and is restored byte for byte", async () => {
    const whole = wholeForm(["a"], BIG_OBJECT);
    assert.ok(Buffer.byteLength(whole.valueJson) > 0.55 * MESSAGE_BYTES);
    assert.ok(Buffer.byteLength(whole.valueJson) + Buffer.byteLength(whole.text) > MESSAGE_BYTES);
    const result = await client.runCode("agents/coder", `print('a')\nreturn ${BIG_OBJECT}`, "a big object").result;
    assert.equal(result.isError, false, result.error?.message);
    assert.equal(result.valueJson, whole.valueJson);
    assert.equal(result.text, whole.text);
    assert.equal(result.content.length, 1);
  });

  it("small results of every kind are restored as the registry shows them", async () => {
    const expressions = [
      "[1, 'x', None, True, 0.1, 1e-05, -2**64]",
      "{'a': [[[[[[1, {'b': 1.0}]]]]]], 'e': [], 'o': {}, 'k\\n\"': '\\u2028'}",
      "None",
      "1.0",
      "[]",
    ];
    for (const [i, expression] of expressions.entries()) {
      const whole = wholeForm(i % 2 ? ["log"] : [], expression);
      const logs = i % 2 ? "print('log')\n" : "";
      const result = await client.runCode("agents/coder", `${logs}return ${expression}`, "kinds").result;
      assert.equal(result.isError, false, result.error?.message);
      assert.equal(result.valueJson, whole.valueJson, expression);
      assert.equal(result.text, whole.text, expression);
    }
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
