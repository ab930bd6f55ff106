/**
 * The OpenAI Responses API: an agent's tools as function tools, and a loop over
 * `responses.create` (pass the `OpenAI` client you built; this module imports no SDK).
 *
 *     const tools = await AgentTools.load(client, "agents/coder");
 *     const result = await openaiResponses.run(new OpenAI(), tools, { model: "gpt-5", input: "Count the TODOs" });
 *
 * The full conversation is sent on every request.
 */
import { runLoop, type LoopResult } from "./loop";
import { blockText, contextTexts, type AgentTools, type ModelCall, type ToolReply, type WireSchema } from "./tools";

type Item = Record<string, unknown>;

/** What `run` needs of an `OpenAI` client (`any`: the SDK overloads `create` per request shape). */
export interface ResponsesClient {
  responses: { create(body: any): PromiseLike<unknown> };
}

/** `tools` for `responses.create`: one function tool per wire schema. */
export function toolDefinitions(schemas: readonly WireSchema[]): Item[] {
  // strict: false — the registry validates; strict mode would rewrite the schema.
  return schemas.map((s) => ({
    type: "function",
    name: s.name,
    description: s.description,
    parameters: s.parameters,
    strict: false,
  }));
}

function outputOf(response: unknown): Item[] {
  const output = (response as { output?: unknown } | null)?.output;
  return Array.isArray(output) ? (output as Item[]) : [];
}

/** The function calls of a response, in order. */
export function callsOf(response: unknown): ModelCall[] {
  return outputOf(response)
    .filter((item) => item.type === "function_call")
    .map((item) => ({
      callId: String(item.call_id ?? ""),
      name: String(item.name ?? ""),
      arguments: item.arguments as ModelCall["arguments"],
    }));
}

function output(reply: ToolReply): string | Item[] {
  if (!reply.content.some((b) => b.block?.$case === "image")) return reply.text;
  return reply.content.map((b) =>
    b.block?.$case === "image"
      ? { type: "input_image", image_url: `data:${b.block.value.mimeType};base64,${b.block.value.data.toString("base64")}` }
      : { type: "input_text", text: blockText(b) },
  );
}

/** `function_call_output` items for the replies, then a user message per additional context. */
export function inputItems(replies: readonly ToolReply[]): Item[] {
  const items: Item[] = replies.map((r) => ({ type: "function_call_output", call_id: r.call.callId, output: output(r) }));
  for (const text of contextTexts(replies)) items.push({ role: "user", content: [{ type: "input_text", text }] });
  return items;
}

export interface ResponsesRunOptions {
  model: string;
  input: string | Item[];
  /** Model requests at most (default 10). */
  maxTurns?: number;
  /** Default: the agent's system prompt. */
  instructions?: string;
  /** Passed to every request. */
  options?: Record<string, unknown>;
}

/** Runs `openai.responses.create` with the agent's tools until the model answers. */
export function run(openai: ResponsesClient, tools: AgentTools, opts: ResponsesRunOptions): Promise<LoopResult<Item, unknown>> {
  const instructions = opts.instructions ?? (tools.instructions || undefined);
  const base = { model: opts.model, tools: toolDefinitions(tools.schemas), ...(instructions ? { instructions } : {}), ...opts.options };
  const conversation: Item[] = typeof opts.input === "string" ? [{ role: "user", content: opts.input }] : [...opts.input];
  return runLoop<Item, unknown>(
    {
      create: async (input) => openai.responses.create({ ...base, input }),
      calls: callsOf,
      text: (response) => String((response as { output_text?: unknown })?.output_text ?? ""),
      addResponse: (conv, response) => conv.push(...outputOf(response)),
      addReplies: (conv, replies) => conv.push(...inputItems(replies)),
    },
    tools,
    conversation,
    opts.maxTurns ?? 10,
  );
}
