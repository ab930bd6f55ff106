/**
 * Answer approval requests over the registry's `Approve` stream.
 *
 *     const approver = new Approver(client, "ops", async (request) =>
 *       request.toolName === "deploy" && request.arguments.env === "staging" ? "allow" : "reject");
 *     await approver.start();
 *
 * Every connected approver receives every request; the first answer wins and the others see the
 * request withdrawn (their callback's `signal` aborts, and a late answer is not sent). A callback
 * that throws rejects (fail closed); returning `undefined` abstains and leaves the request to
 * other approvers.
 */
import { status as GrpcStatus, type ClientDuplexStream, type ServiceError } from "@grpc/grpc-js";
import { CodemodeError } from "./errors";
import {
  ApprovalOutcome,
  type ApproveRequest,
  type ApproveResponse,
  type ApprovalRequest as ApprovalRequestMessage,
} from "./gen/codemode/registry/v1/registry_service";
import { parseJson, type JsonValue } from "./json";
import { approvalOutcomeName, type ApprovalOutcomeName, type RegistryClient } from "./registry";

export type ApprovalAnswer = "allow" | "reject";

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
}

export interface ApprovalContext {
  /** Aborted when the request is withdrawn (answered elsewhere, cancelled) or the stream ends. */
  signal: AbortSignal;
}

export type ApprovalHandler = (
  request: ApprovalRequest,
  ctx: ApprovalContext,
) => ApprovalAnswer | undefined | Promise<ApprovalAnswer | undefined>;

export class Approver {
  /** The registry-assigned id of this approver stream (after `start`). */
  approverId = "";
  /** Resolves when the stream ends: `undefined` after `close()` or a clean end, else the error. */
  readonly closed: Promise<CodemodeError | undefined>;

  private call: ClientDuplexStream<ApproveRequest, ApproveResponse> | undefined;
  private opened: { resolve: (id: string) => void; reject: (e: unknown) => void } | undefined;
  private readonly pending = new Map<string, AbortController>();
  private readonly timeoutMs: number;
  private ended = false;
  private closing = false;
  private resolveClosed!: (e: CodemodeError | undefined) => void;

  constructor(
    private readonly client: RegistryClient,
    readonly name: string,
    private readonly handler: ApprovalHandler,
    options: { timeoutMs?: number; onWithdrawn?: (approvalId: string, outcome: ApprovalOutcomeName) => void } = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? client.timeoutMs;
    this.onWithdrawn = options.onWithdrawn;
    this.closed = new Promise((resolve) => (this.resolveClosed = resolve));
  }

  private readonly onWithdrawn: ((approvalId: string, outcome: ApprovalOutcomeName) => void) | undefined;

  /** Opens the stream; resolves once the registry acknowledged it. */
  async start(): Promise<void> {
    if (this.call !== undefined) throw new Error("the approver is already started");
    const call = this.client.stub.approve(this.client.metadata());
    this.call = call;
    call.on("data", (message: ApproveResponse) => this.onMessage(message));
    call.on("error", (e: ServiceError) => this.finish(CodemodeError.from(e)));
    call.on("end", () => this.finish(undefined));
    const opened = new Promise<string>((resolve, reject) => (this.opened = { resolve, reject }));
    call.write({ message: { $case: "open", value: { approverName: this.name } } });
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
      await this.close();
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Ends the stream; requests it has not answered stay open for other approvers. */
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

  private onMessage(message: ApproveResponse): void {
    const m = message.message;
    switch (m?.$case) {
      case "opened":
        this.opened?.resolve(m.value.approverId);
        this.opened = undefined;
        break;
      case "request":
        this.answer(m.value);
        break;
      case "withdrawn": {
        const controller = this.pending.get(m.value.approvalId);
        this.pending.delete(m.value.approvalId);
        controller?.abort(new CodemodeError(GrpcStatus.CANCELLED, "the approval request was withdrawn"));
        this.onWithdrawn?.(m.value.approvalId, approvalOutcomeName(m.value.outcome));
        break;
      }
      default:
        break;
    }
  }

  private answer(message: ApprovalRequestMessage): void {
    const controller = new AbortController();
    this.pending.set(message.approvalId, controller);
    void (async () => {
      let answer: ApprovalAnswer | undefined;
      try {
        const request: ApprovalRequest = {
          approvalId: message.approvalId,
          callId: message.callId,
          agent: message.agent,
          toolName: message.toolName,
          arguments: parseJson(message.argumentsJson || "{}"),
          argumentsJson: message.argumentsJson,
          reason: message.reason,
        };
        answer = await this.handler(request, { signal: controller.signal });
      } catch {
        answer = "reject"; // fail closed
      }
      if (controller.signal.aborted || this.pending.get(message.approvalId) !== controller) return;
      this.pending.delete(message.approvalId);
      if (answer === undefined || this.call === undefined || this.ended) return;
      const outcome =
        answer === "allow" ? ApprovalOutcome.APPROVAL_OUTCOME_ALLOWED_ONCE : ApprovalOutcome.APPROVAL_OUTCOME_REJECTED;
      this.call.write({ message: { $case: "decision", value: { approvalId: message.approvalId, outcome } } });
    })();
  }

  private finish(error: CodemodeError | undefined): void {
    if (this.ended) return;
    this.ended = true;
    const final = this.closing && (error === undefined || error.code === GrpcStatus.CANCELLED) ? undefined : error;
    const ended = final ?? new CodemodeError(GrpcStatus.UNAVAILABLE, "the approver stream ended");
    this.opened?.reject(ended);
    this.opened = undefined;
    for (const controller of this.pending.values()) controller.abort(ended);
    this.pending.clear();
    this.resolveClosed(final);
  }
}
