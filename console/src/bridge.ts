/**
 * The console's bridge: serves the page on loopback and carries it to the registry.
 *
 * Only the person who started it may drive it: every HTTP request and the WebSocket upgrade pass
 * `WebGuard` (./guard.ts: Host, Origin, the session cookie the printed URL's key is exchanged
 * for), and only the routes of ./routes.ts are served, each with its CSP. Toward the registry the
 * console is the principal its credentials name (`credentials`, `metadata`), never more: what
 * that principal may not do, the registry refuses, and the page is told.
 *
 * Server side it holds one `PageRunner` for the agent, one `Approver` and one history watch;
 * every connected page (browser tab) sees the same events, and on connecting it is told what is
 * pending now (activation requests, tool approvals) and the history so far, so a reload loses
 * nothing. The page decides; the first valid answer wins in the registry, as with several pages.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import type { AddressInfo, Socket } from "node:net";
import { WebSocket, WebSocketServer } from "ws";
import {
  Approver,
  CodemodeError,
  PageRunner,
  RegistryClient,
  parseJson,
  renderPrettyJson,
  stringifyJson,
  type ApprovalAnswer,
  type ChannelCredentials,
  type ContentBlock,
  type HistoryEntry,
  type InspectProvider,
  type RunRequest,
} from "@codemode/client";
import { builtFrameDocument } from "./frame";
import { WebGuard, type Refusal } from "./guard";
import {
  RECORD_TEXT_LIMIT,
  type ClientMessage,
  type HistoryView,
  type InspectQueryView,
  type NoticeView,
  type ServerMessage,
  type ToolApprovalView,
  type VerbName,
  type Verbs,
} from "./protocol";
import { NO_CONTENT_CSP, ROUTES, SOCKET_PATH, framingHeaders, type Route } from "./routes";

export interface BridgeOptions {
  registry: string;
  agent: string;
  /** 0: any free port. */
  port: number;
  /** The address to serve on (default 127.0.0.1; anything else lets others on it reach the page). */
  bind?: string;
  /** TLS toward the registry (default plaintext). */
  credentials?: ChannelCredentials;
  /** Sent with every registry call (`authorization: Bearer …`). */
  metadata?: Record<string, string>;
  /** The folder with index.html and app.js (default: the built `dist/public`). */
  publicDir?: string;
}

/** History kept for pages that connect later; older records are dropped first. */
const MAX_HISTORY = 10_000;

/** Headers of every response, refusals included. */
const COMMON_HEADERS = {
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cache-control": "no-store",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
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
  private readonly notices: NoticeView[] = [];
  private http: Server | undefined;
  private wss: WebSocketServer | undefined;
  private guard: WebGuard | undefined;
  private readonly files = new Map<string, Buffer>();
  private readonly publicDir: string;
  private readonly frame = builtFrameDocument();

  constructor(private readonly options: BridgeOptions) {
    this.client = new RegistryClient(options.registry, { timeoutMs: 10_000, credentials: options.credentials, metadata: options.metadata });
    this.publicDir = options.publicDir ?? resolve(__dirname, "..", "public");
    this.lost = new Promise((resolvePromise) => (this.onLost = resolvePromise));
  }

  /** Attaches to the registry, then listens; resolves with the page's URL (it carries the key). */
  async start(): Promise<string> {
    for (const route of ROUTES) {
      if (route.file !== undefined) this.files.set(route.path, await readFile(join(this.publicDir, route.file)));
    }
    this.files.set(this.frame.route.path, this.frame.body);
    this.page = await PageRunner.attach(this.client, this.options.agent, { pageName: "console" });
    this.agent = this.page.agent;
    void this.pumpPageEvents(this.page);
    this.approver = new Approver(this.client, "console", (request, { signal }) => this.askPerson(request, signal), {
      onWithdrawn: (approvalId, outcome) => this.withdraw(approvalId, outcome),
    });
    this.approver.serve().catch((e: unknown) => this.notice("approver", `the approver stopped: ${describe(e)}`));
    void this.pumpHistory();

    const bind = this.options.bind ?? "127.0.0.1";
    this.http = createServer((req, res) => this.serveHttp(req, res));
    this.wss = new WebSocketServer({ noServer: true });
    this.wss.on("connection", (socket) => this.onConnection(socket));
    this.http.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => this.upgrade(req, socket, head));
    await new Promise<void>((resolvePromise, reject) => {
      this.http!.once("error", reject);
      this.http!.listen(this.options.port, bind, () => resolvePromise());
    });
    const { port } = this.http.address() as AddressInfo;
    this.guard = new WebGuard(bind, port);
    return this.guard.url();
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

  private upgrade(req: IncomingMessage, socket: Socket, head: Buffer): void {
    const path = new URL(req.url ?? "/", "http://console").pathname;
    const refusal: Refusal | undefined =
      this.guard!.checkUpgrade(req) ?? (path === SOCKET_PATH ? undefined : { status: 403, reason: `no WebSocket at ${path}` });
    if (refusal) {
      const body = `${refusal.reason}\n`;
      const status = refusal.status === 421 ? "421 Misdirected Request" : "403 Forbidden";
      socket.end(`HTTP/1.1 ${status}\r\nconnection: close\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
      return;
    }
    this.wss!.handleUpgrade(req, socket, head, (ws) => this.wss!.emit("connection", ws, req));
  }

  private onConnection(socket: WebSocket): void {
    this.sockets.add(socket);
    socket.on("close", () => this.sockets.delete(socket));
    socket.on("message", (data) => void this.onMessage(socket, data.toString()));
    this.send(socket, { type: "hello", agent: this.agent });
    for (const notice of this.notices) this.send(socket, { type: "notice", notice });
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
      case "recordContent":
        return this.recordContent((raw as Verbs["recordContent"]["args"]).seq);
      default:
        throw new Error(`unknown verb ${String(verb)}`);
    }
  }

  /** A record of this console's agent in full: the registry reads it as this principal. */
  private async recordContent(seq: unknown): Promise<Verbs["recordContent"]["result"]> {
    if (typeof seq !== "string" || !/^[1-9][0-9]{0,18}$/.test(seq)) return { ok: false, message: "seq must be a record's seq" };
    try {
      const text = contentText(await this.client.recordContent(this.agent, BigInt(seq)));
      const truncated = text.length > RECORD_TEXT_LIMIT;
      return { ok: true, text: truncated ? text.slice(0, RECORD_TEXT_LIMIT) : text, truncated };
    } catch (e) {
      return { ok: false, message: describe(e) };
    }
  }

  private send(socket: WebSocket, message: ServerMessage): void {
    if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  private broadcast(message: ServerMessage): void {
    for (const socket of this.sockets) this.send(socket, message);
  }

  /** Something the console cannot do (the registry refused a stream): logged and shown. */
  private notice(stream: NoticeView["stream"], message: string): void {
    console.error(`console: ${message}`);
    const notice: NoticeView = { stream, message };
    this.notices.push(notice);
    this.broadcast({ type: "notice", notice });
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
      if (!this.watch.signal.aborted) this.notice("history", `the history watch ended: ${describe(e)}`);
    }
  }

  // -- HTTP ------------------------------------------------------------------------------------

  private serveHttp(req: IncomingMessage, res: ServerResponse): void {
    const guard = this.guard!;
    const refusal = guard.checkRequest(req);
    if (refusal) return refuse(res, refusal);
    const url = new URL(req.url ?? "/", "http://console");
    const exchange = guard.exchange(req, url);
    if (exchange.type === "refused") return refuse(res, exchange.refusal);
    if (exchange.type === "accepted") {
      // The key leaves the address bar (and the history) at once: the clean URL has the cookie.
      res.writeHead(303, { ...COMMON_HEADERS, ...framingHeaders(NO_CONTENT_CSP(), "none"), "set-cookie": exchange.setCookie, location: "/" });
      res.end();
      return;
    }
    if (!guard.hasSession(req)) return refuse(res, { status: 403, reason: "no console session: open the URL the console printed" });
    const route: Route | undefined = [...ROUTES, this.frame.route].find((r) => r.path === url.pathname);
    if (route === undefined) return refuse(res, { status: 404, reason: "not found" });
    if (req.method !== "GET" && req.method !== "HEAD") return refuse(res, { status: 405, reason: `${req.method} is not served` });
    const body = this.files.get(route.path)!;
    res.writeHead(200, { ...COMMON_HEADERS, ...framingHeaders(route.csp(guard.self), route.framedBy), "content-type": route.contentType });
    res.end(req.method === "HEAD" ? undefined : body);
  }
}

function refuse(res: ServerResponse, refusal: Refusal | { status: 404 | 405; reason: string }): void {
  const body = `${refusal.reason}\n`;
  res.writeHead(refusal.status, {
    ...COMMON_HEADERS,
    ...framingHeaders(NO_CONTENT_CSP(), "none"),
    "content-type": "text/plain; charset=utf-8",
    connection: "close",
  });
  res.end(body);
}

/** A registry refusal in one line, with its code and reason (`PERMISSION_DENIED`, ...). */
function describe(e: unknown): string {
  if (!(e instanceof CodemodeError)) return String(e);
  return `${e.message} (${[e.codeName, e.reason].filter((s) => s !== "").join(", ")})`;
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
    argumentsText: prettyOrAsIs(entry.argumentsJson),
    text: contentText(entry.content),
    spilled: entry.spillLocator !== "",
    isError: entry.isError,
    errorCode: entry.errorCode,
    timeMs: entry.time?.getTime() ?? 0,
  };
}

/** JSON text pretty-printed digit for digit (what it is, when it is not JSON). */
function prettyOrAsIs(json: string): string {
  if (json === "") return "";
  try {
    return renderPrettyJson(json);
  } catch {
    return json;
  }
}

/** Content as text: text blocks as they are, JSON blocks pretty, images described as the
 * registry's previews describe them. */
function contentText(content: ContentBlock[]): string {
  return content
    .map((b) => {
      switch (b.block?.$case) {
        case "text":
          return b.block.value.text;
        case "json":
          return prettyOrAsIs(b.block.value.json);
        case "image":
          return `[image ${b.block.value.mimeType}, ${b.block.value.data.length} bytes]`;
        default:
          return "";
      }
    })
    .join("");
}
