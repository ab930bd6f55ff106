/**
 * Serve tools from plain async functions over the registry's `Connect` stream.
 *
 *     const provider = new ToolProvider(client, "files");
 *     provider.tool({ name: "read", concurrencySafe: true }, async (args, ctx) => ({ text: "..." }));
 *     await provider.start();   // opens the stream and registers every declared tool
 *     await provider.closed;    // serve until the registry or the caller ends it
 *
 *     await provider.serve();   // or: serve until close(), opening the stream again (and
 *                               // registering the tools again) whenever it is lost
 *
 * The stream's lifetime owns the tools: closing it revokes them in the registry and fails their
 * in-flight calls. Handlers run concurrently; a cancellation from the registry aborts the
 * handler's `ctx.signal` and its eventual result is dropped (the registry settled the call).
 *
 * A handler returns a JSON value, or a `ToolOutput` for content blocks (text, images, JSON),
 * additional contexts or concluding the model's turn; it throws `ToolError` (alias `ToolFailed`)
 * to fail the call with its own message and code. Anything else it throws reaches the model only
 * as "tool 'x' failed unexpectedly (error id …)": its text may hold anything (a password, a
 * path), so the provider logs it with its stack under that id (`options.logger`, default the
 * console). An output that cannot be sent fails the call with `INVALID_TOOL_OUTPUT`, as the
 * registry fails an in-process tool's.
 *
 * `tool()` checks the handler at once (a function of at most two parameters, `(args, ctx)`; not a
 * generator) and throws a TypeError naming the tool otherwise. With a zod `inputSchema` the
 * arguments are parsed by it before the handler runs (defaults, refinements and transforms
 * included): what it refuses fails the call with `INVALID_ARGS` naming each field's path.
 *
 * `start()` with no registry at the client's address rejects with a `CodemodeError`
 * (UNAVAILABLE) naming the address; `serve()` waits for one and logs each lost stream and return.
 */
import { status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";
import { randomBytes } from "node:crypto";
import { CodemodeError } from "./errors";
import type { ConnectRequest, ConnectResponse, Invocation, RegistrationAck } from "./gen/codemode/registry/v1/registry_service";
import { Concurrency, type AdditionalContext, type ContentBlock, type Tool, type ToolResult } from "./gen/codemode/registry/v1/tool";
import { parseJson, stringifyJson, type JsonValue } from "./json";
import { deferred, DuplexStream, Reconnector, type ServeOptions } from "./reconnect";
import type { RegistryClient } from "./registry";
import { isZodSchema, parseWithZod, toJsonSchema, type ZodInput, type ZodIssue, type ZodSchemaLike } from "./zod-schema";

/**
 * Throw from a tool handler to fail the call with this message and a stable code: the model sees
 * exactly this text (anything else thrown reaches it only as a generic message with an error id).
 */
export class ToolError extends Error {
  /** Still added to the conversation: a failure may explain itself too. */
  readonly additionalContexts: readonly OutputContext[];

  constructor(
    message: string,
    readonly code: string = "",
    options: { additionalContexts?: readonly OutputContext[] } = {},
  ) {
    super(message);
    this.name = "ToolError";
    this.additionalContexts = options.additionalContexts ?? [];
  }
}

/** The earlier name of `ToolError`: the same class. */
export const ToolFailed = ToolError;
export type ToolFailed = ToolError;

/** One block of tool-result content, as a handler writes it. */
export type OutputBlock =
  | { type: "text"; text: string }
  /** Raw image bytes and their IANA media type, e.g. `image/png`. */
  | { type: "image"; data: Uint8Array; mimeType: string }
  /** A JSON document, sent as lossless JSON text. */
  | { type: "json"; value: JsonValue };

/** A message to add to the conversation after the tool result. */
export interface OutputContext {
  content: readonly OutputBlock[];
  /** Who produced the context (free text, e.g. a plugin name). */
  source?: string;
}

export interface ToolOutputInit {
  /**
   * The call's JSON value: what a `run_code` program's `await tools.x(...)` gets, checked against
   * the output schema. Omitted: the result is content only (no schema check; a program gets
   * null). `null` is a value.
   */
  value?: JsonValue;
  /** What the model is shown. Omitted: the registry renders `value` as pretty JSON. */
  content?: readonly OutputBlock[];
  /** Messages added to the conversation after the result. */
  additionalContexts?: readonly OutputContext[];
  /** Asks the agent loop to end the model's turn after this result. */
  concludesTurn?: boolean;
}

/**
 * What a handler may return instead of a plain JSON value: content blocks for the model, extra
 * contexts, a request to conclude the turn. A class (not a plain object) so that a handler's
 * JSON value shaped like `{ content: [...] }` still means that value.
 *
 *     return new ToolOutput({
 *       value: { width: 640, height: 480 },
 *       content: [{ type: "text", text: "The page:" }, { type: "image", data: png, mimeType: "image/png" }],
 *       concludesTurn: true,
 *     });
 *
 * When a call from a `run_code` program succeeds with an image in its content, that whole
 * content is forwarded to the conversation (the program itself gets only the value).
 */
export class ToolOutput {
  readonly value: JsonValue | undefined;
  readonly content: readonly OutputBlock[];
  readonly additionalContexts: readonly OutputContext[];
  readonly concludesTurn: boolean;

  constructor(init: ToolOutputInit = {}) {
    this.value = init.value;
    this.content = init.content ?? [];
    this.additionalContexts = init.additionalContexts ?? [];
    this.concludesTurn = init.concludesTurn ?? false;
  }
}

export interface ToolDefinition {
  name: string;
  description?: string;
  /**
   * Input JSON Schema (default `{"type":"object"}`), or a zod 4 schema (converted with zod's
   * `toJSONSchema`, input side; a handler's arguments are then typed from it).
   */
  inputSchema?: JsonValue | ZodSchemaLike;
  /**
   * Output JSON Schema, or a zod 4 schema (output side): results are validated against it and
   * the SDK is typed from it.
   */
  outputSchema?: JsonValue | ZodSchemaLike;
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

/** A tool body: receives the arguments (lossless JSON) and returns a JSON value (`undefined` → null) or a `ToolOutput`. */
export type ToolHandler<A = any> = (args: A, ctx: InvocationContext) => unknown;

interface Declared {
  tool: Tool;
  handler: Prepared;
  scope: string;
}

/** A handler as the provider calls it: its arguments parsed first when a zod schema declares them. */
type Prepared = (args: unknown, ctx: InvocationContext) => Promise<unknown>;

export interface ToolProviderOptions {
  /** Bound on the stream handshake and each registration round trip in ms (default: the client's timeout). */
  timeoutMs?: number;
  /**
   * Where the provider reports a handler's unexpected error (with its error id) and each lost
   * stream and return under `serve()` (default: the console).
   */
  logger?: ProviderLogger;
}

export interface ProviderLogger {
  error(message: string, error: unknown): void;
  warn(message: string): void;
}

const CONSOLE_LOGGER: ProviderLogger = {
  error: (message, error) => console.error(message, error),
  warn: (message) => console.warn(message),
};

/** The registry's code for arguments a schema refuses. */
const INVALID_ARGS = "INVALID_ARGS";
/** Validation problems named in one message; the rest are counted. */
const SHOWN_ISSUES = 10;

interface Running {
  controller: AbortController;
  cancelled: boolean;
}

/** One `Connect` stream and what lives and dies with it: handshake, acks, running handlers. */
class Stream extends DuplexStream<ConnectRequest, ConnectResponse> {
  readonly acks = new Map<string, { resolve: (a: RegistrationAck) => void; reject: (e: unknown) => void }>();
  readonly running = new Map<string, Running>();
}

/** A registration the registry refused: `serve()` ends with it instead of retrying. */
class Refused {
  constructor(readonly error: CodemodeError) {}
}

export class ToolProvider {
  /** The registry-assigned id of the current (or last) provider stream. */
  providerId = "";

  private readonly declared: Declared[] = [];
  private readonly handlers = new Map<string, Prepared>();
  private readonly logger: ProviderLogger;
  private readonly timeoutMs: number;
  /** The current or last stream. */
  private stream: Stream | undefined;
  /** The end of the current or last stream, or of the next one when none was opened yet. */
  private ends = deferred<CodemodeError | undefined>();
  private serving: Reconnector | undefined;
  private started = false;
  private nextId = 1;

  /**
   * `client` undefined: the provider only declares tools, served per registry replica through
   * `onClient` (see `ReplicaSet`).
   */
  constructor(
    private readonly client: RegistryClient | undefined,
    readonly name: string,
    private readonly options: ToolProviderOptions = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? client?.timeoutMs ?? 30_000;
    this.logger = options.logger ?? CONSOLE_LOGGER;
  }

  /**
   * A provider with this one's name, options and declared tools on `client`: one per registry
   * replica (`new ReplicaSet(target, (c) => provider.onClient(c))`).
   */
  onClient(client: RegistryClient): ToolProvider {
    const copy = new ToolProvider(client, this.name, this.options);
    copy.declared.push(...this.declared);
    return copy;
  }

  /**
   * Resolves when the current (or last) stream ends: `undefined` after `close()` or a clean end,
   * else the error. Before the first stream, the promise of the first stream's end.
   */
  get closed(): Promise<CodemodeError | undefined> {
    return this.ends.promise;
  }

  /**
   * Declares a tool; it is registered by `start()`. Returns the provider for chaining. With a zod
   * `inputSchema` the handler's arguments are typed from it.
   */
  tool<S extends ZodSchemaLike>(definition: ToolDefinition & { inputSchema: S }, handler: ToolHandler<ZodInput<S>>): this;
  tool<A = any>(definition: ToolDefinition, handler: ToolHandler<A>): this;
  tool(definition: ToolDefinition, handler: ToolHandler): this {
    if (this.started) throw new Error("the provider is started: use register() to add tools");
    this.declared.push(declare(definition, handler));
    return this;
  }

  /**
   * Opens the stream and registers every declared tool (one atomic registration per scope).
   * Fails at once with UNAVAILABLE when no registry is reachable; `serve()` waits for one.
   */
  async start(): Promise<void> {
    if (this.serving !== undefined) throw new Error("the provider is serving: serve() opens its streams");
    if (this.stream !== undefined && !this.stream.ended) throw new Error("the provider is already started");
    try {
      await this.open(false);
    } catch (e) {
      if (e instanceof Refused) throw e.error;
      throw e instanceof CodemodeError && e.code === GrpcStatus.UNAVAILABLE ? this.unreachable(e) : e;
    }
  }

  /** No registry answered: our error, naming the provider and the address. */
  private unreachable(e: CodemodeError): CodemodeError {
    const target = this.client?.stub.getChannel().getTarget().replace(/^dns:(\/\/\/)?/, "") ?? "";
    const at = target === "" ? "" : ` at ${target}`;
    const message = `tool provider '${this.name}': no registry reachable${at} (${e.message}); serve() waits for one`;
    const info = { reason: e.reason, domain: e.domain, metadata: { ...e.metadata }, retryDelay: e.retryDelay };
    return new CodemodeError(e.code, message, info, e.grpcMetadata, { cause: e });
  }

  /**
   * Serves the tools until `close()`, across registry restarts and shutdowns: whenever the stream
   * is lost (UNAVAILABLE when a registry shuts down, a broken connection, no registry up yet) it is
   * opened again as soon as a registry is reachable, and the tools are registered again (those
   * declared with `tool()` and those added by `register()`). Handlers of calls on a lost stream are
   * aborted: their results have nowhere to go. Resolves after `close()`; rejects when a registry
   * refuses the tools (e.g. `TOOL_ALREADY_REGISTERED`) or the stream fails with a code no retry
   * fixes (`UNAUTHENTICATED`, `PERMISSION_DENIED`, `INVALID_ARGUMENT`, `UNIMPLEMENTED`).
   */
  async serve(options: ServeOptions = {}): Promise<void> {
    if (this.serving !== undefined) throw new Error("the provider is already serving");
    if (this.stream !== undefined && !this.stream.ended) throw new Error("the provider is already started");
    let served = false;
    const run: Reconnector = new Reconnector(
      () =>
        this.open(true).then((stream) => {
          if (served) this.logger.warn(`tool provider '${this.name}': reconnected, tools registered again`);
          served = true;
          const ended = stream.done.promise.then((lost) => {
            if (this.serving === run && !stream.closing) {
              const why = lost === undefined ? "closed by the registry" : `${lost.codeName}: ${lost.message}`;
              this.logger.warn(`tool provider '${this.name}': the stream to the registry ended (${why}); reconnecting`);
            }
            return lost;
          });
          return { ended };
        }),
      options.maxDelayMs ?? 10_000,
      (e) => (e instanceof Refused ? e.error : undefined),
      () => {
        if (this.serving === run) this.serving = undefined;
      },
    );
    this.serving = run;
    return run.done;
  }

  /** Registers more tools on the open stream, atomically (all or none); `serve()` keeps them. */
  async register(tools: { definition: ToolDefinition; handler: ToolHandler }[], scope = ""): Promise<void> {
    const stream = this.stream;
    const added = tools.map((t) => declare({ ...t.definition, scope }, t.handler));
    try {
      await this.registerOn(stream, scope, added);
    } catch (e) {
      throw e instanceof Refused ? e.error : e;
    }
    this.declared.push(...added); // registered again on the streams serve() opens next
  }

  /**
   * Ends the stream (the registry revokes this provider's tools; running handlers are aborted)
   * and `serve()`, which has resolved by the time this does.
   */
  async close(): Promise<void> {
    const run = this.serving;
    run?.stop();
    if (this.stream !== undefined) await this.closeStream(this.stream);
    else this.ends.settle(undefined);
    await run?.done.catch(() => undefined);
  }

  /** Opens a stream and registers the declared tools on it; closes it again if that fails. */
  private async open(waitForReady: boolean): Promise<Stream> {
    this.started = true;
    // Tools that register() adds to this stream from now on are not registered twice.
    const byScope = new Map<string, Declared[]>();
    for (const d of this.declared) byScope.set(d.scope, [...(byScope.get(d.scope) ?? []), d]);
    const client = this.client;
    if (client === undefined) {
      throw new Error("this provider has no client: serve it per replica with onClient(client)");
    }
    const metadata = client.metadata();
    if (waitForReady) metadata.setOptions({ waitForReady: true });
    if (this.ends.settled) this.ends = deferred();
    const stream = new Stream(client.stub.connect(metadata), this.ends);
    this.stream = stream;
    stream.call.on("data", (message: ConnectResponse) => this.onMessage(stream, message));
    stream.call.on("error", (e: ServiceError) => this.finish(stream, CodemodeError.from(e)));
    stream.call.on("end", () => this.finish(stream, undefined));
    const opened = new Promise<string>((resolve, reject) => (stream.opened = { resolve, reject }));
    const maxReceiveMessageBytes = BigInt(client.maxReceiveMessageBytes);
    stream.write({ message: { $case: "open", value: { providerName: this.name, maxReceiveMessageBytes } } });
    try {
      this.providerId = await this.bounded(opened, "opening the provider stream");
      for (const [scope, tools] of byScope) await this.registerOn(stream, scope, tools);
    } catch (e) {
      await this.closeStream(stream);
      throw e;
    }
    return stream;
  }

  private async closeStream(stream: Stream): Promise<void> {
    stream.closing = true;
    if (!stream.ended) {
      stream.call.end();
      stream.call.cancel();
    }
    await stream.done.promise;
  }

  /** Throws `Refused` when the registry refuses the tools, anything else when the stream fails. */
  private async registerOn(stream: Stream | undefined, scope: string, tools: Declared[]): Promise<void> {
    if (stream === undefined || stream.ended) {
      throw new CodemodeError(GrpcStatus.FAILED_PRECONDITION, "the provider stream is not open");
    }
    const requestId = `reg-${this.nextId++}`;
    const ack = new Promise<RegistrationAck>((resolve, reject) => stream.acks.set(requestId, { resolve, reject }));
    stream.write({ message: { $case: "register", value: { requestId, scope, tools: tools.map((t) => t.tool) } } });
    const answer = await this.bounded(ack, "registering tools", () => stream.acks.delete(requestId));
    if (answer.status !== undefined && answer.status.code !== 0) throw new Refused(CodemodeError.fromStatus(answer.status));
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

  private onMessage(stream: Stream, message: ConnectResponse): void {
    const m = message.message;
    switch (m?.$case) {
      case "opened":
        stream.opened?.resolve(m.value.providerId);
        stream.opened = undefined;
        break;
      case "registered": {
        const waiter = stream.acks.get(m.value.requestId);
        stream.acks.delete(m.value.requestId);
        waiter?.resolve(m.value);
        break;
      }
      case "invocation":
        this.invoke(stream, m.value);
        break;
      case "cancelled": {
        const running = stream.running.get(m.value.invocationId);
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

  private finish(stream: Stream, error: CodemodeError | undefined): void {
    if (stream.ended) return;
    stream.ended = true;
    const final = stream.closing && (error === undefined || error.code === GrpcStatus.CANCELLED) ? undefined : error;
    const ended = final ?? new CodemodeError(GrpcStatus.UNAVAILABLE, "the provider stream ended");
    stream.opened?.reject(ended);
    stream.opened = undefined;
    for (const waiter of stream.acks.values()) waiter.reject(ended);
    stream.acks.clear();
    // The registry has failed these invocations already: their results have nowhere to go.
    for (const running of stream.running.values()) running.controller.abort(ended);
    stream.done.settle(final);
  }

  private invoke(stream: Stream, invocation: Invocation): void {
    const controller = new AbortController();
    const running: Running = { controller, cancelled: false };
    stream.running.set(invocation.invocationId, running);
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
        if (handler === undefined) throw new ToolError(`provider "${this.name}" has no tool "${invocation.toolName}"`);
        const returned = await handler(parseJson(invocation.argumentsJson || "{}"), ctx);
        result = outputResult(invocation.toolName, returned);
      } catch (e) {
        result = e instanceof ToolError ? errorResult(invocation.toolName, e) : this.unexpected(invocation, e);
      } finally {
        clearTimeout(timer);
        stream.running.delete(invocation.invocationId);
      }
      if (running.cancelled) return; // the registry already settled the call
      stream.write({ message: { $case: "result", value: { invocationId: invocation.invocationId, result } } });
    })();
  }

  /**
   * Anything thrown but a `ToolError`: its text may hold anything (a password in a connection
   * string, a path), so it stays in the provider's log and the model gets an id to find it by.
   */
  private unexpected(invocation: Invocation, e: unknown): ToolResult {
    const id = randomBytes(6).toString("hex");
    const tool = invocation.toolName;
    this.logger.error(`tool '${tool}' failed unexpectedly (error id ${id}, call ${invocation.callId})`, e);
    return failure(`tool '${tool}' failed unexpectedly (error id ${id}); the provider logged the details`, "", "", []);
  }
}

/** A tool's message and its handler as the provider calls it; throws a TypeError for what cannot serve. */
function declare(definition: ToolDefinition, handler: ToolHandler): Declared {
  if (typeof definition !== "object" || definition === null || typeof definition.name !== "string" || definition.name === "") {
    throw new TypeError("tool(): the definition needs a name (a non-empty string)");
  }
  const where = `tool '${definition.name}'`;
  if (typeof handler !== "function") throw new TypeError(`${where}: the handler is not a function`);
  const kind = Object.prototype.toString.call(handler);
  if (kind === "[object AsyncGeneratorFunction]" || kind === "[object GeneratorFunction]") {
    throw new TypeError(`${where}: the handler is a generator; a tool returns one value`);
  }
  if (handler.length > 2) {
    throw new TypeError(`${where}: the handler declares ${handler.length} parameters; a handler takes (args, ctx), (args) or ()`);
  }
  const tool = toTool(definition);
  const schema = definition.inputSchema;
  let prepared: Prepared = async (args, ctx) => handler(args, ctx);
  if (isZodSchema(schema)) {
    prepared = async (args, ctx) => {
      const parsed = await parseWithZod(schema, args, `${where} inputSchema`);
      if (!parsed.ok) throw new ToolError(invalidArgs(parsed.issues), INVALID_ARGS);
      return handler(parsed.value, ctx);
    };
  }
  return { tool, handler: prepared, scope: definition.scope ?? "" };
}

/** The registry's wording for arguments its schema refuses: each field's quoted path, then what is wrong. */
function invalidArgs(issues: readonly ZodIssue[]): string {
  const shown = issues.slice(0, SHOWN_ISSUES).map((issue) => `${issuePath(issue.path)}: ${issue.message}`);
  if (issues.length > SHOWN_ISSUES) shown.push(`and ${issues.length - SHOWN_ISSUES} more`);
  return `invalid arguments: ${shown.join("; ")}`;
}

function issuePath(path: readonly PropertyKey[]): string {
  if (path.length === 0) return "arguments";
  let text = "";
  for (const key of path) {
    if (typeof key === "number") text += `[${key}]`;
    else text += text === "" ? String(key) : `.${String(key)}`;
  }
  return `"${text}"`;
}

function toTool(d: ToolDefinition): Tool {
  return {
    name: d.name,
    description: d.description ?? "",
    inputSchemaJson: d.inputSchema === undefined ? "" : stringifyJson(toJsonSchema(d.inputSchema, "input", `tool "${d.name}" inputSchema`)),
    outputSchemaJson:
      d.outputSchema === undefined ? "" : stringifyJson(toJsonSchema(d.outputSchema, "output", `tool "${d.name}" outputSchema`)),
    concurrency: d.concurrencySafe ? Concurrency.CONCURRENCY_SAFE : Concurrency.CONCURRENCY_EXCLUSIVE,
    guidance: d.guidance ?? "",
    owner: "",
    scope: "",
  };
}

/** A handler's return as a successful result; an output that cannot be sent as INVALID_TOOL_OUTPUT. */
function outputResult(tool: string, returned: unknown): ToolResult {
  try {
    if (!(returned instanceof ToolOutput)) {
      return { ...EMPTY_SUCCESS, valueJson: valueJson(returned === undefined ? null : returned) };
    }
    if (typeof returned.concludesTurn !== "boolean") throw new TypeError("concludesTurn is not a boolean");
    return {
      ...EMPTY_SUCCESS,
      content: returned.content.map((b, i) => toBlock(b, `content[${i}]`)),
      valueJson: returned.value === undefined ? undefined : valueJson(returned.value),
      additionalContexts: toContexts(returned.additionalContexts),
      concludesTurn: returned.concludesTurn,
    };
  } catch (e) {
    return invalidOutput(tool, e);
  }
}

const EMPTY_SUCCESS: ToolResult = {
  content: [],
  valueJson: undefined,
  isError: false,
  error: undefined,
  additionalContexts: [],
  concludesTurn: false,
  sharedLogs: [],
  sharedResult: false,
};

function valueJson(value: unknown): string {
  try {
    return stringifyJson(value);
  } catch (e) {
    // The registry's wording for an in-process tool's output.
    throw new Error(`output is not lossless JSON: ${(e as Error).message}`);
  }
}

function toBlock(block: OutputBlock, where: string): ContentBlock {
  switch (block?.type) {
    case "text":
      if (typeof block.text !== "string") throw new TypeError(`${where}.text is not a string`);
      return { block: { $case: "text", value: { text: block.text } } };
    case "image": {
      const data = block.data;
      if (!(data instanceof Uint8Array)) throw new TypeError(`${where}.data is not a Uint8Array`);
      if (typeof block.mimeType !== "string") throw new TypeError(`${where}.mimeType is not a string`);
      const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
      return { block: { $case: "image", value: { mimeType: block.mimeType, data: bytes } } };
    }
    case "json": {
      let json: string;
      try {
        json = stringifyJson(block.value);
      } catch (e) {
        throw new Error(`${where} is not lossless JSON: ${(e as Error).message}`);
      }
      return { block: { $case: "json", value: { json } } };
    }
    default:
      throw new TypeError(`${where} is not a text, image or json block`);
  }
}

function toContexts(contexts: readonly OutputContext[]): AdditionalContext[] {
  return contexts.map((c, i) => {
    const where = `additionalContexts[${i}]`;
    if (c === null || typeof c !== "object" || !Array.isArray(c.content)) {
      throw new TypeError(`${where} is not { content: [...], source? }`);
    }
    return {
      content: c.content.map((b, j) => toBlock(b, `${where}.content[${j}]`)),
      source: c.source ?? "",
    };
  });
}

function invalidOutput(tool: string, e: unknown): ToolResult {
  // The registry's code, name and wording for an in-process tool's bad output: the caller sees
  // the same failure wherever the tool lives.
  const message = `tool "${tool}" returned invalid output: ${e instanceof Error ? e.message : String(e)}`;
  return failure(message, "INVALID_TOOL_OUTPUT", "ToolOutputError", []);
}

function errorResult(tool: string, e: ToolError): ToolResult {
  let contexts: AdditionalContext[];
  try {
    contexts = toContexts(e.additionalContexts);
  } catch (bad) {
    return invalidOutput(tool, bad);
  }
  return failure(e.message, e.code, "", contexts);
}

function failure(message: string, code: string, name: string, contexts: AdditionalContext[]): ToolResult {
  return {
    content: [{ block: { $case: "text", value: { text: `Error: ${message}` } } }],
    valueJson: undefined,
    isError: true,
    error: { message, code, name },
    additionalContexts: contexts,
    concludesTurn: false,
    sharedLogs: [],
    sharedResult: false,
  };
}
