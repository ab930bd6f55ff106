/**
 * The messages between the console page and one Client half's frame, over the MessageChannel
 * port the page transfers to that frame once (page/client-frame.ts, page/frame.ts).
 *
 * The frame is an opaque-origin sandbox running code the person approved but that may be
 * hostile, so the page trusts nothing it sends: `parseFrameMessage` accepts only these shapes,
 * with bounded strings, and everything else is dropped. A message names no plugin or run — the
 * page knows which run a port belongs to — so a frame can only ever act for its own run.
 */

/** The page's styles for Client halves (the `styles` parameter): class names the frame styles too. */
export const STYLES = Object.freeze({ card: "cm-card", button: "cm-button", muted: "cm-muted", title: "cm-title" });

/** Page → frame (window.postMessage): the only message not on the port; it carries the port. */
export const INIT = "cordis-frame-init";

/** Page → frame, on the port. */
export type PageToFrame =
  | { type: "load"; code: string; pluginId: string; packageId: string; pluginRunId: string; styles: Record<string, string> }
  | { type: "reply"; id: number; ok: true; valueJson: string }
  | { type: "reply"; id: number; ok: false; code: string; message: string }
  | { type: "dispose" };

/** Frame → page, on the port. */
export type FrameToPage =
  /** The bootstrap holds the port (the answer to INIT). */
  | { type: "ready" }
  /** `host.call(method, args)` of this frame's run. */
  | { type: "call"; id: number; method: string; argsJson: string }
  /** The half evaluated and applied. */
  | { type: "loaded" }
  | { type: "load-failed"; message: string; stack: string }
  /** `ctx.reportError(e)`: a failure to render after the activation settled. */
  | { type: "render-error"; message: string; stack: string }
  /** What the frame shows now (for the `Slots` inspect provider) and how tall it is. */
  | { type: "rendered"; text: string; height: number }
  /** The half's `console`, printed by the page with the plugin's tag. */
  | { type: "log"; level: LogLevel; text: string }
  /** The half's disposers ran (the answer to `dispose`). */
  | { type: "disposed" };

export type LogLevel = "log" | "info" | "warn" | "error" | "debug";
const LEVELS: readonly string[] = ["log", "info", "warn", "error", "debug"];

/** Bounds on what a frame may send; longer text is cut, a longer method or argument is refused. */
export const LIMITS = Object.freeze({
  method: 256,
  argsJson: 1 << 20,
  message: 4000,
  stack: 16_000,
  text: 2000,
  log: 4000,
  height: 4000,
});

function str(value: unknown, max: number): string | undefined {
  return typeof value === "string" ? value.slice(0, max) : undefined;
}

/** The frame's message, validated by shape; undefined for anything else (it is dropped). */
export function parseFrameMessage(data: unknown): FrameToPage | undefined {
  if (typeof data !== "object" || data === null || Array.isArray(data)) return undefined;
  const m = data as Record<string, unknown>;
  switch (m.type) {
    case "ready":
    case "loaded":
    case "disposed":
      return { type: m.type };
    case "call": {
      const { id, method, argsJson } = m;
      if (!Number.isSafeInteger(id) || (id as number) < 0) return undefined;
      if (typeof method !== "string" || method.length === 0 || method.length > LIMITS.method) return undefined;
      if (typeof argsJson !== "string" || argsJson.length > LIMITS.argsJson) return undefined;
      return { type: "call", id: id as number, method, argsJson };
    }
    case "load-failed":
    case "render-error": {
      const message = str(m.message, LIMITS.message);
      if (message === undefined) return undefined;
      return { type: m.type, message, stack: str(m.stack, LIMITS.stack) ?? "" };
    }
    case "rendered": {
      const text = str(m.text, LIMITS.text);
      const height = typeof m.height === "number" && Number.isFinite(m.height) ? Math.min(Math.max(0, Math.ceil(m.height)), LIMITS.height) : undefined;
      if (text === undefined || height === undefined) return undefined;
      return { type: "rendered", text, height };
    }
    case "log": {
      const text = str(m.text, LIMITS.log);
      if (text === undefined || typeof m.level !== "string" || !LEVELS.includes(m.level)) return undefined;
      return { type: "log", level: m.level as LogLevel, text };
    }
    default:
      return undefined;
  }
}
