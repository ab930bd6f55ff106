/**
 * The Anthropic Messages API: an agent's tools as client tools, and a loop over
 * `messages.create` (pass the `Anthropic` client you built; this module imports no SDK). A
 * failure is a `tool_result` with `is_error: true` whose text names the Codemode code.
 */
import type { ContentBlock } from "../gen/codemode/registry/v1/tool";
import { runLoop, type LoopResult } from "./loop";
import { blockText, type AgentTools, type ModelCall, type ToolReply, type WireSchema } from "./tools";

type Block = Record<string, unknown>;
type Message = { role: "user" | "assistant"; content: string | Block[] };

/** What `run` needs of an `Anthropic` client (`any`: the SDK overloads `create` per request shape). */
export interface MessagesClient {
  messages: { create(body: any): PromiseLike<unknown> };
}

/** `tools` for `messages.create`: one client tool per wire schema. */
export function toolDefinitions(schemas: readonly WireSchema[]): Block[] {
  return schemas.map((s) => ({ name: s.name, description: s.description, input_schema: s.parameters }));
}

function contentOf(response: unknown): Block[] {
  const content = (response as { content?: unknown } | null)?.content;
  return Array.isArray(content) ? (content as Block[]) : [];
}

/** The `tool_use` blocks of a message, in order. */
export function callsOf(response: unknown): ModelCall[] {
  return contentOf(response)
    .filter((b) => b.type === "tool_use")
    .map((b) => ({ callId: String(b.id ?? ""), name: String(b.name ?? ""), arguments: b.input as ModelCall["arguments"] }));
}

function block(b: ContentBlock): Block {
  if (b.block?.$case === "image") {
    const { mimeType, data } = b.block.value;
    return { type: "image", source: { type: "base64", media_type: mimeType, data: data.toString("base64") } };
  }
  return { type: "text", text: blockText(b) };
}

/** The user message answering a turn: a `tool_result` per reply, then the contexts as text. */
export function toolResults(replies: readonly ToolReply[]): Message {
  const content: Block[] = replies.map((r) => ({
    type: "tool_result",
    tool_use_id: r.call.callId,
    content: r.content.length > 0 ? r.content.map(block) : [{ type: "text", text: "" }],
    is_error: r.isError,
  }));
  for (const r of replies) for (const c of r.additionalContexts) content.push(...c.content.map(block));
  return { role: "user", content };
}

export interface MessagesRunOptions {
  model: string;
  messages: string | Message[];
  /** Default 4096. */
  maxTokens?: number;
  /** Default: the agent's system prompt. */
  system?: string;
  maxTurns?: number;
  options?: Record<string, unknown>;
}

/** Runs `anthropic.messages.create` with the agent's tools until the model answers. */
export function run(anthropic: MessagesClient, tools: AgentTools, opts: MessagesRunOptions): Promise<LoopResult<Message, unknown>> {
  const system = opts.system ?? (tools.instructions || undefined);
  const base = {
    model: opts.model,
    max_tokens: opts.maxTokens ?? 4096,
    tools: toolDefinitions(tools.schemas),
    ...(system ? { system } : {}),
    ...opts.options,
  };
  const conversation: Message[] = typeof opts.messages === "string" ? [{ role: "user", content: opts.messages }] : [...opts.messages];
  return runLoop<Message, unknown>(
    {
      create: async (messages) => anthropic.messages.create({ ...base, messages }),
      calls: callsOf,
      text: (response) =>
        contentOf(response)
          .filter((b) => b.type === "text")
          .map((b) => String(b.text ?? ""))
          .join(""),
      addResponse: (conv, response) => conv.push({ role: "assistant", content: contentOf(response) }),
      addReplies: (conv, replies) => conv.push(toolResults(replies)),
    },
    tools,
    conversation,
    opts.maxTurns ?? 10,
  );
}
