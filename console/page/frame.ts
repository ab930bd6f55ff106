/**
 * The bootstrap of a Client half's frame: the inline script of `/frame.html` (src/frame.ts),
 * run in an opaque-origin sandbox (`sandbox="allow-scripts"`, and the document's own CSP).
 *
 * It waits for the page's one INIT message (from the parent window only) carrying a
 * MessagePort, then speaks only over that port (page/frame-messages.ts): the page sends the
 * half's code, the frame evaluates it with `host`, `console`, `mount` (this document's body)
 * and `styles`, and reports what it renders. Nothing here is a security boundary — the half
 * shares this realm and may rewrite all of it; the page validates whatever arrives.
 */
import { INIT, type FrameToPage, type PageToFrame } from "./frame-messages";

type AsyncBody = (...args: unknown[]) => Promise<unknown>;
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor as new (...params: string[]) => AsyncBody;

interface Context {
  pluginId: string;
  packageId: string;
  pluginRunId: string;
  mount: HTMLElement;
  host: { call(method: string, args?: unknown): Promise<unknown> };
  console: Console;
  onDispose(fn: () => void | Promise<void>): void;
  reportError(error: unknown): void;
}

function describe(error: unknown): { message: string; stack: string } {
  if (error instanceof Error) return { message: error.message, stack: error.stack ?? "" };
  return { message: String(error), stack: "" };
}

function format(value: unknown): string {
  if (typeof value === "string") return value;
  if (value instanceof Error) return value.stack ?? value.message;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

class FrameRuntime {
  private nextId = 1;
  private readonly calls = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private readonly disposers: (() => void | Promise<void>)[] = [];
  private reportScheduled = false;

  constructor(private readonly port: MessagePort) {
    port.onmessage = (event: MessageEvent<PageToFrame>) => void this.onMessage(event.data);
    this.send({ type: "ready" });
  }

  private send(message: FrameToPage): void {
    this.port.postMessage(message);
  }

  private async onMessage(message: PageToFrame): Promise<void> {
    switch (message.type) {
      case "load":
        return this.load(message);
      case "reply": {
        const pending = this.calls.get(message.id);
        this.calls.delete(message.id);
        if (message.ok) pending?.resolve(JSON.parse(message.valueJson) as unknown);
        else pending?.reject(Object.assign(new Error(message.message), { code: message.code }));
        return;
      }
      case "dispose":
        for (const dispose of this.disposers.reverse()) {
          try {
            await dispose();
          } catch (e) {
            this.log("warn", ["a disposer failed", e]);
          }
        }
        this.send({ type: "disposed" });
        return;
    }
  }

  private async load(message: Extract<PageToFrame, { type: "load" }>): Promise<void> {
    const host = Object.freeze({ call: (method: string, args: unknown = null) => this.call(method, args) });
    const tagged = this.console();
    const mount = document.body;
    this.observe(mount);
    try {
      // a SyntaxError fails the load
      const body = new AsyncFunction("host", "console", "mount", "styles", message.code);
      const plugin = await body(host, tagged, mount, Object.freeze({ ...message.styles }));
      if (plugin === undefined) throw new Error("the Client half returned `undefined` — did you forget `return`?");
      const apply =
        typeof plugin === "function"
          ? (plugin as (ctx: Context) => unknown)
          : typeof (plugin as { apply?: unknown } | null)?.apply === "function"
            ? (ctx: Context) => (plugin as { apply: (ctx: Context) => unknown }).apply(ctx)
            : undefined;
      if (apply === undefined) throw new Error("the Client half must return a Plugin function or an object with apply(ctx)");
      const ctx: Context = Object.freeze({
        pluginId: message.pluginId,
        packageId: message.packageId,
        pluginRunId: message.pluginRunId,
        mount,
        host,
        console: tagged,
        onDispose: (fn: () => void | Promise<void>) => void this.disposers.push(fn),
        reportError: (error: unknown) => this.send({ type: "render-error", ...describe(error) }),
      });
      const disposer = await apply(ctx);
      if (typeof disposer === "function") this.disposers.push(disposer as () => void);
      this.report(); // what it drew so far, before the page settles the activation
      this.send({ type: "loaded" });
    } catch (e) {
      this.send({ type: "load-failed", ...describe(e) });
    }
  }

  private call(method: string, args: unknown): Promise<unknown> {
    const id = this.nextId++;
    const argsJson = JSON.stringify(args ?? null);
    return new Promise((resolve, reject) => {
      this.calls.set(id, { resolve, reject });
      this.send({ type: "call", id, method, argsJson });
    });
  }

  private console(): Console {
    const forward = (level: "log" | "info" | "warn" | "error" | "debug") => (...args: unknown[]) => this.log(level, args);
    return { ...console, log: forward("log"), info: forward("info"), warn: forward("warn"), error: forward("error"), debug: forward("debug") };
  }

  private log(level: "log" | "info" | "warn" | "error" | "debug", args: unknown[]): void {
    this.send({ type: "log", level, text: args.map(format).join(" ") });
  }

  /** Tells the page what the frame shows whenever it changes (coalesced to one message a task). */
  private observe(mount: HTMLElement): void {
    const schedule = (): void => {
      if (this.reportScheduled) return;
      this.reportScheduled = true;
      setTimeout(() => this.report(), 0);
    };
    new MutationObserver(schedule).observe(mount, { subtree: true, childList: true, characterData: true, attributes: true });
    new ResizeObserver(schedule).observe(document.documentElement);
  }

  private report(): void {
    this.reportScheduled = false;
    const text = (document.body.textContent ?? "").slice(0, 2000);
    this.send({ type: "rendered", text, height: document.documentElement.scrollHeight });
  }
}

function onInit(event: MessageEvent): void {
  // Only the embedding page hands out the port; a sibling frame's message is ignored.
  if (event.source !== window.parent || event.ports.length !== 1 || (event.data as { type?: unknown } | null)?.type !== INIT) return;
  window.removeEventListener("message", onInit);
  new FrameRuntime(event.ports[0]!);
}

window.addEventListener("message", onInit);
