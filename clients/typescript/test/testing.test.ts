/**
 * The testing kit users get (`@codemode/client/testing`) under node:test: `useCodemode()` starts
 * `codemode up` (here the repository's `python -m codemode_cli`), a scripted model runs a program
 * against a provider served from this process, and the trajectory assertions pass on what the
 * history recorded and fail with a message that draws the calls.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { ToolFailed } from "../src/index";
import { existsSync } from "node:fs";
import { answer, callTool, expectCall, runCode, startServices, useCodemode } from "../src/testing";
import { PYTHON } from "./services";

const codemode = useCodemode({ command: [PYTHON, "-m", "codemode_cli"] });

const PROGRAM = [
  "total = await tools.add({'a': 2, 'b': 3})",
  "try:",
  "    await tools.divide({'a': total, 'b': 0})",
  "except Exception as exc:",
  "    print('refused:', exc)",
  "return total",
].join("\n");

function serveMath(): Promise<void> {
  const tools = codemode.testbed
    .provider("math")
    .tool({ name: "add", description: "Add", concurrencySafe: true, inputSchema: { type: "object" } }, async ({ a, b }: { a: number; b: number }) => a + b)
    .tool({ name: "divide", description: "Divide", inputSchema: { type: "object" } }, async ({ a, b }: { a: number; b: number }) => {
      if (b === 0) throw new ToolFailed("division by zero", "DIVIDE_BY_ZERO");
      return a / b;
    });
  return tools.start();
}

test("a scripted model runs a program; its trajectory is asserted from the history", async () => {
  await serveMath();
  const agent = await codemode.testbed.agent();
  const conversation = await codemode.testbed.play(
    agent,
    callTool("add", { a: 1, b: 1 }), // under code the model may call only run_code
    runCode(PROGRAM, "add then divide"),
    (soFar) => answer(`the total is ${JSON.stringify((soFar.steps.at(-1)!.result.value as { result: number }).result)}`),
  );
  assert.deepEqual(conversation.offered, ["run_code"]);
  const [refused, ran] = conversation.steps;
  assert.equal(refused.result.error?.code, "UNKNOWN_TOOL");
  assert.deepEqual(ran.result.value, { logs: ["refused: division by zero"], result: 5 });
  assert.equal(conversation.answer, "the total is 5");

  const trajectory = await codemode.testbed.trajectory(agent, ran.callId);
  trajectory.assertRecorded();
  trajectory.assertNested(
    expectCall("add", { arguments: { a: 2, b: 3 }, result: 5, errorCode: "" }),
    expectCall("divide", { arguments: { a: 5, b: 0 }, errorCode: "DIVIDE_BY_ZERO", result: "Error: division by zero" }),
  );
  assert.throws(
    () => trajectory.assertNested(expectCall("add", { arguments: { a: 2, b: 4 } }), "greet"),
    (e: Error) =>
      e.message.includes(`call 1 (${ran.callId}:code:1): arguments {"a":2,"b":3}, expected {"a":2,"b":4}`) &&
      e.message.includes(`call 2 (${ran.callId}:code:2): tool divide, expected greet`) &&
      e.message.includes(`2. ${ran.callId}:code:2 divide {"a":5,"b":0} error DIVIDE_BY_ZERO: Error: division by zero`),
  );
});

test("the services run as codemode up's children and stop by pid, leaving no process", async () => {
  assert.match(codemode.services.address, /^127\.0\.0\.1:\d+$/);
  const own = await startServices({ command: [PYTHON, "-m", "codemode_cli"] });
  const pids = [own.pid, ...own.servicePids];
  assert.equal(own.servicePids.length, 2); // the registry and its runtime
  assert.ok(pids.every((pid) => existsSync(`/proc/${pid}`)));
  await own.stop();
  // `codemode up` reaps its services before it exits, and this process reaps `codemode up`.
  assert.deepEqual(pids.filter((pid) => existsSync(`/proc/${pid}`)), []);
});

test("a command that cannot start the services is a clear error", async () => {
  await assert.rejects(startServices({ command: ["node", "-e", "console.log('no services here')"] }), (e: Error) =>
    /exited \(0\) before it was ready:\n  no services here/.test(e.message),
  );
});
