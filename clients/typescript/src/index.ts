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
  ToolFailed,
  ToolOutput,
  ToolProvider,
  type InvocationContext,
  type OutputBlock,
  type OutputContext,
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
export { Concurrency, type ContentBlock, type Tool, type ToolError, type ToolResult } from "./gen/codemode/registry/v1/tool";
/** The generated schema types and grpc-js service definitions. */
export * as registryV1 from "./gen/codemode/registry/v1/registry_service";
export * as pageRunnerV1 from "./gen/codemode/registry/v1/page_runner";
export { tlsCredentials, type ChannelCredentials, type TlsMaterial } from "./tls";
