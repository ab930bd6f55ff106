/** `@codemode/client`: the TypeScript client of the Codemode registry. */
export {
  Approver,
  type ApprovalAnswer,
  type ApprovalContext,
  type ApprovalHandler,
  type ApprovalRequest,
  type ApproverOptions,
} from "./approver";
export { CodemodeError, errorInfoOf, retryDelayOf } from "./errors";
export { JsonError, parseJson, renderPrettyJson, stringifyJson, type JsonObject, type JsonValue } from "./json";
export {
  PageRunner,
  type ClientCode,
  type InspectProvider,
  type InspectQuery,
  type InvokeResult,
  type PageAnswer,
  type PageEvent,
  type ReviewSource,
  type RunRequest,
  type SettleOptions,
  type SettleOutcomeName,
} from "./page-runner";
export { type ServeOptions } from "./reconnect";
export { ReplicaSet, resolveAll, splitTarget, type ReplicaSetOptions, type Served } from "./replicas";
export { type ZodInput, type ZodSchemaLike } from "./zod-schema";
export {
  ToolError,
  ToolFailed,
  ToolOutput,
  ToolProvider,
  type InvocationContext,
  type OutputBlock,
  type OutputContext,
  type ProviderLogger,
  type ToolDefinition,
  type ToolHandler,
  type ToolOutputInit,
  type ToolProviderOptions,
} from "./provider";
export {
  RegistryClient,
  ToolCall,
  agentMessage,
  approvalOutcomeName,
  modeName,
  toPresentationMode,
  toToolCallResult,
  type AgentMessage,
  type ApprovalOutcomeName,
  type CallOptions,
  type CodeLanguage,
  type ExecuteToolCallInput,
  type HistoryEntry,
  type HistoryOf,
  type McpServerInput,
  type Mode,
  type Page,
  type Progress,
  type RegistryClientOptions,
  type RetryOptions,
  type RunCodeValue,
  type ToolCallEvent,
  type ToolCallResult,
} from "./registry";
export { status } from "@grpc/grpc-js";
export type { HistoryRecord } from "./gen/codemode/registry/v1/history";
export { PresentationMode, type Agent, type McpServer, type Preset } from "./gen/codemode/registry/v1/scope";
// The result's error message type is `ToolResultError` here: `ToolError` is the class a handler throws.
export {
  Concurrency,
  type ContentBlock,
  type Tool,
  type ToolError as ToolResultError,
  type ToolResult,
} from "./gen/codemode/registry/v1/tool";
/** The generated schema types and grpc-js service definitions. */
export * as registryV1 from "./gen/codemode/registry/v1/registry_service";
export * as pageRunnerV1 from "./gen/codemode/registry/v1/page_runner";
export { tlsCredentials, type ChannelCredentials, type TlsMaterial } from "./tls";
/**
 * Model SDK adapters: OpenAI Responses and Chat Completions, Anthropic Messages. AI SDK tools
 * are a separate entry, `@codemode/client/ai-sdk`, so that the types of `ai` (an optional peer)
 * are needed only where it is used.
 */
export { AgentTools, blockText, contextTexts, failureText, type ModelCall, type ToolReply, type WireSchema } from "./model-sdks/tools";
export { runLoop, type Dialect, type LoopResult } from "./model-sdks/loop";
export * as openaiResponses from "./model-sdks/openai-responses";
export * as openaiChat from "./model-sdks/openai-chat";
export * as anthropicMessages from "./model-sdks/anthropic-messages";
