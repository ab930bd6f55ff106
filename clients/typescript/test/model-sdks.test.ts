/**
 * The model SDK adapters with the vendors' real SDK clients (`openai`, `@anthropic-ai/sdk`)
 * pointed at the scripted model (codemode_cli/scripted_model.py, a child process) on loopback,
 * and the AI SDK tools driven by the AI SDK's own mock model, against a real runtime, registry
 * and TypeScript tool provider: calls reach the history, results reach the model, `run_code`
 * works through each adapter, and bad model output is a tool error the model reads.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import {
  AgentTools,
  RegistryClient,
  ToolProvider,
  anthropicMessages,
  openaiChat,
  openaiResponses,
  type LoopResult,
  type JsonObject,
} from "../src/index";
import { aiSdkTools } from "../src/model-sdks/ai-sdk";
import { startScriptedModel, startService, stopService, type Service } from "./services";

const PROGRAM = "r = await tools.add({'a': 2, 'b': 3})\nprint('added')\nreturn r";
const SCRIPT = {
  "run-code": [
    { call: { name: "run_code", arguments: { code: PROGRAM, description: "Add" } } },
    { say: "The program said: {result}" },
  ],
  "bad-output": [
    {
      call: [
        { name: "delete_everything", arguments: { path: "/" } },
        { name: "run_code", arguments_text: '{"code": "return 1", ' },
        { name: "run_code", arguments: [1, 2] },
      ],
    },
    { say: "I read: {result}" },
  ],
  "loops-forever": [
    { call: { name: "run_code", arguments: { code: "return 1", description: "one" } } },
    { call: { name: "run_code", arguments: { code: "return 2", description: "two" } } },
    { say: "never reached" },
  ],
};
type Api = "responses" | "chat" | "messages";
const APIS: Api[] = ["responses", "chat", "messages"];

let runtime: Service | undefined;
let registry: Service | undefined;
let model: Service | undefined;
let client: RegistryClient;
let provider: ToolProvider;
let tmp: string;
let modelUrl: string;

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), "codemode-ts-models-"));
  const script = join(tmp, "script.json");
  writeFileSync(script, JSON.stringify(SCRIPT));
  runtime = await startService("runtime_service", "runtime listening on port ", { CODEMODE_RUNTIME_POOL_SIZE: "1" });
  registry = await startService("registry_service", "registry listening on port ", {
    CODEMODE_REGISTRY_RUNTIME_TARGETS: JSON.stringify([`127.0.0.1:${runtime.port}`]),
    CODEMODE_REGISTRY_HISTORY_PATH: ":memory:",
  });
  model = await startScriptedModel(script);
  modelUrl = `http://127.0.0.1:${model.port}`;
  client = new RegistryClient(`127.0.0.1:${registry.port}`, { timeoutMs: 10_000, executeTimeoutMs: 30_000 });
  provider = new ToolProvider(client, "ts-math").tool(
    {
      name: "add",
      description: "Adds two integers",
      concurrencySafe: true,
      inputSchema: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"] },
    },
    async (args) => Number((args as JsonObject).a) + Number((args as JsonObject).b),
  );
  await provider.start();
});

after(async () => {
  await provider?.close();
  client?.close();
  await stopService(model);
  await stopService(registry);
  await stopService(runtime);
  rmSync(tmp, { recursive: true, force: true });
});

let agents = 0;
async function codeAgent(): Promise<string> {
  return (await client.createAgent(`ts-model-${++agents}`, { mode: "code" })).name;
}

async function recorded(): Promise<{ api: string; body: Record<string, unknown> }[]> {
  const response = await fetch(`${modelUrl}/requests`);
  return (await response.json()) as { api: string; body: Record<string, unknown> }[];
}

function run(api: Api, tools: AgentTools, name: string, maxTurns = 5): Promise<LoopResult<unknown, unknown>> {
  const prompt = "Add 2 and 3 with a program.";
  if (api === "responses") {
    const openai = new OpenAI({ baseURL: `${modelUrl}/v1`, apiKey: "scripted", maxRetries: 0 });
    return openaiResponses.run(openai, tools, { model: name, input: prompt, maxTurns }) as Promise<LoopResult<unknown, unknown>>;
  }
  if (api === "chat") {
    const openai = new OpenAI({ baseURL: `${modelUrl}/v1`, apiKey: "scripted", maxRetries: 0 });
    return openaiChat.run(openai, tools, { model: name, messages: prompt, maxTurns }) as Promise<LoopResult<unknown, unknown>>;
  }
  const anthropic = new Anthropic({ baseURL: modelUrl, apiKey: "scripted", maxRetries: 0 });
  return anthropicMessages.run(anthropic, tools, { model: name, messages: prompt, maxTurns }) as Promise<LoopResult<unknown, unknown>>;
}

/** The tool-result texts the last request of `api` carried to the model. */
function resultsSent(api: Api, body: Record<string, unknown>): { callId: string; text: string; isError?: boolean }[] {
  if (api === "responses") {
    return (body.input as Record<string, unknown>[])
      .filter((i) => i.type === "function_call_output")
      .map((i) => ({ callId: String(i.call_id), text: String(i.output) }));
  }
  if (api === "chat") {
    return (body.messages as Record<string, unknown>[])
      .filter((m) => m.role === "tool")
      .map((m) => ({ callId: String(m.tool_call_id), text: String(m.content) }));
  }
  return (body.messages as { role: string; content: unknown }[])
    .filter((m) => m.role === "user" && Array.isArray(m.content))
    .flatMap((m) => m.content as Record<string, unknown>[])
    .filter((b) => b.type === "tool_result")
    .map((b) => ({
      callId: String(b.tool_use_id),
      text: (b.content as { text: string }[]).map((c) => c.text).join(""),
      isError: b.is_error as boolean,
    }));
}

describe("model SDK adapters with the vendors' SDK clients and the scripted model", () => {
  for (const api of APIS) {
    it(`${api}: run_code reaches the registry and its result reaches the model`, async () => {
      const agent = await codeAgent();
      const tools = await AgentTools.load(client, agent);
      assert.deepEqual(
        tools.schemas.map((s) => s.name),
        ["run_code"],
      );
      const before = (await recorded()).length;
      const result = await run(api, tools, "run-code");
      assert.equal(result.stop, "answered");
      assert.equal(result.turns, 2);
      const [reply] = result.replies;
      assert.equal(reply.isError, false);
      assert.equal(reply.text, "added\n5");
      assert.equal(result.text, "The program said: added\n5");
      const requests = (await recorded()).slice(before);
      assert.equal(requests.length, 2);
      const sent = resultsSent(api, requests[1].body);
      assert.deepEqual(
        sent.map((s) => [s.callId, s.text]),
        [[reply.call.callId, "added\n5"]],
      );
      const history = (await client.listHistory(agent)).records;
      assert.ok(history.some((r) => r.kind === "tool/call" && r.toolName === "run_code" && r.callId === reply.call.callId));
      assert.deepEqual(
        history.filter((r) => r.kind === "tool/code-dispatch").map((r) => r.toolName),
        ["add"],
      );
    });

    it(`${api}: an unknown tool and malformed arguments are tool errors the model reads`, async () => {
      const agent = await codeAgent();
      const tools = await AgentTools.load(client, agent);
      const before = (await recorded()).length;
      const result = await run(api, tools, "bad-output");
      assert.equal(result.stop, "answered");
      const [unknown, malformed, notObject] = result.replies;
      assert.deepEqual([unknown.isError, unknown.code], [true, "UNKNOWN_TOOL"]);
      assert.ok(unknown.text.startsWith("Error [UNKNOWN_TOOL]: "), unknown.text);
      assert.deepEqual([malformed.isError, malformed.code], [true, "INVALID_JSON"]);
      assert.ok(malformed.text.startsWith("Error [INVALID_JSON]: "), malformed.text);
      assert.deepEqual([notObject.isError, notObject.code], [true, "INVALID_ARGS"]); // the registry's validation
      const sent = resultsSent(api, (await recorded()).slice(before)[1].body);
      assert.deepEqual(
        sent.map((s) => s.text),
        [unknown.text, malformed.text, notObject.text],
      );
      if (api === "messages") assert.deepEqual(sent.map((s) => s.isError), [true, true, true]);
      assert.equal(result.text, `I read: ${notObject.text}`);
    });

    it(`${api}: the loop is bounded`, async () => {
      const tools = await AgentTools.load(client, await codeAgent());
      const result = await run(api, tools, "loops-forever", 2);
      assert.deepEqual([result.stop, result.turns, result.replies.length], ["maxTurns", 2, 2]);
    });
  }
});

describe("AI SDK tools", () => {
  it("generateText calls run_code through the registry; bad calls are tool errors to the model", async () => {
    const { generateText, stepCountIs } = await import("ai");
    const { MockLanguageModelV4 } = await import("ai/test");
    const agent = await codeAgent();
    const tools = await AgentTools.load(client, agent);
    const usage = {
      inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
      outputTokens: { total: 1, text: 1, reasoning: 0 },
    };
    const prompts: unknown[] = [];
    let step = 0;
    const mock = new MockLanguageModelV4({
      doGenerate: async (options) => {
        prompts.push(options.prompt);
        step += 1;
        if (step === 1) {
          return {
            content: [
              { type: "tool-call", toolCallId: "ai-1", toolName: "run_code", input: JSON.stringify({ code: PROGRAM, description: "Add" }) },
              { type: "tool-call", toolCallId: "ai-2", toolName: "run_code", input: JSON.stringify({ code: "raise ValueError('boom')", description: "x" }) },
              { type: "tool-call", toolCallId: "ai-3", toolName: "run_code", input: '{"code": ' },
              { type: "tool-call", toolCallId: "ai-4", toolName: "delete_everything", input: "{}" },
            ],
            finishReason: { unified: "tool-calls", raw: "tool_calls" },
            usage,
            warnings: [],
          };
        }
        return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
      },
    });
    const result = await generateText({ model: mock, tools: await aiSdkTools(tools), prompt: "add", stopWhen: stepCountIs(4) });
    assert.equal(result.text, "done");
    const outputs = result.steps[0].content
      .filter((p) => p.type === "tool-result" || p.type === "tool-error")
      .sort((a, b) => a.toolCallId.localeCompare(b.toolCallId)); // the SDK reports invalid calls first
    // The malformed and the unknown call are the AI SDK's own tool errors: no crash, no call.
    assert.deepEqual(
      outputs.map((p) => [p.type, p.toolCallId]),
      [
        ["tool-result", "ai-1"],
        ["tool-error", "ai-2"],
        ["tool-error", "ai-3"],
        ["tool-error", "ai-4"],
      ],
    );
    assert.equal((outputs[0] as { output: unknown }).output, "added\n5");
    assert.match(String((outputs[1] as { error: unknown }).error), /Error \[CODE_RUN_FAILED\]: .*boom/s);
    // The second model request carried both results.
    assert.match(JSON.stringify(prompts[1]), /added\\n5/);
    assert.match(JSON.stringify(prompts[1]), /CODE_RUN_FAILED/);
    const history = (await client.listHistory(agent)).records;
    assert.deepEqual(
      history.filter((r) => r.kind === "tool/call").map((r) => r.callId),
      ["ai-1", "ai-2"],
    );
  });
});
