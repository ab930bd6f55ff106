/**
 * The console's bridge: serves the page on loopback and carries it to the registry.
 *
 * Server side it holds one `PageRunner` for the agent, one `Approver` and one history watch;
 * every connected page (browser tab) sees the same events, and on connecting it is told what is
 * pending now (activation requests, tool approvals) and the history so far, so a reload loses
 * nothing. The page decides; the first valid answer wins in the registry, as with several pages.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, resolve } from "node:path";
import type { AddressInfo } from "node:net";
import { WebSocket, WebSocketServer } from "ws";
import {
  Approver,
  PageRunner,
  RegistryClient,
  parseJson,
  stringifyJson,
  type ApprovalAnswer,
  type HistoryEntry,
  type InspectProvider,
  type RunRequest,
} from "@codemode/client";
import { FRAME_PATH, builtFrameDocument } from "./frame";
import type { ClientMessage, HistoryView, InspectQueryView, ServerMessage, ToolApprovalView, VerbName, Verbs } from "./protocol";

export interface BridgeOptions {
  registry: string;
  agent: string;
  /** 0: any free port. */
  port: number;
  /** The folder with index.html and app.js (default: the built `dist/public`). */
  publicDir?: string;
}

/** History kept for pages that connect later; older records are dropped first. */
const MAX_HISTORY = 10_000;

const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".map": "application/json",
};

interface PendingApproval {
  view: ToolApprovalView;
  answer: (answer: ApprovalAnswer) => void;
}

export class ConsoleBridge {
  readonly client: RegistryClient;
  agent = "";
  /**
   * Resolves with the error when the page-runner stream is lost (the registry went away): the
   * page can no longer answer anything, so the console stops rather than serve a dead page.
   */
  readonly lost: Promise<Error>;
  private onLost!: (e: Error) => void;
  private page: PageRunner | undefined;
  private approver: Approver | undefined;
  private readonly watch = new AbortController();
  private readonly sockets = new Set<WebSocket>();
  private readonly requests = new Map<string, RunRequest>();
  private readonly approvals = new Map<string, PendingApproval>();
  private readonly queries = new Map<string, InspectQueryView>();
  private readonly history: HistoryView[] = [];
  private http: Server | undefined;
  private wss: WebSocketServer | undefined;
  private readonly publicDir: string;
  private readonly frame = builtFrameDocument();

  constructor(private readonly options: BridgeOptions) {
    this.client = new RegistryClient(options.registry, { timeoutMs: 10_000 });
    this.publicDir = options.publicDir ?? resolve(__dirname, "..", "public");
    this.lost = new Promise((resolvePromise) => (this.onLost = resolvePromise));
  }

  /** Attaches to the registry, then listens; resolves with the page's URL. */
  async start(): Promise<string> {
    this.page = await PageRunner.attach(this.client, this.options.agent, { pageName: "console" });
    this.agent = this.page.agent;
    void this.pumpPageEvents(this.page);
    this.approver = new Approver(this.client, "console", (request, { signal }) => this.askPerson(request, signal), {
      onWithdrawn: (approvalId, outcome) => this.withdraw(approvalId, outcome),
    });
    this.approver.serve().catch((e: unknown) => console.error(`console: the approver stopped: ${String(e)}`));
    void this.pumpHistory();

    this.http = createServer((req, res) => void this.serveFile(req, res));
    this.wss = new WebSocketServer({ server: this.http, path: "/ws" });
    this.wss.on("connection", (socket) => this.onConnection(socket));
    await new Promise<void>((resolvePromise, reject) => {
      this.http!.once("error", reject);
      this.http!.listen(this.options.port, "127.0.0.1", () => resolvePromise());
    });
    const { port } = this.http.address() as AddressInfo;
    return `http://127.0.0.1:${port}/`;
  }

  async close(): Promise<void> {
    this.watch.abort();
    for (const socket of this.sockets) socket.terminate();
    this.wss?.close();
    await new Promise<void>((r) => (this.http ? this.http.close(() => r()) : r()));
    this.page?.close();
    await this.approver?.close();
    this.client.close();
  }

  // -- the page's connection -------------------------------------------------------------------

  private onConnection(socket: WebSocket): void {
    this.sockets.add(socket);
    socket.on("close", () => this.sockets.delete(socket));
    socket.on("message", (data) => void this.onMessage(socket, data.toString()));
    this.send(socket, { type: "hello", agent: this.agent });
    for (const record of this.history) this.send(socket, { type: "history", record });
    for (const request of this.requests.values()) this.send(socket, { type: "run-requested", request });
    for (const { view } of this.approvals.values()) this.send(socket, { type: "tool-approval", request: view });
    for (const query of this.queries.values()) this.send(socket, { type: "inspect-query", query });
  }

  private async onMessage(socket: WebSocket, text: string): Promise<void> {
    let message: ClientMessage;
    try {
      message = JSON.parse(text) as ClientMessage;
    } catch {
      return; // not ours
    }
    try {
      const result = await this.verb(message.verb, message.args);
      this.send(socket, { type: "reply", id: message.id, ok: true, result });
    } catch (e) {
      this.send(socket, { type: "reply", id: message.id, ok: false, error: e instanceof Error ? e.message : String(e) });
    }
  }

  /** One page verb, carried to the registry unchanged: the registry decides what is valid. */
  private async verb<V extends VerbName>(verb: V, raw: Verbs[V]["args"]): Promise<Verbs[VerbName]["result"]> {
    const page = this.page!;
    switch (verb) {
      case "runHostHalf": {
        const a = raw as Verbs["runHostHalf"]["args"];
        return page.runHostHalf(a, { approveFutureVersions: a.approveFutureVersions });
      }
      case "panelRun": {
        const a = raw as Verbs["panelRun"]["args"];
        return page.panelRun(a.pluginId, a.packageId, a.mode);
      }
      case "clientCode": {
        const a = raw as Verbs["clientCode"]["args"];
        const { clientCode, ...answer } = await page.clientCode(a.pluginId, a.pluginRunId);
        return clientCode ? { ...answer, code: clientCode.code } : answer;
      }
      case "settle": {
        const a = raw as Verbs["settle"]["args"];
        return page.settle(a.requestId, a.pluginRunId, a.outcome, { message: a.message, stack: a.stack });
      }
      case "settlePanelRun": {
        const a = raw as Verbs["settlePanelRun"]["args"];
        return page.settlePanelRun(a.pluginId, a.pluginRunId, a.outcome, { message: a.message, stack: a.stack });
      }
      case "stop":
        return page.stop((raw as Verbs["stop"]["args"]).pluginId);
      case "remove":
        return page.remove((raw as Verbs["remove"]["args"]).pluginId);
      case "invoke": {
        const a = raw as Verbs["invoke"]["args"];
        const out = await page.invoke(a.pluginId, a.pluginRunId, a.method, a.argsJson === "" ? null : parseJson(a.argsJson));
        return out.ok ? { ok: true, valueJson: stringifyJson(out.value) } : out;
      }
      case "renderFailure": {
        const a = raw as Verbs["renderFailure"]["args"];
        return page.reportRenderFailure(a.pluginId, a.pluginRunId, a.message, a.stack ?? "");
      }
      case "syncManifest": {
        const a = raw as Verbs["syncManifest"]["args"];
        return page.syncManifest(parseJson(a.providersJson) as unknown as InspectProvider[]);
      }
      case "answerQuery": {
        const a = raw as Verbs["answerQuery"]["args"];
        return page.answerQuery(a.queryId, parseJson(a.dataJson));
      }
      case "failQuery": {
        const a = raw as Verbs["failQuery"]["args"];
        return page.failQuery(a.queryId, a.message);
      }
      case "answerToolApproval": {
        const a = raw as Verbs["answerToolApproval"]["args"];
        const pending = this.approvals.get(a.approvalId);
        pending?.answer(a.answer === "allow" ? "allow" : "reject");
        return { delivered: pending !== undefined };
      }
      default:
        throw new Error(`unknown verb ${String(verb)}`);
    }
  }

  private send(socket: WebSocket, message: ServerMessage): void {
    if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  private broadcast(message: ServerMessage): void {
    for (const socket of this.sockets) this.send(socket, message);
  }

  // -- registry streams ------------------------------------------------------------------------

  private async pumpPageEvents(page: PageRunner): Promise<void> {
    for await (const event of page.events()) {
      if (event.type === "run-requested") {
        this.requests.set(event.request.requestId, event.request);
        this.broadcast({ type: "run-requested", request: event.request });
      } else if (event.type === "run-resolved") {
        this.requests.delete(event.requestId);
        this.broadcast({ type: "run-resolved", requestId: event.requestId, outcome: event.outcome });
      } else if (event.type === "inspect-query") {
        const { queryId, provider, method, input } = event.query;
        const query: InspectQueryView = { queryId, provider, method, inputJson: stringifyJson(input) };
        this.queries.set(queryId, query);
        this.broadcast({ type: "inspect-query", query });
      } else {
        this.queries.delete(event.queryId);
        this.broadcast({ type: "inspect-query-resolved", queryId: event.queryId, outcome: event.outcome });
      }
    }
    const error = await page.closed;
    if (error !== undefined) this.onLost(error);
  }

  /** The approver's handler: other agents' requests are left to other approvers. */
  private askPerson(
    request: { approvalId: string; callId: string; agent: string; toolName: string; argumentsJson: string; reason: string },
    signal: AbortSignal,
  ): Promise<ApprovalAnswer | undefined> | undefined {
    if (request.agent !== this.agent) return undefined;
    const view: ToolApprovalView = {
      approvalId: request.approvalId,
      callId: request.callId,
      agent: request.agent,
      toolName: request.toolName,
      argumentsJson: request.argumentsJson,
      reason: request.reason,
    };
    return new Promise<ApprovalAnswer | undefined>((resolvePromise) => {
      const done = (answer: ApprovalAnswer | undefined): void => {
        if (!this.approvals.has(view.approvalId)) return;
        this.approvals.delete(view.approvalId);
        resolvePromise(answer);
      };
      this.approvals.set(view.approvalId, { view, answer: done });
      signal.addEventListener("abort", () => done(undefined), { once: true });
      this.broadcast({ type: "tool-approval", request: view });
    });
  }

  private withdraw(approvalId: string, outcome: string): void {
    this.approvals.delete(approvalId);
    this.broadcast({ type: "tool-approval-withdrawn", approvalId, outcome });
  }

  private async pumpHistory(): Promise<void> {
    try {
      for await (const entry of this.client.watchHistory(this.agent, { signal: this.watch.signal })) {
        const record = historyView(entry);
        this.history.push(record);
        if (this.history.length > MAX_HISTORY) this.history.shift();
        this.broadcast({ type: "history", record });
      }
    } catch (e) {
      if (!this.watch.signal.aborted) console.error(`console: the history watch ended: ${String(e)}`);
    }
  }

  // -- static files ----------------------------------------------------------------------------

  private async serveFile(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? "/", "http://localhost").pathname;
    if (path === FRAME_PATH) return void res.writeHead(200, this.frame.headers).end(this.frame.body); // a Client half's sandbox
    const name = path === "/" ? "index.html" : path.slice(1);
    // Only the built files, by plain name: no path leaves the public folder.
    if (!/^[A-Za-z0-9_.-]+$/.test(name) || name.startsWith(".")) {
      res.writeHead(404).end();
      return;
    }
    try {
      const body = await readFile(join(this.publicDir, name));
      res.writeHead(200, { "content-type": CONTENT_TYPES[extname(name)] ?? "application/octet-stream", "cache-control": "no-store" });
      res.end(body);
    } catch {
      res.writeHead(404).end();
    }
  }
}

function historyView(entry: HistoryEntry): HistoryView {
  return {
    seq: entry.seq.toString(),
    kind: entry.kind,
    callId: entry.callId,
    rootCallId: entry.rootCallId,
    parentCallId: entry.parentCallId,
    toolName: entry.toolName,
    argumentsJson: entry.argumentsJson,
    text: entry.content.map((b) => (b.block?.$case === "text" ? b.block.value.text : "")).join(""),
    isError: entry.isError,
    errorCode: entry.errorCode,
    timeMs: entry.time?.getTime() ?? 0,
  };
}
