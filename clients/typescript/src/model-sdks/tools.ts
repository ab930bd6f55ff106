/**
 * An agent's tools as a model sees them, and the way back from a model's tool call (the
 * TypeScript twin of `codemode_client.model_sdks.tools`). The vendor adapters beside this file
 * (`openai-responses`, `openai-chat`, `anthropic-messages`, `ai-sdk`) only reshape its output.
 *
 * A model's bad output is the model's to correct, never the caller's crash: a tool the agent
 * does not have comes back as the registry's `UNKNOWN_TOOL` result, arguments that are not JSON
 * as the registry's `INVALID_ARGUMENT` refusal turned into a failed reply keeping its reason
 * (`INVALID_JSON`, ...). Other RPC errors (an outage, a missing permission) reject.
 */
import { randomUUID } from "node:crypto";
import { status as GrpcStatus } from "@grpc/grpc-js";
import { CodemodeError } from "../errors";
import type { AdditionalContext, ContentBlock } from "../gen/codemode/registry/v1/tool";
import { stringifyJson, type JsonObject, type JsonValue } from "../json";
import type { RegistryClient, ToolCallResult } from "../registry";

const MAX_CALL_ID_BYTES = 512; // the registry's limit on a call id

/** One tool as the model is shown it. */
export interface WireSchema {
  name: string;
  description: string;
  parameters: JsonObject;
}

/** One tool call a model asked for; `arguments` as it sent them (JSON text or an object). */
export interface ModelCall {
  callId: string;
  name: string;
  arguments: string | Record<string, unknown> | null | undefined;
}

/** What goes back to the model for one call. */
export interface ToolReply {
  call: ModelCall;
  /** The registry's call id (the model's, unless it was empty or too long). */
  callId: string;
  isError: boolean;
  /** The Codemode code of a failure (`UNKNOWN_TOOL`, `INVALID_JSON`, ...); else "". */
  code: string;
  /** What the model is shown; for a failure one text block naming the code. */
  content: ContentBlock[];
  /** `content` as one text (JSON blocks as JSON, images as a placeholder). */
  text: string;
  additionalContexts: AdditionalContext[];
  concludesTurn: boolean;
  /** The registry's result (undefined when the registry refused the request itself). */
  result: ToolCallResult | undefined;
}

/** A content block as text, for formats whose tool results carry text only. */
export function blockText(block: ContentBlock): string {
  switch (block.block?.$case) {
    case "text":
      return block.block.value.text;
    case "json":
      return block.block.value.json;
    case "image":
      return `[image ${block.block.value.mimeType}, ${block.block.value.data.length} bytes]`;
    default:
      return "";
  }
}

/** The replies' additional contexts, in order, each as one text (added as user text). */
export function contextTexts(replies: readonly ToolReply[]): string[] {
  return replies.flatMap((r) => r.additionalContexts.map((c) => c.content.map(blockText).join("\n")));
}

/** How a failure reads to a model: the code first, so that it can act on it. */
export function failureText(code: string, message: string): string {
  return code ? `Error [${code}]: ${message}` : `Error: ${message}`;
}

function textBlock(text: string): ContentBlock {
  return { block: { $case: "text", value: { text } } };
}

function reply(
  call: ModelCall,
  callId: string,
  fields: Pick<ToolReply, "isError" | "code" | "content"> & Partial<ToolReply>,
): ToolReply {
  return {
    call,
    callId,
    additionalContexts: [],
    concludesTurn: false,
    result: undefined,
    text: fields.content.map(blockText).join("\n"),
    ...fields,
  };
}

export function replyOf(call: ModelCall, callId: string, result: ToolCallResult): ToolReply {
  if (result.isError) {
    const code = result.error?.code ?? "";
    const content = [textBlock(failureText(code, result.error?.message || result.text))];
    return reply(call, callId, { isError: true, code, content, additionalContexts: result.additionalContexts, result });
  }
  let content = result.content;
  if (content.length === 0 && result.valueJson !== undefined) content = [textBlock(result.valueJson)];
  return reply(call, callId, {
    isError: false,
    code: "",
    content,
    additionalContexts: result.additionalContexts,
    concludesTurn: result.concludesTurn,
    result,
  });
}

function refused(call: ModelCall, callId: string, code: string, message: string): ToolReply {
  return reply(call, callId, { isError: true, code, content: [textBlock(failureText(code, message))] });
}

/**
 * An agent's wire schemas and prompt, and its tool calls through one `RegistryClient`. Holds
 * nothing of a conversation: the registry records every call in the agent's history.
 */
export class AgentTools {
  constructor(
    readonly client: RegistryClient,
    readonly agent: string,
    readonly schemas: readonly WireSchema[],
    readonly instructions = "",
  ) {}

  /** The agent's wire schemas and system prompt, as the registry presents them now. */
  static async load(client: RegistryClient, agent: string, language = ""): Promise<AgentTools> {
    const wire = await client.getWireSchemas(agent, language);
    const prompt = await client.getSystemPrompt(agent, language);
    const schemas = wire.schemas.map((s) => {
      // JSON.parse, not the lossless codec: the schema goes to a vendor SDK's JSON.stringify,
      // which throws on a bigint; a bound past 2^53 shown inexactly to a model is harmless,
      // the registry validates the arguments exactly.
      const parameters = JSON.parse(s.parametersJson) as JsonValue;
      const object = parameters !== null && typeof parameters === "object" && !Array.isArray(parameters);
      return { name: s.name, description: s.description, parameters: object ? parameters : { type: "object" } };
    });
    return new AgentTools(client, agent, schemas, prompt.text);
  }

  /** Executes one model tool call as the agent (ExecuteToolCall, the model's call id). */
  async call(call: ModelCall): Promise<ToolReply> {
    const callId =
      call.callId && Buffer.byteLength(call.callId) <= MAX_CALL_ID_BYTES ? call.callId : `call-${randomUUID()}`;
    let argumentsJson: string;
    if (call.arguments === null || call.arguments === undefined || typeof call.arguments === "string") {
      argumentsJson = call.arguments || "{}";
    } else {
      try {
        argumentsJson = stringifyJson(call.arguments as JsonValue);
      } catch (e) {
        return refused(call, callId, "INVALID_JSON", `arguments: ${(e as Error).message}`);
      }
    }
    try {
      const result = await this.client.executeToolCall({
        agent: this.agent,
        callId,
        toolName: call.name,
        argumentsJson,
        progress: "none",
      }).result;
      return replyOf(call, callId, result);
    } catch (e) {
      // The request itself was refused (not JSON, too large, too deep...): nothing ran.
      if (e instanceof CodemodeError && e.code === GrpcStatus.INVALID_ARGUMENT) {
        return refused(call, callId, e.reason || "INVALID_ARGUMENT", e.message);
      }
      throw e;
    }
  }
}
