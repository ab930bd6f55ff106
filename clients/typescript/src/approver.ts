/**
 * Answer approval requests over the registry's `Approve` stream.
 *
 *     const approver = new Approver(client, "ops", async (request) =>
 *       request.toolName === "deploy" && request.arguments.env === "staging" ? "allow" : "reject");
 *     await approver.start();   // answers until the stream ends (`approver.closed`)
 *
 *     await approver.serve();   // or: answer until close(), opening the stream again whenever
 *                               // it is lost (a registry restart or shutdown)
 *
 * Every connected approver receives every request; the first answer wins and the others see the
 * request withdrawn (their callback's `signal` aborts, and a late answer is not sent). A callback
 * that throws rejects (fail closed); returning `undefined` abstains and leaves the request to
 * other approvers.
 */
import { status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";
import { CodemodeError } from "./errors";
import {
  ApprovalOutcome,
  type ApproveRequest,
  type ApproveResponse,
  type ApprovalRequest as ApprovalRequestMessage,
} from "./gen/codemode/registry/v1/registry_service";
import { deferred, DuplexStream, Reconnector, type ServeOptions } from "./reconnect";
import {
  approvalOutcomeName,
  approvalRequestOf,
  type ApprovalAnswer,
  type ApprovalOutcomeName,
  type ApprovalRequest,
  type RegistryClient,
} from "./registry";

export type { ApprovalAnswer, ApprovalRequest } from "./registry";

export interface ApprovalContext {
  /** Aborted when the request is withdrawn (answered elsewhere, cancelled) or its stream ends. */
  signal: AbortSignal;
}

export type ApprovalHandler = (
  request: ApprovalRequest,
  ctx: ApprovalContext,
) => ApprovalAnswer | undefined | Promise<ApprovalAnswer | undefined>;

export interface ApproverOptions {
  /** Bound on the stream handshake in ms (default: the client's timeout). */
  timeoutMs?: number;
  /** Called when a request this approver received is settled elsewhere or cancelled. */
  onWithdrawn?: (approvalId: string, outcome: ApprovalOutcomeName) => void;
}

/** One `Approve` stream and what lives and dies with it: the handshake and the unanswered requests. */
class Stream extends DuplexStream<ApproveRequest, ApproveResponse> {
  readonly pending = new Map<string, AbortController>();
}

export class Approver {
  /** The registry-assigned id of the current (or last) approver stream (after `start`). */
  approverId = "";

  private readonly timeoutMs: number;
  private readonly onWithdrawn: ((approvalId: string, outcome: ApprovalOutcomeName) => void) | undefined;
  /** The current or last stream. */
  private stream: Stream | undefined;
  /** The end of the current or last stream, or of the next one when none was opened yet. */
  private ends = deferred<CodemodeError | undefined>();
  private serving: Reconnector | undefined;

  constructor(
    private readonly client: RegistryClient,
    readonly name: string,
    private readonly handler: ApprovalHandler,
    options: ApproverOptions = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? client.timeoutMs;
    this.onWithdrawn = options.onWithdrawn;
  }

  /**
   * Resolves when the current (or last) stream ends: `undefined` after `close()` or a clean end,
   * else the error. Before the first stream, the promise of the first stream's end.
   */
  get closed(): Promise<CodemodeError | undefined> {
    return this.ends.promise;
  }

  /**
   * Opens the stream; resolves once the registry acknowledged it. Fails at once with UNAVAILABLE
   * when no registry is reachable; `serve()` waits for one.
   */
  async start(): Promise<void> {
    if (this.serving !== undefined) throw new Error("the approver is serving: serve() opens its streams");
    if (this.stream !== undefined && !this.stream.ended) throw new Error("the approver is already started");
    await this.open(false);
  }

  /**
   * Answers requests until `close()`, across registry restarts and shutdowns: whenever the stream
   * is lost (UNAVAILABLE when a registry shuts down, a broken connection, no registry up yet) it is
   * opened again as soon as a registry is reachable. Requests pending on a lost stream have their
   * handler's `signal` aborted: the registry no longer waits for this stream's answer. Resolves
   * after `close()`; rejects when the stream fails with a code no retry fixes (`UNAUTHENTICATED`,
   * `PERMISSION_DENIED`, `INVALID_ARGUMENT`, `UNIMPLEMENTED`).
   */
  async serve(options: ServeOptions = {}): Promise<void> {
    if (this.serving !== undefined) throw new Error("the approver is already serving");
    if (this.stream !== undefined && !this.stream.ended) throw new Error("the approver is already started");
    const run: Reconnector = new Reconnector(
      () => this.open(true).then((stream) => ({ ended: stream.done.promise })),
      options.maxDelayMs ?? 10_000,
      undefined,
      () => {
        if (this.serving === run) this.serving = undefined;
      },
    );
    this.serving = run;
    return run.done;
  }

  /**
   * Ends the stream and `serve()`, which has resolved by the time this does; requests this
   * approver has not answered stay open for other approvers.
   */
  async close(): Promise<void> {
    const run = this.serving;
    run?.stop();
    if (this.stream !== undefined) await this.closeStream(this.stream);
    else this.ends.settle(undefined);
    await run?.done.catch(() => undefined);
  }

  /** Opens a stream and waits for the registry's acknowledgement; closes it again if that fails. */
  private async open(waitForReady: boolean): Promise<Stream> {
    const metadata = this.client.metadata();
    if (waitForReady) metadata.setOptions({ waitForReady: true });
    if (this.ends.settled) this.ends = deferred();
    const stream = new Stream(this.client.stub.approve(metadata), this.ends);
    this.stream = stream;
    stream.call.on("data", (message: ApproveResponse) => this.onMessage(stream, message));
    stream.call.on("error", (e: ServiceError) => this.finish(stream, CodemodeError.from(e)));
    stream.call.on("end", () => this.finish(stream, undefined));
    const opened = new Promise<string>((resolve, reject) => (stream.opened = { resolve, reject }));
    // The registry sends no request larger than this, which the channel would refuse by ending
    // the stream (and every agent's approvals on it).
    const maxReceiveMessageBytes = BigInt(this.client.maxReceiveMessageBytes);
    stream.write({ message: { $case: "open", value: { approverName: this.name, maxReceiveMessageBytes } } });
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new CodemodeError(GrpcStatus.DEADLINE_EXCEEDED, `opening the approver stream took longer than ${this.timeoutMs} ms`)),
        this.timeoutMs,
      );
    });
    try {
      this.approverId = await Promise.race([opened, timeout]);
    } catch (e) {
      await this.closeStream(stream);
      throw e;
    } finally {
      clearTimeout(timer);
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

  private onMessage(stream: Stream, message: ApproveResponse): void {
    const m = message.message;
    switch (m?.$case) {
      case "opened":
        stream.opened?.resolve(m.value.approverId);
        stream.opened = undefined;
        break;
      case "request":
        this.answer(stream, m.value);
        break;
      case "withdrawn": {
        const controller = stream.pending.get(m.value.approvalId);
        stream.pending.delete(m.value.approvalId);
        controller?.abort(new CodemodeError(GrpcStatus.CANCELLED, "the approval request was withdrawn"));
        this.onWithdrawn?.(m.value.approvalId, approvalOutcomeName(m.value.outcome));
        break;
      }
      default:
        break;
    }
  }

  private answer(stream: Stream, message: ApprovalRequestMessage): void {
    const controller = new AbortController();
    stream.pending.set(message.approvalId, controller);
    void (async () => {
      let answer: ApprovalAnswer | undefined;
      try {
        const request: ApprovalRequest = approvalRequestOf(message);
        answer = await this.handler(request, { signal: controller.signal });
      } catch {
        answer = "reject"; // fail closed
      }
      if (controller.signal.aborted || stream.pending.get(message.approvalId) !== controller) return;
      stream.pending.delete(message.approvalId);
      if (answer === undefined) return;
      const outcome =
        answer === "allow" ? ApprovalOutcome.APPROVAL_OUTCOME_ALLOWED_ONCE : ApprovalOutcome.APPROVAL_OUTCOME_REJECTED;
      // Only on the stream the request came on: a stream opened later is a new approver to the registry.
      stream.write({ message: { $case: "decision", value: { approvalId: message.approvalId, outcome } } });
    })();
  }

  private finish(stream: Stream, error: CodemodeError | undefined): void {
    if (stream.ended) return;
    stream.ended = true;
    const final = stream.closing && (error === undefined || error.code === GrpcStatus.CANCELLED) ? undefined : error;
    const ended = final ?? new CodemodeError(GrpcStatus.UNAVAILABLE, "the approver stream ended");
    stream.opened?.reject(ended);
    stream.opened = undefined;
    // The registry no longer waits for this stream's answers.
    for (const controller of stream.pending.values()) controller.abort(ended);
    stream.pending.clear();
    stream.done.settle(final);
  }
}
