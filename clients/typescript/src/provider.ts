/**
 * Serve tools from plain async functions over the registry's `Connect` stream.
 *
 *     const provider = new ToolProvider(client, "files");
 *     provider.tool({ name: "read", concurrencySafe: true }, async (args, ctx) => ({ text: "..." }));
 *     await provider.start();   // opens the stream and registers every declared tool
 *     await provider.closed;    // serve until the registry or the caller ends it
 *
 * The stream's lifetime owns the tools: closing it revokes them in the registry and fails their
 * in-flight calls. Handlers run concurrently; a cancellation from the registry aborts the
 * handler's `ctx.signal` and its eventual result is dropped (the registry settled the call).
 */
import { status as GrpcStatus, type ClientDuplexStream, type ServiceError } from "@grpc/grpc-js";
import { CodemodeError } from "./errors";
import type { ConnectRequest, ConnectResponse, Invocation, RegistrationAck } from "./gen/codemode/registry/v1/registry_service";
import { Concurrency, type Tool, type ToolResult } from "./gen/codemode/registry/v1/tool";
import { parseJson, stringifyJson, type JsonValue } from "./json";
import type { RegistryClient } from "./registry";

/** Throw from a tool handler to fail the call with a stable code. */
export class ToolFailed extends Error {
  constructor(
    message: string,
    readonly code: string = "",
  ) {
    super(message);
    this.name = "ToolFailed";
  }
}

export interface ToolDefinition {
  name: string;
  description?: string;
  /** Input JSON Schema (default `{"type":"object"}`). */
  inputSchema?: JsonValue;
  /** Output JSON Schema: results are validated against it and the SDK is typed from it. */
  outputSchema?: JsonValue;
  /** Calls may overlap with other concurrency-safe calls; otherwise each runs alone. */
  concurrencySafe?: boolean;
  /** System-prompt guidance, the `tool:<name>` section (native/both modes). */
  guidance?: string;
  /** Empty (global, the default), `presets/{id}` or `agents/{id}`. */
  scope?: string;
}

export interface InvocationContext {
  invocationId: string;
  /** `<call_id>:code:<n>` for calls made from a run_code program. */
  callId: string;
  /** The model's call id. */
  rootCallId: string;
  /** `agents/{id}`, or empty. */
  agent: string;
  toolName: string;
  /** Time the caller had left when the invocation was sent (ms); undefined: no deadline. */
  timeoutMs: number | undefined;
  /** `Date.now()`-based deadline; undefined: none. */
  deadline: number | undefined;
  /** W3C trace context of the span that made the invocation. */
  traceparent: string;
  tracestate: string;
  /** Aborted when the registry cancels the invocation, at the deadline, or when the stream ends. */
  signal: AbortSignal;
}

/** A tool body: receives the arguments (lossless JSON) and returns a JSON value (`undefined` → null). */
export type ToolHandler<A = any> = (args: A, ctx: InvocationContext) => unknown;

interface Declared {
  tool: Tool;
  handler: ToolHandler;
  scope: string;
}

export interface ToolProviderOptions {
  /** Bound on the stream handshake and each registration round trip in ms (default: the client's timeout). */
  timeoutMs?: number;
}

interface Running {
  controller: AbortController;
  cancelled: boolean;
}

export class ToolProvider {
  /** The registry-assigned id of this provider stream (after `start`). */
  providerId = "";
  /** Resolves when the stream ends: `undefined` after `close()` or a clean end, else the error. */
  readonly closed: Promise<CodemodeError | undefined>;

  private readonly declared: Declared[] = [];
  private readonly handlers = new Map<string, ToolHandler>();
  private readonly acks = new Map<string, { resolve: (a: RegistrationAck) => void; reject: (e: unknown) => void }>();
  private readonly running = new Map<string, Running>();
  private readonly timeoutMs: number;
  private call: ClientDuplexStream<ConnectRequest, ConnectResponse> | undefined;
  private opened: { resolve: (id: string) => void; reject: (e: unknown) => void } | undefined;
  private ended = false;
  private closing = false;
  private nextId = 1;
  private resolveClosed!: (e: CodemodeError | undefined) => void;

  constructor(
    private readonly client: RegistryClient,
    readonly name: string,
    options: ToolProviderOptions = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? client.timeoutMs;
    this.closed = new Promise((resolve) => (this.resolveClosed = resolve));
  }

  /** Declares a tool; it is registered by `start()`. Returns the provider for chaining. */
  tool<A = any>(definition: ToolDefinition, handler: ToolHandler<A>): this {
    if (this.call !== undefined) throw new Error("the provider is started: use register() to add tools");
    this.declared.push({ tool: toTool(definition), handler, scope: definition.scope ?? "" });
    return this;
  }

  /** Opens the stream and registers every declared tool (one atomic registration per scope). */
  async start(): Promise<void> {
    if (this.call !== undefined) throw new Error("the provider is already started");
    const call = this.client.stub.connect(this.client.metadata());
    this.call = call;
    call.on("data", (message: ConnectResponse) => this.onMessage(message));
    call.on("error", (e: ServiceError) => this.finish(CodemodeError.from(e)));
    call.on("end", () => this.finish(undefined));
    const opened = new Promise<string>((resolve, reject) => (this.opened = { resolve, reject }));
    this.write({ message: { $case: "open", value: { providerName: this.name } } });
    try {
      this.providerId = await this.bounded(opened, "opening the provider stream");
      const byScope = new Map<string, Declared[]>();
      for (const d of this.declared) byScope.set(d.scope, [...(byScope.get(d.scope) ?? []), d]);
      for (const [scope, tools] of byScope) await this.registerDeclared(scope, tools);
    } catch (e) {
      await this.close();
      throw e;
    }
  }

  /** Registers more tools on the open stream, atomically (all or none). */
  async register(tools: { definition: ToolDefinition; handler: ToolHandler }[], scope = ""): Promise<void> {
    await this.registerDeclared(
      scope,
      tools.map((t) => ({ tool: toTool(t.definition), handler: t.handler, scope })),
    );
  }

  /** Ends the stream: the registry revokes this provider's tools; running handlers are aborted. */
  async close(): Promise<void> {
    this.closing = true;
    if (this.call !== undefined && !this.ended) {
      this.call.end();
      this.call.cancel();
    } else if (this.call === undefined) {
      this.finish(undefined);
    }
    await this.closed;
  }

  private async registerDeclared(scope: string, tools: Declared[]): Promise<void> {
    if (this.call === undefined || this.ended) {
      throw new CodemodeError(GrpcStatus.FAILED_PRECONDITION, "the provider stream is not open");
    }
    const requestId = `reg-${this.nextId++}`;
    const ack = new Promise<RegistrationAck>((resolve, reject) => this.acks.set(requestId, { resolve, reject }));
    this.write({ message: { $case: "register", value: { requestId, scope, tools: tools.map((t) => t.tool) } } });
    const answer = await this.bounded(ack, "registering tools", () => this.acks.delete(requestId));
    if (answer.status !== undefined && answer.status.code !== 0) throw CodemodeError.fromStatus(answer.status);
    for (const t of tools) this.handlers.set(t.tool.name, t.handler);
  }

  private bounded<T>(promise: Promise<T>, what: string, onTimeout?: () => void): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        onTimeout?.();
        reject(new CodemodeError(GrpcStatus.DEADLINE_EXCEEDED, `${what} took longer than ${this.timeoutMs} ms`));
      }, this.timeoutMs);
      promise.then(
        (v) => (clearTimeout(timer), resolve(v)),
        (e) => (clearTimeout(timer), reject(e)),
      );
    });
  }

  private write(message: ConnectRequest): void {
    if (this.call === undefined || this.ended) return;
    this.call.write(message);
  }

  private onMessage(message: ConnectResponse): void {
    const m = message.message;
    switch (m?.$case) {
      case "opened":
        this.opened?.resolve(m.value.providerId);
        this.opened = undefined;
        break;
      case "registered": {
        const waiter = this.acks.get(m.value.requestId);
        this.acks.delete(m.value.requestId);
        waiter?.resolve(m.value);
        break;
      }
      case "invocation":
        this.serve(m.value);
        break;
      case "cancelled": {
        const running = this.running.get(m.value.invocationId);
        if (running !== undefined) {
          running.cancelled = true;
          running.controller.abort(new CodemodeError(GrpcStatus.CANCELLED, m.value.reason || "invocation cancelled"));
        }
        break;
      }
      default:
        break; // a newer registry's message: ignore
    }
  }

  private finish(error: CodemodeError | undefined): void {
    if (this.ended) return;
    this.ended = true;
    const final = this.closing && (error === undefined || error.code === GrpcStatus.CANCELLED) ? undefined : error;
    const ended = final ?? new CodemodeError(GrpcStatus.UNAVAILABLE, "the provider stream ended");
    this.opened?.reject(ended);
    this.opened = undefined;
    for (const waiter of this.acks.values()) waiter.reject(ended);
    this.acks.clear();
    for (const running of this.running.values()) running.controller.abort(ended);
    this.resolveClosed(final);
  }

  private serve(invocation: Invocation): void {
    const controller = new AbortController();
    const running: Running = { controller, cancelled: false };
    this.running.set(invocation.invocationId, running);
    let timeoutMs: number | undefined;
    let timer: NodeJS.Timeout | undefined;
    if (invocation.timeout !== undefined) {
      timeoutMs = Number(invocation.timeout.seconds) * 1000 + invocation.timeout.nanos / 1e6;
      timer = setTimeout(
        () => controller.abort(new CodemodeError(GrpcStatus.DEADLINE_EXCEEDED, "the invocation's deadline passed")),
        timeoutMs,
      );
      timer.unref();
    }
    const ctx: InvocationContext = {
      invocationId: invocation.invocationId,
      callId: invocation.callId,
      rootCallId: invocation.rootCallId,
      agent: invocation.agent,
      toolName: invocation.toolName,
      timeoutMs,
      deadline: timeoutMs === undefined ? undefined : Date.now() + timeoutMs,
      traceparent: invocation.traceContext?.traceparent ?? "",
      tracestate: invocation.traceContext?.tracestate ?? "",
      signal: controller.signal,
    };
    void (async () => {
      let result: ToolResult;
      try {
        const handler = this.handlers.get(invocation.toolName);
        if (handler === undefined) throw new ToolFailed(`provider "${this.name}" has no tool "${invocation.toolName}"`);
        const value = await handler(parseJson(invocation.argumentsJson || "{}"), ctx);
        let valueJson: string;
        try {
          valueJson = stringifyJson(value === undefined ? null : value);
        } catch (e) {
          throw new ToolFailed(`tool "${invocation.toolName}" returned a value that is not JSON: ${(e as Error).message}`, "INVALID_TOOL_OUTPUT");
        }
        result = { content: [], valueJson, isError: false, error: undefined, additionalContexts: [], concludesTurn: false };
      } catch (e) {
        result = errorResult(e);
      } finally {
        clearTimeout(timer);
        this.running.delete(invocation.invocationId);
      }
      if (running.cancelled) return; // the registry already settled the call
      this.write({ message: { $case: "result", value: { invocationId: invocation.invocationId, result } } });
    })();
  }
}

function toTool(d: ToolDefinition): Tool {
  return {
    name: d.name,
    description: d.description ?? "",
    inputSchemaJson: d.inputSchema === undefined ? "" : stringifyJson(d.inputSchema),
    outputSchemaJson: d.outputSchema === undefined ? "" : stringifyJson(d.outputSchema),
    concurrency: d.concurrencySafe ? Concurrency.CONCURRENCY_SAFE : Concurrency.CONCURRENCY_EXCLUSIVE,
    guidance: d.guidance ?? "",
    owner: "",
    scope: "",
  };
}

function errorResult(e: unknown): ToolResult {
  let message: string;
  let code = "";
  let name = "";
  if (e instanceof ToolFailed) {
    message = e.message;
    code = e.code;
  } else if (e instanceof Error) {
    message = e.message || e.name;
    name = e.name;
  } else {
    message = String(e);
  }
  return {
    content: [{ block: { $case: "text", value: { text: `Error: ${message}` } } }],
    valueJson: undefined,
    isError: true,
    error: { message, code, name },
    additionalContexts: [],
    concludesTurn: false,
  };
}
