/**
 * The OpenAI Chat Completions API: an agent's tools as function tools, and a loop over
 * `chat.completions.create` (pass the `OpenAI` client you built; this module imports no SDK).
 * A tool message carries text only: an image in a result reaches the model as a placeholder.
 */
import { runLoop, type LoopResult } from "./loop";
import { contextTexts, type AgentTools, type ModelCall, type ToolReply, type WireSchema } from "./tools";

type Message = Record<string, unknown>;

/** What `run` needs of an `OpenAI` client (`any`: the SDK overloads `create` per request shape). */
export interface ChatClient {
  chat: { completions: { create(body: any): PromiseLike<unknown> } };
}

/** `tools` for `chat.completions.create`: one function tool per wire schema. */
export function toolDefinitions(schemas: readonly WireSchema[]): Message[] {
  return schemas.map((s) => ({
    type: "function",
    function: { name: s.name, description: s.description, parameters: s.parameters },
  }));
}

function messageOf(response: unknown): Message | undefined {
  const choices = (response as { choices?: unknown } | null)?.choices;
  return Array.isArray(choices) && choices.length > 0 ? ((choices[0] as Message).message as Message) : undefined;
}

/** The tool calls of a completion's first choice, in order. */
export function callsOf(response: unknown): ModelCall[] {
  const calls = messageOf(response)?.tool_calls;
  if (!Array.isArray(calls)) return [];
  return (calls as Message[]).map((call) => {
    const fn = (call.function ?? {}) as Message;
    return { callId: String(call.id ?? ""), name: String(fn.name ?? ""), arguments: fn.arguments as ModelCall["arguments"] };
  });
}

/** One `tool` message per reply, then one user message per additional context. */
export function toolMessages(replies: readonly ToolReply[]): Message[] {
  const messages: Message[] = replies.map((r) => ({ role: "tool", tool_call_id: r.call.callId, content: r.text }));
  for (const text of contextTexts(replies)) messages.push({ role: "user", content: text });
  return messages;
}

export interface ChatRunOptions {
  model: string;
  /** A string is one user message after a system message holding `system`. */
  messages: string | Message[];
  /** Default: the agent's system prompt. */
  system?: string;
  maxTurns?: number;
  options?: Record<string, unknown>;
}

/** Runs `openai.chat.completions.create` with the agent's tools until the model answers. */
export function run(openai: ChatClient, tools: AgentTools, opts: ChatRunOptions): Promise<LoopResult<Message, unknown>> {
  let conversation: Message[];
  if (typeof opts.messages === "string") {
    const prompt = opts.system ?? tools.instructions;
    conversation = prompt ? [{ role: "system", content: prompt }] : [];
    conversation.push({ role: "user", content: opts.messages });
  } else {
    conversation = [...opts.messages];
  }
  const base = { model: opts.model, tools: toolDefinitions(tools.schemas), ...opts.options };
  return runLoop<Message, unknown>(
    {
      create: async (messages) => openai.chat.completions.create({ ...base, messages }),
      calls: callsOf,
      text: (response) => String(messageOf(response)?.content ?? ""),
      addResponse: (conv, response) => {
        const message = messageOf(response);
        if (message !== undefined) conv.push(message);
      },
      addReplies: (conv, replies) => conv.push(...toolMessages(replies)),
    },
    tools,
    conversation,
    opts.maxTurns ?? 10,
  );
}
