// A model runs with an agent's tools: the model SDK adapters of the TypeScript client. It
// compiles as a plain `.ts` file of an ordinary CommonJS npm project:
//
//   npm init -y && npm install typescript @types/node openai@7.55.0 @anthropic-ai/sdk@1.10.0 \
//     /path/to/codemode-client-0.1.0.tgz
//   npx tsc --strict --module node16 --target es2022 --types node model_agent.ts
//   node model_agent.js 127.0.0.1:50051 [SCRIPTED_MODEL_URL]
//
// With OPENAI_API_KEY set it asks OpenAI (Responses API, CODEMODE_EXAMPLE_MODEL, default
// gpt-5-mini), with ANTHROPIC_API_KEY Anthropic (Messages API, default claude-sonnet-4-5),
// and otherwise the scripted model at SCRIPTED_MODEL_URL, started with
// `python -m codemode_cli.scripted_model --script examples/models/scripted.json`, through the
// same `openai` client. Safe to run again: the agent is created once and reused.
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import {
  AgentTools,
  CodemodeError,
  RegistryClient,
  ToolProvider,
  anthropicMessages,
  openaiResponses,
  type LoopResult,
} from "@codemode/client";

const TASK = "What is 20 + 22? Use the add_numbers_ts tool from a program.";

async function askModel(tools: AgentTools, scriptedUrl: string | undefined): Promise<[string, LoopResult<unknown, unknown>]> {
  const name = process.env.CODEMODE_EXAMPLE_MODEL;
  if (process.env.OPENAI_API_KEY) {
    const model = name ?? "gpt-5-mini";
    return [model, (await openaiResponses.run(new OpenAI(), tools, { model, input: TASK })) as LoopResult<unknown, unknown>];
  }
  if (process.env.ANTHROPIC_API_KEY) {
    const model = name ?? "claude-sonnet-4-5";
    const result = await anthropicMessages.run(new Anthropic(), tools, { model, messages: TASK });
    return [model, result as LoopResult<unknown, unknown>];
  }
  if (scriptedUrl === undefined) throw new Error("no OPENAI_API_KEY or ANTHROPIC_API_KEY: pass the scripted model's URL");
  const openai = new OpenAI({ baseURL: `${scriptedUrl}/v1`, apiKey: "scripted", maxRetries: 0 });
  const result = await openaiResponses.run(openai, tools, { model: "example-ts", input: TASK });
  return ["scripted", result as LoopResult<unknown, unknown>];
}

async function main(address: string, scriptedUrl: string | undefined): Promise<void> {
  const client = new RegistryClient(address, { timeoutMs: 10_000, executeTimeoutMs: 120_000 });
  const provider = new ToolProvider(client, "example-numbers-ts").tool(
    {
      name: "add_numbers_ts",
      description: "Add two integers",
      concurrencySafe: true,
      inputSchema: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"] },
    },
    async ({ a, b }: { a: number; b: number }) => a + b,
  );
  await provider.start();
  try {
    try {
      await client.createAgent("model-example-ts", { mode: "code", codeLanguage: "typescript" });
    } catch (e) {
      if (!(e instanceof CodemodeError && e.codeName === "ALREADY_EXISTS")) throw e; // a second run
    }
    const agent = "agents/model-example-ts";
    const tools = await AgentTools.load(client, agent); // wire schemas + system prompt
    const [model, result] = await askModel(tools, scriptedUrl);
    console.log(`model: ${model} · tools: ${tools.schemas.map((s) => s.name).join(", ")}`);
    for (const reply of result.replies) console.log(`tool call ${reply.call.name}: ${reply.isError ? `error ${reply.code}` : "ok"}`);
    console.log(`answer: ${result.text}`);
    const history = (await client.listHistory(agent, { pageSize: 500 })).records;
    const runs = history.filter((r) => r.kind === "tool/result" && r.toolName === "run_code").length;
    console.log(`history: ${runs} run_code calls so far`);
  } finally {
    await provider.close();
    client.close();
  }
}

main(process.argv[2] ?? "127.0.0.1:50051", process.argv[3]).catch((e: unknown) => {
  console.error(e);
  process.exitCode = 1;
});
