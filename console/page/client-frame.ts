/**
 * One Client half's frame, seen from the page: an `<iframe sandbox="allow-scripts">` of
 * `/frame.html` (an opaque origin with its own CSP, src/frame.ts) and the one MessagePort the
 * page transferred to it.
 *
 * The half cannot reach the page's DOM, its WebSocket, its storage or its cookie, and the page
 * listens to no window-wide messages: the port is the only way in, and on it the page acts on
 * `host.call` for this frame's own run (bound here, never taken from a message), render
 * notifications and the answers to its own `load` / `dispose` — every message validated by
 * shape first (page/frame-messages.ts), everything else dropped. A frame that navigates away
 * from its document is broken: it is removed.
 */
import { INIT, STYLES, parseFrameMessage, type FrameToPage, type PageToFrame } from "./frame-messages";

export const FRAME_SRC = "/frame.html";
/** A frame that does not answer its port by then has failed to load (a missing bootstrap). */
const HANDSHAKE_MS = 20_000;
/** How long a half's disposers may take before its frame is removed anyway. */
const DISPOSE_MS = 2_000;

/** `host.call` of one run, as JSON text both ways (the page only carries it). */
export type Invoke = (method: string, argsJson: string) => Promise<{ ok: true; valueJson: string } | { ok: false; code: string; message: string }>;

export interface FrameHooks {
  invoke: Invoke;
  /** The half reported a render failure, or its frame broke after it loaded. */
  reportError(failure: { message: string; stack?: string }): void;
  /** What the frame shows now. */
  rendered(text: string): void;
  log(level: "log" | "info" | "warn" | "error" | "debug", text: string): void;
  /** The frame broke (it navigated away) after it loaded: it is gone. */
  broken(): void;
}

export interface FrameRun {
  pluginId: string;
  packageId: string;
  pluginRunId: string;
  code: string;
}

class FrameFailure extends Error {
  constructor(
    message: string,
    readonly frameStack = "",
  ) {
    super(message);
  }
}

export class ClientFrame {
  private readonly iframe: HTMLIFrameElement;
  private port: MessagePort | undefined;
  private loads = 0;
  private settled = false;
  private closed = false;
  /** Resolves on one kind of message (the first after it was asked for); rejects when the frame breaks. */
  private readonly waiters = new Map<string, { resolve: (m: FrameToPage) => void; reject: (e: Error) => void }>();

  private constructor(
    container: HTMLElement,
    title: string,
    private readonly hooks: FrameHooks,
  ) {
    this.iframe = document.createElement("iframe");
    // Never allow-same-origin (the half would be the console), nor top navigation, popups,
    // forms or modals: scripts in an opaque origin, and nothing else.
    this.iframe.setAttribute("sandbox", "allow-scripts");
    this.iframe.setAttribute("referrerpolicy", "no-referrer");
    this.iframe.setAttribute("title", title);
    this.iframe.setAttribute("data-client-frame", "");
    this.iframe.style.cssText = "display:block;width:100%;height:0;border:0;";
    this.iframe.addEventListener("load", () => this.onLoad());
    this.iframe.src = FRAME_SRC;
    container.append(this.iframe);
  }

  /** Creates the frame in `container`, hands it the port, evaluates the half; rejects on failure. */
  static async open(container: HTMLElement, title: string, run: FrameRun, hooks: FrameHooks): Promise<ClientFrame> {
    const frame = new ClientFrame(container, title, hooks);
    try {
      await frame.waitFor("ready", HANDSHAKE_MS, "the Client half's frame did not start");
      frame.post({ type: "load", code: run.code, pluginId: run.pluginId, packageId: run.packageId, pluginRunId: run.pluginRunId, styles: { ...STYLES } });
      const outcome = await frame.waitFor("loaded|load-failed");
      if (outcome.type === "load-failed") throw new FrameFailure(outcome.message, outcome.stack);
      frame.settled = true;
      return frame;
    } catch (e) {
      frame.remove();
      if (e instanceof FrameFailure && e.frameStack) throw Object.assign(new Error(e.message), { stack: e.frameStack });
      throw e;
    }
  }

  /** Runs the half's disposers (bounded), then removes the frame. */
  async dispose(): Promise<void> {
    if (this.closed) return;
    try {
      this.post({ type: "dispose" });
      await this.waitFor("disposed", DISPOSE_MS, "");
    } catch {
      // a stuck or broken disposer: the frame goes anyway
    }
    this.remove();
  }

  private onLoad(): void {
    this.loads += 1;
    if (this.loads === 1) {
      const channel = new MessageChannel();
      this.port = channel.port1;
      this.port.onmessage = (event: MessageEvent<unknown>) => this.onMessage(event.data);
      // Opaque origin: "*" is the only target that reaches it; the port goes to our bootstrap,
      // the frame's first document, before any half's code exists in it.
      this.iframe.contentWindow?.postMessage({ type: INIT }, "*", [channel.port2]);
      return;
    }
    this.broke("the Client half navigated its frame away");
  }

  private broke(message: string): void {
    const wasRunning = this.settled && !this.closed;
    this.remove();
    for (const { reject } of this.waiters.values()) reject(new FrameFailure(message));
    this.waiters.clear();
    if (wasRunning) {
      this.hooks.broken();
      this.hooks.reportError({ message });
    }
  }

  private remove(): void {
    if (this.closed) return;
    this.closed = true;
    this.port?.close();
    this.iframe.remove();
  }

  private post(message: PageToFrame): void {
    if (!this.closed) this.port?.postMessage(message);
  }

  private waitFor(types: string, timeoutMs?: number, timeoutMessage = ""): Promise<FrameToPage> {
    return new Promise((resolve, reject) => {
      if (this.closed) return reject(new FrameFailure("the Client half's frame is gone"));
      const timer = timeoutMs === undefined ? undefined : setTimeout(() => done(() => reject(new FrameFailure(timeoutMessage))), timeoutMs);
      const done = (settle: () => void): void => {
        clearTimeout(timer);
        this.waiters.delete(types);
        settle();
      };
      this.waiters.set(types, { resolve: (m) => done(() => resolve(m)), reject: (e) => done(() => reject(e)) });
    });
  }

  private onMessage(data: unknown): void {
    const message = parseFrameMessage(data);
    if (message === undefined || this.closed) return; // not a shape the page acts on
    switch (message.type) {
      case "call":
        void this.call(message.id, message.method, message.argsJson);
        return;
      case "render-error":
        if (this.settled) this.hooks.reportError({ message: message.message, ...(message.stack ? { stack: message.stack } : {}) });
        return;
      case "rendered":
        this.iframe.style.height = `${message.height}px`;
        this.hooks.rendered(message.text);
        return;
      case "log":
        this.hooks.log(message.level, message.text);
        return;
      default:
        for (const [types, waiter] of this.waiters) if (types.split("|").includes(message.type)) waiter.resolve(message);
    }
  }

  private async call(id: number, method: string, argsJson: string): Promise<void> {
    try {
      const out = await this.hooks.invoke(method, argsJson);
      this.post(out.ok ? { type: "reply", id, ok: true, valueJson: out.valueJson } : { type: "reply", id, ok: false, code: out.code, message: `host.call('${method}') failed: ${out.code}: ${out.message}` });
    } catch (e) {
      this.post({ type: "reply", id, ok: false, code: "page-error", message: `host.call('${method}') failed: ${e instanceof Error ? e.message : String(e)}` });
    }
  }
}
