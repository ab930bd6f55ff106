/**
 * `RegistryClient`: a typed, promise-based client over the generated grpc-js stub of
 * `codemode.registry.v1.RegistryService`.
 *
 * - Every unary call and every `executeToolCall` carries a deadline (configurable defaults).
 * - Idempotent reads (get/list/visible tools/presentation/history) are retried on UNAVAILABLE
 *   with jittered exponential backoff, within the same deadline; nothing else is retried.
 * - gRPC failures reject with `CodemodeError` (code, reason, domain, metadata from `ErrorInfo`).
 * - `*_json` fields are read and written with the lossless codec (`bigint` beyond 2^53−1).
 */
import {
  credentials as grpcCredentials,
  Metadata,
  status as GrpcStatus,
  type CallOptions as GrpcCallOptions,
  type ChannelCredentials,
  type ChannelOptions,
  type ClientReadableStream,
  type ClientUnaryCall,
  type ServiceError,
} from "@grpc/grpc-js";
import { randomUUID } from "node:crypto";
import { CodemodeError } from "./errors";
import type { HistoryRecord } from "./gen/codemode/registry/v1/history";
import type { GetSdkResponse, GetSystemPromptResponse, GetWireSchemasResponse } from "./gen/codemode/registry/v1/presentation";
import {
  ApprovalOutcome,
  ExecuteToolCallRequest,
  ProgressEvents,
  RegistryServiceClient,
  type ApprovalRequest as ApprovalRequestMessage,
  type ExecuteToolCallResponse,
  type PluginReferenceContext,
  type WatchHistoryResponse,
} from "./gen/codemode/registry/v1/registry_service";
import { PresentationMode, type Agent, type McpServer, type Preset } from "./gen/codemode/registry/v1/scope";
import type { AdditionalContext, ContentBlock, Tool, ToolError, ToolResult } from "./gen/codemode/registry/v1/tool";
import { parseJson, stringifyJson, type JsonValue } from "./json";
import { AsyncQueue } from "./queue";
import SERVICE_CONFIG from "./service_config.json";
import { wholeResult } from "./shared-logs";

export type Mode = "native" | "code" | "both";

/**
 * The channel's one retry policy, the Python client's too (`service_config.json`, the same
 * file in both): idempotent reads on UNAVAILABLE and RESOURCE_EXHAUSTED, `ExecuteToolCall`
 * only on RESOURCE_EXHAUSTED (an admission refusal: nothing of it started), nothing else.
 * gRPC runs every attempt inside the call's deadline and waits as long as the server's
 * pushback (`grpc-retry-pushback-ms`, sent beside RetryInfo) asks. `retry` overrides the
 * attempts and backoffs; one attempt: no retries.
 */
export function retryServiceConfig(retry: Required<RetryOptions>): object {
  const config = JSON.parse(JSON.stringify(SERVICE_CONFIG)) as {
    methodConfig: { retryPolicy: Record<string, unknown> }[];
  };
  if (retry.maxAttempts <= 1) return { methodConfig: [] };
  for (const method of config.methodConfig) {
    method.retryPolicy.maxAttempts = retry.maxAttempts;
    method.retryPolicy.initialBackoff = `${retry.initialBackoffMs / 1000}s`;
    method.retryPolicy.maxBackoff = `${retry.maxBackoffMs / 1000}s`;
  }
  return config;
}

export interface RetryOptions {
  /** Attempts in total, first included (default 4). */
  maxAttempts?: number;
  /** First backoff ceiling in ms (default 100); doubles per attempt, full jitter. */
  initialBackoffMs?: number;
  /** Largest backoff ceiling in ms (default 2000). */
  maxBackoffMs?: number;
}

export interface RegistryClientOptions {
  /** Default: insecure (plaintext) credentials. */
  credentials?: ChannelCredentials;
  /** grpc-js channel options; the receive/send limits default to 64 MiB. */
  channelOptions?: ChannelOptions;
  /** Deadline of unary calls in ms (default 30 s). */
  timeoutMs?: number;
  /** Deadline of `executeToolCall`/`runCode` in ms (default 600 s, the runtime's wall budget). */
  executeTimeoutMs?: number;
  /** Retry policy of idempotent reads on UNAVAILABLE. */
  retry?: RetryOptions;
  /** Metadata sent with every call (e.g. authorization). */
  metadata?: Record<string, string>;
}

export interface CallOptions {
  /** This call's deadline in ms from now (overrides the client default). */
  timeoutMs?: number;
  /** Aborting cancels the RPC. */
  signal?: AbortSignal;
}

export interface Page {
  pageSize?: number;
  pageToken?: string;
}

export type ApprovalOutcomeName = "allowedOnce" | "rejected" | "cancelled" | "unavailable" | "expired" | "unspecified";

/** A pending approval request, as an approver (a stream, or `listPendingApprovals`) sees it. */
export interface ApprovalRequest {
  approvalId: string;
  callId: string;
  agent: string;
  toolName: string;
  /** The call's arguments, decoded losslessly. */
  arguments: JsonValue;
  argumentsJson: string;
  /** Why approval is needed, as the policy stated it. */
  reason: string;
  /** When the request expires unanswered; undefined: it waits until answered or cancelled. */
  expireTime?: Date;
}

/** An approver's answer: allowed for this call only, or rejected. */
export type ApprovalAnswer = "allow" | "reject";

export function approvalRequestOf(message: ApprovalRequestMessage): ApprovalRequest {
  return {
    approvalId: message.approvalId,
    callId: message.callId,
    agent: message.agent,
    toolName: message.toolName,
    arguments: parseJson(message.argumentsJson || "{}"),
    argumentsJson: message.argumentsJson,
    reason: message.reason,
    ...(message.expireTime ? { expireTime: message.expireTime } : {}),
  };
}

/** The outcome of one tool call, with its value decoded losslessly. */
export interface ToolCallResult {
  isError: boolean;
  /** The call's JSON value (`value_json` parsed); `undefined` on errors or content-only results. */
  value: JsonValue | undefined;
  /** `value_json` exactly as received. */
  valueJson: string | undefined;
  /** The text blocks of `content`, joined by newlines. */
  text: string;
  content: ContentBlock[];
  /** Set when `isError`: message, stable code (`DENIED`, `CODE_RUN_FAILED`, ...), class name. */
  error: ToolError | undefined;
  additionalContexts: AdditionalContext[];
  concludesTurn: boolean;
}

export type ToolCallEvent =
  | { type: "started"; callId: string; toolName: string }
  | { type: "approvalPending"; approvalId: string; reason: string }
  | { type: "approvalResolved"; approvalId: string; outcome: ApprovalOutcomeName }
  | {
      type: "nestedStarted";
      subCallId: string;
      toolName: string;
      /** Time the call waited in the run's scheduler queue before it started, in milliseconds. */
      queueWaitMs: number;
    }
  | {
      type: "nestedSettled";
      subCallId: string;
      toolName: string;
      isError: boolean;
      errorCode: string;
      durationMs: number;
    }
  | { type: "log"; text: string }
  | {
      /** The tool's own progress (an MCP server's), bounded by the registry: increasing per call. */
      type: "toolProgress";
      /** The reporting call: this call, or a run_code nested call's sub-call id. */
      callId: string;
      toolName: string;
      progress: number;
      /** The total `progress` will reach, when the tool knows it. */
      total: number | undefined;
      message: string;
    }
  | { type: "result"; result: ToolCallResult };

export interface ExecuteToolCallInput {
  /** `agents/{id}`; empty or omitted: the global scope. */
  agent?: string;
  /** The model's tool-call id; a random UUID when omitted. */
  callId?: string;
  toolName: string;
  /** The arguments as a value (serialized losslessly)… */
  arguments?: JsonValue;
  /** …or as JSON text, passed through untouched. */
  argumentsJson?: string;
  /** Which progress events come before the result: "all" (default), "approvals" or "none". */
  progress?: Progress;
}

/** Which progress events an execute stream carries before its result. */
export type Progress = "all" | "approvals" | "none";
const PROGRESS: Record<Progress, ProgressEvents> = {
  all: ProgressEvents.PROGRESS_EVENTS_ALL,
  approvals: ProgressEvents.PROGRESS_EVENTS_APPROVALS,
  none: ProgressEvents.PROGRESS_EVENTS_NONE,
};

/** The value of a successful `run_code` result. */
export interface RunCodeValue {
  logs: string[];
  result?: JsonValue;
}

/**
 * Whose history to read: an agent's name (`agents/{id}`), or `{ agentId }` (`Agent.agentId`) to
 * read a deleted agent's history by its stable id (a re-created name starts an empty history).
 */
export type HistoryOf = string | { agentId: string };

function historyKey(of: HistoryOf): { agent: string; agentId: string } {
  return typeof of === "string" ? { agent: of, agentId: "" } : { agent: "", agentId: of.agentId };
}

/** A history record with its arguments decoded (when it has any). */
export type HistoryEntry = HistoryRecord & { arguments: JsonValue | undefined };

/**
 * A message to the agent in its history: an `agent/steer` record (`kind: "steer"`: wake the
 * agent, e.g. a dynamic Cordis plugin's host died after its activation) or an `agent/inject`
 * record (`kind: "inject"`: context for its next step, e.g. a person's panel action).
 */
export interface AgentMessage {
  kind: "steer" | "inject";
  agent: string;
  seq: bigint;
  /** Who wrote it, e.g. `cordis-host-runner`. */
  source: string;
  text: string;
  /** Source metadata, e.g. `pluginId`, `packageId`, `pluginRunId`. */
  metadata: Record<string, JsonValue>;
  time: Date | undefined;
}

const AGENT_MESSAGE_KINDS: Record<string, AgentMessage["kind"]> = { "agent/steer": "steer", "agent/inject": "inject" };

/** The typed message a history record carries; undefined for any other record. */
export function agentMessage(record: HistoryRecord): AgentMessage | undefined {
  const kind = AGENT_MESSAGE_KINDS[record.kind];
  if (kind === undefined) return undefined;
  const metadata = record.argumentsJson === "" ? {} : parseJson(record.argumentsJson);
  const text = record.content.map((b) => (b.block?.$case === "text" ? b.block.value.text : "")).join("");
  return {
    kind,
    agent: record.agent,
    seq: record.seq,
    source: record.toolName,
    text,
    metadata: metadata !== null && typeof metadata === "object" && !Array.isArray(metadata) ? metadata : {},
    time: record.time,
  };
}

/**
 * One executing tool call: iterate it for events (the last is `result`), or await `result`.
 * Breaking out of the iteration early, `cancel()` and the abort signal all cancel the RPC, which
 * aborts the call in the registry.
 */
export class ToolCall implements AsyncIterable<ToolCallEvent> {
  readonly result: Promise<ToolCallResult>;
  private readonly events: AsyncQueue<ToolCallEvent>;

  /** @internal */
  constructor(
    readonly callId: string,
    private readonly stream: ClientReadableStream<ExecuteToolCallResponse>,
    signal: AbortSignal | undefined,
  ) {
    this.events = new AsyncQueue<ToolCallEvent>(() => this.cancel());
    let resolve!: (r: ToolCallResult) => void;
    let reject!: (e: unknown) => void;
    this.result = new Promise<ToolCallResult>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    this.result.catch(() => undefined); // handled by whoever awaits it; never "unhandled"
    let settled = false;
    const onAbort = (): void => this.cancel();
    const finish = (error?: CodemodeError): void => {
      if (settled) return;
      settled = true;
      signal?.removeEventListener("abort", onAbort);
      if (error !== undefined) {
        reject(error);
        this.events.fail(error);
      } else {
        this.events.end();
      }
    };
    const handle = (message: ExecuteToolCallResponse): void => {
      if (settled) return;
      const event = toEvent(message);
      // A progress event this client does not know (a registry newer than it) decodes with no
      // case set: it is informational, so it is skipped; the result is always a known case.
      if (event === undefined) return;
      this.events.push(event);
      if (event.type === "result") {
        resolve(event.result);
        finish();
      }
    };
    stream.on("data", (message: ExecuteToolCallResponse) => {
      // A batch carries progress events that were ready together: delivered one by one.
      if (message.event?.$case === "batch") message.event.value.events.forEach(handle);
      else handle(message);
    });
    stream.on("error", (e: ServiceError) => finish(CodemodeError.from(e)));
    stream.on("end", () =>
      finish(new CodemodeError(GrpcStatus.INTERNAL, "the execute stream ended without a result")),
    );
    if (signal !== undefined) {
      if (signal.aborted) this.cancel();
      else signal.addEventListener("abort", onAbort, { once: true });
    }
  }

  /** Cancels the call (the registry aborts it and settles everything it started). */
  cancel(): void {
    this.stream.cancel();
  }

  [Symbol.asyncIterator](): AsyncIterator<ToolCallEvent> {
    return this.events;
  }
}

const OUTCOMES: Record<number, ApprovalOutcomeName> = {
  [ApprovalOutcome.APPROVAL_OUTCOME_ALLOWED_ONCE]: "allowedOnce",
  [ApprovalOutcome.APPROVAL_OUTCOME_REJECTED]: "rejected",
  [ApprovalOutcome.APPROVAL_OUTCOME_CANCELLED]: "cancelled",
  [ApprovalOutcome.APPROVAL_OUTCOME_UNAVAILABLE]: "unavailable",
  [ApprovalOutcome.APPROVAL_OUTCOME_EXPIRED]: "expired",
};

export function approvalOutcomeName(outcome: ApprovalOutcome): ApprovalOutcomeName {
  return OUTCOMES[outcome] ?? "unspecified";
}

export function toToolCallResult(received: ToolResult): ToolCallResult {
  const result = wholeResult(received);
  const texts: string[] = [];
  for (const block of result.content) {
    if (block.block?.$case === "text") texts.push(block.block.value.text);
  }
  return {
    isError: result.isError,
    value: result.valueJson === undefined ? undefined : parseJson(result.valueJson),
    valueJson: result.valueJson,
    text: texts.join("\n"),
    content: result.content,
    error: result.error,
    additionalContexts: result.additionalContexts,
    concludesTurn: result.concludesTurn,
  };
}

function toEvent(message: ExecuteToolCallResponse): ToolCallEvent | undefined {
  const event = message.event;
  switch (event?.$case) {
    case "started":
      return { type: "started", callId: event.value.callId, toolName: event.value.toolName };
    case "approvalPending":
      return { type: "approvalPending", approvalId: event.value.approvalId, reason: event.value.reason };
    case "approvalResolved":
      return {
        type: "approvalResolved",
        approvalId: event.value.approvalId,
        outcome: approvalOutcomeName(event.value.outcome),
      };
    case "nestedStarted":
      return {
        type: "nestedStarted",
        subCallId: event.value.subCallId,
        toolName: event.value.toolName,
        queueWaitMs: event.value.queueWaitMs,
      };
    case "nestedSettled":
      return {
        type: "nestedSettled",
        subCallId: event.value.subCallId,
        toolName: event.value.toolName,
        isError: event.value.isError,
        errorCode: event.value.errorCode,
        durationMs: event.value.durationMs,
      };
    case "log":
      return { type: "log", text: event.value.text };
    case "toolProgress":
      return {
        type: "toolProgress",
        callId: event.value.callId,
        toolName: event.value.toolName,
        progress: event.value.progress,
        total: event.value.total,
        message: event.value.message,
      };
    case "result":
      return { type: "result", result: toToolCallResult(event.value) };
    default:
      return undefined;
  }
}

export function toPresentationMode(mode: Mode | PresentationMode | undefined): PresentationMode {
  switch (mode) {
    case undefined:
      return PresentationMode.PRESENTATION_MODE_UNSPECIFIED;
    case "native":
      return PresentationMode.PRESENTATION_MODE_NATIVE;
    case "code":
      return PresentationMode.PRESENTATION_MODE_CODE;
    case "both":
      return PresentationMode.PRESENTATION_MODE_BOTH;
    default:
      return mode;
  }
}

export function modeName(mode: PresentationMode): Mode | "unspecified" {
  switch (mode) {
    case PresentationMode.PRESENTATION_MODE_NATIVE:
      return "native";
    case PresentationMode.PRESENTATION_MODE_CODE:
      return "code";
    case PresentationMode.PRESENTATION_MODE_BOTH:
      return "both";
    default:
      return "unspecified";
  }
}

function toEntry(record: HistoryRecord): HistoryEntry {
  return { ...record, arguments: record.argumentsJson === "" ? undefined : parseJson(record.argumentsJson) };
}

type UnaryMethod<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<GrpcCallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

const MiB = 1024 * 1024;
/** gRPC's default receive limit, what a channel receives unless told otherwise. */
const GRPC_DEFAULT_RECEIVE_BYTES = 4 * MiB;

/** The receive limit a `grpc.max_receive_message_length` option sets (-1: gRPC's int32 most). */
function receiveLimit(option: unknown): number {
  if (typeof option !== "number") return GRPC_DEFAULT_RECEIVE_BYTES;
  return option < 0 ? 2 ** 31 - 1 : option;
}

/** The languages a `run_code` program may be written in. */
export type CodeLanguage = "python" | "typescript";

export class RegistryClient {
  /** The generated grpc-js stub, for anything this class does not wrap. */
  readonly stub: RegistryServiceClient;
  readonly timeoutMs: number;
  readonly executeTimeoutMs: number;
  /** The largest message this client's channel receives; a provider or an approver declares it
   * when it opens its stream, so the registry never sends it an invocation or an approval
   * request the channel would refuse. */
  readonly maxReceiveMessageBytes: number;
  private readonly retry: Required<RetryOptions>;
  private readonly baseMetadata: Record<string, string>;

  constructor(target: string, options: RegistryClientOptions = {}) {
    this.retry = {
      maxAttempts: options.retry?.maxAttempts ?? 4,
      initialBackoffMs: options.retry?.initialBackoffMs ?? 100,
      maxBackoffMs: options.retry?.maxBackoffMs ?? 2000,
    };
    const channelOptions: ChannelOptions = {
      "grpc.max_receive_message_length": 64 * MiB,
      "grpc.max_send_message_length": 64 * MiB,
      "grpc.enable_retries": 1,
      "grpc.service_config": JSON.stringify(retryServiceConfig(this.retry)),
      ...options.channelOptions,
    };
    this.stub = new RegistryServiceClient(target, options.credentials ?? grpcCredentials.createInsecure(), channelOptions);
    this.maxReceiveMessageBytes = receiveLimit(channelOptions["grpc.max_receive_message_length"]);
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.executeTimeoutMs = options.executeTimeoutMs ?? 600_000;
    this.baseMetadata = { ...options.metadata };
  }

  /** Closes the channel. Open streams end with CANCELLED/UNAVAILABLE. */
  close(): void {
    this.stub.close();
  }

  /** @internal Fresh metadata for one call. */
  metadata(): Metadata {
    const md = new Metadata();
    for (const [k, v] of Object.entries(this.baseMetadata)) md.set(k, v);
    return md;
  }

  // -- execution -------------------------------------------------------------------------------

  /** Executes one model-direct tool call; iterate the returned call for its events. */
  executeToolCall(input: ExecuteToolCallInput, options: CallOptions = {}): ToolCall {
    const callId = input.callId ?? randomUUID();
    const argumentsJson =
      input.argumentsJson ?? (input.arguments === undefined ? "" : stringifyJson(input.arguments));
    const request = ExecuteToolCallRequest.fromPartial({
      agent: input.agent ?? "",
      callId,
      toolName: input.toolName,
      argumentsJson,
      progressEvents: PROGRESS[input.progress ?? "all"],
      batchProgress: true,
      shareLogs: true, // restored by toToolCallResult: callers see every result whole
    });
    const deadline = new Date(Date.now() + (options.timeoutMs ?? this.executeTimeoutMs));
    const stream = this.stub.executeToolCall(request, this.metadata(), { deadline });
    return new ToolCall(callId, stream, options.signal);
  }

  /** Calls `run_code` for a code-mode agent: `code` is the body of an async Python function. */
  runCode(
    agent: string,
    code: string,
    description: string,
    options: CallOptions & { callId?: string; progress?: Progress } = {},
  ): ToolCall {
    return this.executeToolCall(
      {
        agent,
        callId: options.callId,
        toolName: "run_code",
        arguments: { code, description },
        progress: options.progress,
      },
      options,
    );
  }

  // -- presets and agents ----------------------------------------------------------------------

  /**
   * `codeLanguage`: the program language its agents' `run_code` uses (none: inherit).
   * `selfModification`: whether its agents get the dynamic Cordis tools (none: inherit).
   * `mcpServers`: MCP servers whose tools the preset's scope gets (docs/mcp.md).
   */
  async createPreset(
    presetId: string,
    preset: {
      mode?: Mode | PresentationMode;
      codeLanguage?: CodeLanguage;
      selfModification?: boolean;
      mcpServers?: McpServerInput[];
    } = {},
    options?: CallOptions,
  ): Promise<Preset> {
    const request = {
      presetId,
      preset: {
        name: "",
        mode: toPresentationMode(preset.mode),
        createTime: undefined,
        codeLanguage: preset.codeLanguage ?? "",
        selfModification: preset.selfModification,
        mcpServers: (preset.mcpServers ?? []).map(toMcpServer),
      },
    };
    return (await this.unary(this.stub.createPreset, request, options, false)).preset!;
  }

  async getPreset(name: string, options?: CallOptions): Promise<Preset> {
    return (await this.unary(this.stub.getPreset, { name }, options, true)).preset!;
  }

  async listPresets(page: Page = {}, options?: CallOptions): Promise<{ presets: Preset[]; nextPageToken: string }> {
    return this.unary(this.stub.listPresets, { pageSize: page.pageSize ?? 0, pageToken: page.pageToken ?? "" }, options, true);
  }

  /** `force` also deletes a preset that agents use: they fall back to the deployment default. */
  async deletePreset(name: string, options?: CallOptions & { force?: boolean }): Promise<void> {
    await this.unary(this.stub.deletePreset, { name, force: options?.force ?? false }, options, false);
  }

  /**
   * `codeLanguage`: the program language of its `run_code` (none: the preset's, else the
   * deployment default); the agent's `effectiveCodeLanguage` says which is in force.
   * `selfModification` likewise (`effectiveSelfModification`): the dynamic Cordis tools.
   * `mcpServers`: MCP servers whose tools the agent's scope gets (docs/mcp.md).
   */
  async createAgent(
    agentId: string,
    agent: {
      preset?: string;
      mode?: Mode | PresentationMode;
      codeLanguage?: CodeLanguage;
      selfModification?: boolean;
      mcpServers?: McpServerInput[];
    } = {},
    options?: CallOptions,
  ): Promise<Agent> {
    const request = {
      agentId,
      agent: {
        name: "",
        preset: agent.preset ?? "",
        mode: toPresentationMode(agent.mode),
        effectiveMode: PresentationMode.PRESENTATION_MODE_UNSPECIFIED,
        createTime: undefined,
        codeLanguage: agent.codeLanguage ?? "",
        effectiveCodeLanguage: "",
        selfModification: agent.selfModification,
        effectiveSelfModification: false,
        agentId: "",
        mcpServers: (agent.mcpServers ?? []).map(toMcpServer),
      },
    };
    return (await this.unary(this.stub.createAgent, request, options, false)).agent!;
  }

  async getAgent(name: string, options?: CallOptions): Promise<Agent> {
    return (await this.unary(this.stub.getAgent, { name }, options, true)).agent!;
  }

  async listAgents(page: Page = {}, options?: CallOptions): Promise<{ agents: Agent[]; nextPageToken: string }> {
    return this.unary(this.stub.listAgents, { pageSize: page.pageSize ?? 0, pageToken: page.pageToken ?? "" }, options, true);
  }

  async deleteAgent(name: string, options?: CallOptions): Promise<void> {
    await this.unary(this.stub.deleteAgent, { name }, options, false);
  }

  /** The `@pluginId` context blocks for one user message's text (append them to the step). */
  async resolvePluginReferences(
    agent: string,
    text: string,
    options?: CallOptions,
  ): Promise<PluginReferenceContext[]> {
    return (await this.unary(this.stub.resolvePluginReferences, { agent, text }, options, true)).contexts;
  }

  async setPresentationMode(scope: string, mode: Mode | PresentationMode, options?: CallOptions): Promise<void> {
    await this.unary(this.stub.setPresentationMode, { scope, mode: toPresentationMode(mode) }, options, false);
  }

  /**
   * Adds a restriction; returns its id for `removeRestriction`. `allow: []` is an allow list
   * naming none (hides every inherited tool; sent as `allowNone`, since an empty repeated field
   * is absent on the wire); an omitted `allow` is no allow list.
   */
  async addRestriction(
    scope: string,
    restriction: { allow?: string[]; deny?: string[] },
    options?: CallOptions,
  ): Promise<string> {
    const { allow, deny } = restriction;
    const request = { scope, allow: allow ?? [], deny: deny ?? [], allowNone: allow?.length === 0 };
    return (await this.unary(this.stub.addRestriction, request, options, false)).restrictionId;
  }

  async removeRestriction(scope: string, restrictionId: string, options?: CallOptions): Promise<void> {
    await this.unary(this.stub.removeRestriction, { scope, restrictionId }, options, false);
  }

  // -- tools and presentation ------------------------------------------------------------------

  async listVisibleTools(scope = "", options?: CallOptions): Promise<{ tools: Tool[]; effectiveMode: PresentationMode }> {
    return this.unary(this.stub.listVisibleTools, { scope }, options, true);
  }

  async getWireSchemas(scope = "", language = "", options?: CallOptions): Promise<GetWireSchemasResponse> {
    return this.unary(this.stub.getWireSchemas, { scope, language }, options, true);
  }

  async getSystemPrompt(scope = "", language = "", options?: CallOptions): Promise<GetSystemPromptResponse> {
    return this.unary(this.stub.getSystemPrompt, { scope, language }, options, true);
  }

  async getSdk(scope = "", language = "", options?: CallOptions): Promise<GetSdkResponse> {
    return this.unary(this.stub.getSdk, { scope, language }, options, true);
  }

  // -- history ---------------------------------------------------------------------------------

  /** One page of an agent's history (optionally one call's: call id or root call id). */
  async listHistory(
    agent: HistoryOf,
    query: Page & { callId?: string } = {},
    options?: CallOptions,
  ): Promise<{ records: HistoryEntry[]; nextPageToken: string }> {
    const request = { ...historyKey(agent), callId: query.callId ?? "", pageSize: query.pageSize ?? 0, pageToken: query.pageToken ?? "" };
    const page = await this.unary(this.stub.listHistory, request, options, true);
    return { records: page.records.map(toEntry), nextPageToken: page.nextPageToken };
  }

  /**
   * The pending approval requests this principal may answer, oldest first: for approvers that
   * are not streams (with `approvals_in_store`, those of every registry sharing the database).
   */
  async listPendingApprovals(
    page: Page = {},
    options?: CallOptions,
  ): Promise<{ approvals: ApprovalRequest[]; nextPageToken: string }> {
    const request = { pageSize: page.pageSize ?? 0, pageToken: page.pageToken ?? "" };
    const listed = await this.unary(this.stub.listPendingApprovals, request, options, true);
    return { approvals: listed.approvals.map(approvalRequestOf), nextPageToken: listed.nextPageToken };
  }

  /**
   * Answers a pending request; the first answer on any registry wins. A `CodemodeError`
   * NOT_FOUND for an id this principal may not answer, FAILED_PRECONDITION
   * (`APPROVAL_NOT_PENDING`) when it was answered, withdrawn or expired already.
   */
  async resolveApproval(approvalId: string, answer: ApprovalAnswer, options?: CallOptions): Promise<void> {
    const outcome =
      answer === "allow" ? ApprovalOutcome.APPROVAL_OUTCOME_ALLOWED_ONCE : ApprovalOutcome.APPROVAL_OUTCOME_REJECTED;
    await this.unary(this.stub.resolveApproval, { approvalId, outcome }, options, false);
  }

  /** A record's full content: what was spilled when the record holds only a preview. */
  async recordContent(agent: HistoryOf, seq: bigint | number, options?: CallOptions): Promise<ContentBlock[]> {
    const request = { ...historyKey(agent), seq: BigInt(seq) };
    const response = await this.unary(this.stub.getRecordContent, request, options, true);
    return response.content;
  }

  /**
   * Follows an agent's history: records after `afterSeq`, then new ones as they are written.
   * Ends when the consumer stops iterating or the signal aborts. A dropped connection
   * (UNAVAILABLE) is resumed after the last record seen. No deadline unless `timeoutMs` is set:
   * a watch lives as long as its consumer.
   */
  async *watchHistory(
    agent: HistoryOf,
    options: { afterSeq?: bigint | number; signal?: AbortSignal; timeoutMs?: number } = {},
  ): AsyncGenerator<HistoryEntry, void, undefined> {
    let after = BigInt(options.afterSeq ?? 0);
    const signal = options.signal;
    const deadline = options.timeoutMs === undefined ? undefined : new Date(Date.now() + options.timeoutMs);
    let failures = 0;
    let backoff = this.retry.initialBackoffMs;
    while (!signal?.aborted) {
      const request = { ...historyKey(agent), afterSeq: after };
      const call = this.stub.watchHistory(request, this.metadata(), deadline ? { deadline } : {});
      const records = new AsyncQueue<HistoryRecord>(() => call.cancel());
      const onAbort = (): void => call.cancel();
      signal?.addEventListener("abort", onAbort, { once: true });
      call.on("data", (r: WatchHistoryResponse) => {
        if (r.record !== undefined) records.push(r.record);
      });
      call.on("error", (e: ServiceError) => records.fail(CodemodeError.from(e)));
      call.on("end", () => records.end());
      try {
        for await (const record of records) {
          failures = 0;
          backoff = this.retry.initialBackoffMs;
          after = record.seq;
          yield toEntry(record);
        }
        return;
      } catch (e) {
        const error = CodemodeError.from(e);
        if (signal?.aborted && error.code === GrpcStatus.CANCELLED) return;
        if (error.code !== GrpcStatus.UNAVAILABLE || ++failures >= this.retry.maxAttempts) throw error;
      } finally {
        signal?.removeEventListener("abort", onAbort);
        call.cancel();
      }
      await sleep(Math.random() * backoff, signal);
      backoff = Math.min(backoff * 2, this.retry.maxBackoffMs);
    }
  }

  /**
   * `watchHistory` reduced to the messages for the agent (`agent/steer`, `agent/inject`) as
   * typed events; the rest of the history is skipped. Same options and resumption.
   */
  async *watchAgentMessages(
    agent: string,
    options: { afterSeq?: bigint | number; signal?: AbortSignal; timeoutMs?: number } = {},
  ): AsyncGenerator<AgentMessage, void, undefined> {
    for await (const record of this.watchHistory(agent, options)) {
      const message = agentMessage(record);
      if (message !== undefined) yield message;
    }
  }

  // -- plumbing --------------------------------------------------------------------------------

  /**
   * One unary call with one deadline over all its attempts. Which methods are retried (and
   * when) is the channel's service-config policy (`retryServiceConfig`); `idempotent` only
   * documents the call.
   */
  private async unary<Req, Res>(
    method: UnaryMethod<Req, Res>,
    request: Req,
    options: CallOptions | undefined,
    _idempotent: boolean,
  ): Promise<Res> {
    const deadline = Date.now() + (options?.timeoutMs ?? this.timeoutMs);
    return await this.unaryOnce(method, request, deadline, options?.signal);
  }

  private unaryOnce<Req, Res>(
    method: UnaryMethod<Req, Res>,
    request: Req,
    deadline: number,
    signal: AbortSignal | undefined,
  ): Promise<Res> {
    return new Promise<Res>((resolve, reject) => {
      if (signal?.aborted) {
        reject(new CodemodeError(GrpcStatus.CANCELLED, "the call was aborted"));
        return;
      }
      const onAbort = (): void => call.cancel();
      const call = method.call(this.stub, request, this.metadata(), { deadline: new Date(deadline) }, (error, response) => {
        signal?.removeEventListener("abort", onAbort);
        if (error) reject(CodemodeError.from(error));
        else resolve(response);
      });
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
}

/**
 * An MCP server to attach to a scope: one the registry settings declare, by name, or a
 * streamable-HTTP URL within the settings' `mcp_http_allow` (docs/mcp.md).
 */
export type McpServerInput = { server: string } | { url: string; headers?: Record<string, string> };

function toMcpServer(input: McpServerInput): McpServer {
  const source =
    "server" in input
      ? { $case: "server" as const, value: input.server }
      : { $case: "url" as const, value: input.url };
  const headers = "url" in input ? (input.headers ?? {}) : {};
  return { source, headers, state: "", lastError: "", refusedTools: [] };
}
