/**
 * A Cordis page runner over the registry's `PageRunnerService.Attach` stream: the page side of
 * client-bearing plugins (docs/cordis.md).
 *
 *     const page = await PageRunner.attach(client, "agents/coder");
 *     for await (const event of page.events()) {
 *       if (event.type !== "run-requested") continue;
 *       const started = await page.runHostHalf(event.request);           // approves it
 *       if (!started.accepted) { await page.settle(event.request.requestId, "", "host-half-failed", { message: started.message }); continue; }
 *       const code = await page.clientCode(event.request.pluginId, started.pluginRunId);
 *       // … evaluate code.clientCode!.code in the page …
 *       await page.settle(event.request.requestId, started.pluginRunId);  // success
 *     }
 *
 * Requests carry their metadata and the package's source for the person to review (`source`,
 * shown, never evaluated); the Client half to evaluate comes from `clientCode`, and only for
 * the exact active run. Every verb resolves with the registry's answer; `accepted: false` means
 * the message was refused (unknown, duplicate or stale) and changed nothing.
 */
import { credentials as grpcCredentials, status as GrpcStatus, type ClientDuplexStream, type ServiceError } from "@grpc/grpc-js";
import { CodemodeError } from "./errors";
import {
  PageRunnerServiceClient,
  SettleOutcome,
  type AttachRequest,
  type AttachResponse,
  type PageReply,
} from "./gen/codemode/registry/v1/page_runner";
import { parseJson, stringifyJson, type JsonValue } from "./json";
import { AsyncQueue } from "./queue";
import type { RegistryClient } from "./registry";

/** A package's code as the person reviews it before approving; each half cut at 65,536 characters. */
export interface ReviewSource {
  host: string;
  client: string;
  /** A half was cut: the package cannot be reviewed whole (do not offer to approve it). */
  truncated: boolean;
}

/** An activation request waiting for a page. */
export interface RunRequest {
  requestId: string;
  agent: string;
  pluginId: string;
  packageId: string;
  pluginRunId: string;
  mode: string;
  name: string;
  purpose: string;
  /** True unless a grant applies: ask the person. */
  requiresApproval: boolean;
  hasHostHalf: boolean;
  source: ReviewSource;
}

/** A client inspect query for this page to answer. */
export interface InspectQuery {
  queryId: string;
  agent: string;
  provider: string;
  method: string;
  input: JsonValue;
}

export type PageEvent =
  | { type: "run-requested"; request: RunRequest }
  /** `completed` (no approval was needed), `approved`, `rejected`, `failed` or `cancelled`. */
  | { type: "run-resolved"; requestId: string; outcome: string }
  | { type: "inspect-query"; query: InspectQuery }
  /** `answered` or `cancelled`. */
  | { type: "inspect-query-resolved"; queryId: string; outcome: string };

export interface ClientCode {
  code: string;
  name: string;
  pluginId: string;
  packageId: string;
  pluginRunId: string;
}

export interface PageAnswer {
  accepted: boolean;
  /** Why it was refused. */
  message: string;
  /** The refusal's kind (`request-unknown`, `stale-run`, `host-half-failed`, …). */
  code: string;
  /** `runHostHalf`: the run the Host half belongs to. */
  pluginRunId: string;
  /** `runHostHalf`: false when this page attached to an activation already started. */
  startedHere: boolean;
}

export type SettleOutcomeName = "success" | "rejected" | "host-half-failed" | "client-half-failed";

/** The reference's `invoke` result. */
export type InvokeResult =
  | { ok: true; value: JsonValue }
  | {
      ok: false;
      code: "plugin-not-running" | "stale-run" | "method-not-found" | "handler-error";
      message: string;
      stack?: string;
    };

/** One client inspect provider of the page's manifest. */
export interface InspectProvider {
  id: string;
  description: string;
  methods: { name: string; description: string; inputSchema: JsonValue; outputSchema: JsonValue }[];
}

export interface SettleOptions {
  message?: string;
  stack?: string;
  /** Services the Client half waits for (success only). */
  clientWaitingFor?: string[];
}

const OUTCOMES: Record<SettleOutcomeName, SettleOutcome> = {
  success: SettleOutcome.SETTLE_OUTCOME_SUCCESS,
  rejected: SettleOutcome.SETTLE_OUTCOME_REJECTED,
  "host-half-failed": SettleOutcome.SETTLE_OUTCOME_HOST_HALF_FAILED,
  "client-half-failed": SettleOutcome.SETTLE_OUTCOME_CLIENT_HALF_FAILED,
};

type Message = NonNullable<AttachRequest["message"]>;

export class PageRunner {
  /** The agent this page runs for, `agents/{id}` (after `attach`). */
  agent = "";
  /** Resolves when the stream ends: `undefined` after `close()`, else the error. */
  readonly closed: Promise<CodemodeError | undefined>;

  private readonly replies = new Map<bigint, { resolve: (r: PageReply) => void; reject: (e: unknown) => void }>();
  private readonly queue = new AsyncQueue<PageEvent>();
  private nextReply = 1n;
  private ended = false;
  private closing = false;
  private settleClosed!: (e: CodemodeError | undefined) => void;

  private constructor(
    readonly stub: PageRunnerServiceClient,
    private readonly call: ClientDuplexStream<AttachRequest, AttachResponse>,
  ) {
    this.closed = new Promise((resolve) => (this.settleClosed = resolve));
  }

  /** Attaches a page for `agent` (`agents/{id}` or the bare id); resolves once attached. */
  static async attach(
    client: RegistryClient,
    agent: string,
    options: { pageName?: string; timeoutMs?: number } = {},
  ): Promise<PageRunner> {
    // The page runner service shares the registry client's channel.
    const stub = new PageRunnerServiceClient("unused", grpcCredentials.createInsecure(), {
      channelOverride: client.stub.getChannel(),
    });
    const page = new PageRunner(stub, stub.attach(client.metadata()));
    const attached = new Promise<string>((resolve, reject) => {
      page.onAttached = resolve;
      page.onAttachFailed = reject;
    });
    page.call.on("data", (m: AttachResponse) => page.onMessage(m));
    page.call.on("error", (e: ServiceError) => page.finish(CodemodeError.from(e)));
    page.call.on("end", () => page.finish(undefined));
    page.call.write({ replyTo: 0n, message: { $case: "open", value: { agent, pageName: options.pageName ?? "page" } } });
    const timeoutMs = options.timeoutMs ?? client.timeoutMs;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new CodemodeError(GrpcStatus.DEADLINE_EXCEEDED, `attaching the page took longer than ${timeoutMs} ms`)),
        timeoutMs,
      );
    });
    try {
      page.agent = await Promise.race([attached, timeout]);
    } catch (e) {
      page.close();
      throw e;
    } finally {
      clearTimeout(timer);
    }
    return page;
  }

  private onAttached: ((agent: string) => void) | undefined;
  private onAttachFailed: ((e: unknown) => void) | undefined;

  /** The events (requests, resolutions, queries) in order; ends with the stream. */
  events(): AsyncIterableIterator<PageEvent> {
    return this.queue;
  }

  /** The next event of `type` (others are dropped); rejects when the stream ends first. */
  async nextEvent<T extends PageEvent["type"]>(type?: T): Promise<Extract<PageEvent, { type: T }>> {
    for (;;) {
      const next = await this.queue.next();
      if (next.done) throw new CodemodeError(GrpcStatus.UNAVAILABLE, "the page runner stream ended");
      if (type === undefined || next.value.type === type) return next.value as Extract<PageEvent, { type: T }>;
    }
  }

  /** Runs the Host half for a request, approving it (and future versions, when asked). */
  async runHostHalf(
    request: Pick<RunRequest, "requestId" | "pluginId" | "packageId" | "mode">,
    options: { approveFutureVersions?: boolean } = {},
  ): Promise<PageAnswer> {
    return answer(
      await this.ask({
        $case: "runHostHalf",
        value: { ...pick(request), approveFutureVersions: options.approveFutureVersions ?? false },
      }),
    );
  }

  /** A direct panel gesture: runs the Host half without a request (the click grants the package). */
  async panelRun(
    pluginId: string,
    packageId: string,
    mode = "run",
    options: { approveFutureVersions?: boolean } = {},
  ): Promise<PageAnswer> {
    return this.runHostHalf({ requestId: "", pluginId, packageId, mode }, options);
  }

  /** The Client half of the exact active run (`clientCode` is absent when refused). */
  async clientCode(pluginId: string, pluginRunId: string): Promise<PageAnswer & { clientCode?: ClientCode }> {
    const reply = await this.ask({ $case: "getClientCode", value: { pluginId, pluginRunId } });
    return { ...answer(reply), ...(reply.clientCode ? { clientCode: reply.clientCode } : {}) };
  }

  /** Settles a request; `pluginRunId` is required for success. */
  async settle(
    requestId: string,
    pluginRunId: string,
    outcome: SettleOutcomeName = "success",
    options: SettleOptions = {},
  ): Promise<PageAnswer> {
    return answer(await this.ask({ $case: "settle", value: settleRun(requestId, "", pluginRunId, outcome, options) }));
  }

  /** Settles a direct panel run. */
  async settlePanelRun(
    pluginId: string,
    pluginRunId: string,
    outcome: Exclude<SettleOutcomeName, "rejected"> = "success",
    options: SettleOptions = {},
  ): Promise<PageAnswer> {
    return answer(await this.ask({ $case: "settle", value: settleRun("", pluginId, pluginRunId, outcome, options) }));
  }

  /** Stops a plugin from the panel (the agent gets an `agent/inject` record). */
  async stop(pluginId: string): Promise<PageAnswer> {
    return answer(await this.ask({ $case: "stop", value: { pluginId } }));
  }

  /** Removes a plugin and all of its packages from the panel. */
  async remove(pluginId: string): Promise<PageAnswer> {
    return answer(await this.ask({ $case: "remove", value: { pluginId } }));
  }

  /** `invoke(pluginId, runId, method, args)`: calls a `harness.handle` handler of the Host half. */
  async invoke(pluginId: string, pluginRunId: string, method: string, args: JsonValue = null): Promise<InvokeResult> {
    const reply = await this.ask({
      $case: "invoke",
      value: { pluginId, pluginRunId, method, argsJson: stringifyJson(args) },
    });
    if (reply.accepted) return { ok: true, value: reply.valueJson === "" ? null : parseJson(reply.valueJson) };
    return {
      ok: false,
      code: reply.code as Extract<InvokeResult, { ok: false }>["code"],
      message: reply.message,
      ...(reply.stack ? { stack: reply.stack } : {}),
    };
  }

  /** Reports that the run's Client half failed to render. */
  async reportRenderFailure(pluginId: string, pluginRunId: string, message: string, stack = ""): Promise<PageAnswer> {
    return answer(await this.ask({ $case: "renderFailure", value: { pluginId, pluginRunId, message, stack } }));
  }

  /** Replaces the agent's client inspect manifest wholesale. */
  async syncManifest(providers: InspectProvider[]): Promise<PageAnswer> {
    return answer(
      await this.ask({ $case: "syncManifest", value: { providersJson: stringifyJson(providers as unknown as JsonValue) } }),
    );
  }

  /** Answers a client inspect query with data (validated against the method's output schema). */
  async answerQuery(queryId: string, data: JsonValue): Promise<PageAnswer> {
    return answer(
      await this.ask({ $case: "answerQuery", value: { queryId, ok: true, dataJson: stringifyJson(data), message: "" } }),
    );
  }

  /** Reports that this page could not answer a query (it stays pending for other pages). */
  async failQuery(queryId: string, message: string): Promise<PageAnswer> {
    return answer(await this.ask({ $case: "answerQuery", value: { queryId, ok: false, dataJson: "", message } }));
  }

  /** Detaches the page; pending requests stay answerable by other pages. */
  close(): void {
    this.closing = true;
    if (!this.ended) {
      this.call.end();
      this.call.cancel();
    }
    // Not `stub.close()`: the channel is the registry client's, which stays open.
  }

  private ask(message: Message): Promise<PageReply> {
    if (this.ended) return Promise.reject(new CodemodeError(GrpcStatus.UNAVAILABLE, "the page runner stream ended"));
    const replyTo = this.nextReply++;
    return new Promise<PageReply>((resolve, reject) => {
      this.replies.set(replyTo, { resolve, reject });
      this.call.write({ replyTo, message });
    });
  }

  private onMessage(response: AttachResponse): void {
    const m = response.message;
    switch (m?.$case) {
      case "attached":
        this.onAttached?.(m.value.agent);
        break;
      case "reply": {
        const pending = this.replies.get(m.value.replyTo);
        this.replies.delete(m.value.replyTo);
        pending?.resolve(m.value);
        break;
      }
      case "runRequested":
        this.queue.push({
          type: "run-requested",
          request: { ...m.value, source: { host: m.value.source?.host ?? "", client: m.value.source?.client ?? "", truncated: m.value.source?.truncated ?? false } },
        });
        break;
      case "runResolved":
        this.queue.push({ type: "run-resolved", requestId: m.value.requestId, outcome: m.value.outcome });
        break;
      case "inspectQuery":
        this.queue.push({
          type: "inspect-query",
          query: {
            queryId: m.value.queryId,
            agent: m.value.agent,
            provider: m.value.provider,
            method: m.value.method,
            input: m.value.inputJson === "" ? null : parseJson(m.value.inputJson),
          },
        });
        break;
      case "inspectQueryResolved":
        this.queue.push({ type: "inspect-query-resolved", queryId: m.value.queryId, outcome: m.value.outcome });
        break;
      default:
        break;
    }
  }

  private finish(error: CodemodeError | undefined): void {
    if (this.ended) return;
    this.ended = true;
    const final = this.closing && (error === undefined || error.code === GrpcStatus.CANCELLED) ? undefined : error;
    const ended = final ?? new CodemodeError(GrpcStatus.UNAVAILABLE, "the page runner stream ended");
    this.onAttachFailed?.(ended);
    for (const pending of this.replies.values()) pending.reject(ended);
    this.replies.clear();
    this.queue.end();
    this.settleClosed(final);
  }
}

function pick(request: Pick<RunRequest, "requestId" | "pluginId" | "packageId" | "mode">) {
  return { requestId: request.requestId, pluginId: request.pluginId, packageId: request.packageId, mode: request.mode };
}

function settleRun(
  requestId: string,
  pluginId: string,
  pluginRunId: string,
  outcome: SettleOutcomeName,
  options: SettleOptions,
) {
  return {
    requestId,
    pluginId,
    pluginRunId,
    outcome: OUTCOMES[outcome],
    message: options.message ?? "",
    stack: options.stack ?? "",
    clientWaitingFor: options.clientWaitingFor ?? [],
  };
}

function answer(reply: PageReply): PageAnswer {
  return {
    accepted: reply.accepted,
    message: reply.message,
    code: reply.code,
    pluginRunId: reply.pluginRunId,
    startedHere: reply.startedHere,
  };
}
