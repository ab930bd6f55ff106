/**
 * What the console serves over HTTP: one table, path → file, content type and Content Security
 * Policy. Nothing outside the table is served; every request first passes the same checks
 * (`WebGuard` in ./guard.ts: Host, Origin, fetch metadata and the session cookie), whatever the
 * route, so a document added here gets its own CSP and no other rule. A document the console's
 * page frames (a sandboxed frame of its own) is `framedBy: "self"`: its navigation comes from
 * the page (same origin, with the cookie); the requests it makes itself come from an opaque
 * origin (`Origin: null`, no SameSite cookie) and are refused like any other origin's.
 */

/** The console's own origin, as the page reaches it. */
export interface SelfOrigin {
  /** `http://127.0.0.1:PORT` */
  http: string;
  /** `ws://127.0.0.1:PORT`: the only place the page may connect to. */
  ws: string;
}

export interface Route {
  path: string;
  /** The built file in the public folder (`dist/public`); none: the bridge makes the body (the
   * Client half frame document, ./frame.ts). */
  file?: string;
  contentType: string;
  /** The response's Content-Security-Policy, but for `frame-ancestors` (from `framedBy`). */
  csp: (self: SelfOrigin) => string;
  /** Who may frame it: nobody, or the console's own page (a frame document of its own). */
  framedBy: "none" | "self";
}

/** Directives every response carries: it loads nothing by default and posts nowhere. */
const LOCKED = ["default-src 'none'", "base-uri 'none'", "form-action 'none'"];

/** A response that is not a document (a script, a stylesheet, an error): it may load nothing. */
export const NO_CONTENT_CSP = (): string => LOCKED.join("; ");

/** The framing headers of a response: `frame-ancestors` and its older spelling. */
export function framingHeaders(csp: string, framedBy: Route["framedBy"]): Record<string, string> {
  return {
    "content-security-policy": `${csp}; frame-ancestors '${framedBy}'`,
    "x-frame-options": framedBy === "none" ? "DENY" : "SAMEORIGIN",
  };
}

/** The console page: its own script and stylesheet, its own WebSocket, its own frames. */
export function pageCsp(self: SelfOrigin): string {
  return [
    ...LOCKED,
    "script-src 'self'", // Client halves are evaluated in their own frame documents, never here
    "style-src 'self'",
    "img-src 'self' data:",
    `connect-src ${self.ws}`,
    "frame-src 'self'",
  ].join("; ");
}

const HTML = "text/html; charset=utf-8";
const JS = "text/javascript; charset=utf-8";
const CSS = "text/css; charset=utf-8";
const JSON_TYPE = "application/json; charset=utf-8";

export const ROUTES: readonly Route[] = [
  { path: "/", file: "index.html", contentType: HTML, csp: pageCsp, framedBy: "none" },
  { path: "/app.js", file: "app.js", contentType: JS, csp: NO_CONTENT_CSP, framedBy: "none" },
  { path: "/app.js.map", file: "app.js.map", contentType: JSON_TYPE, csp: NO_CONTENT_CSP, framedBy: "none" },
  { path: "/console.css", file: "console.css", contentType: CSS, csp: NO_CONTENT_CSP, framedBy: "none" },
];

/** The WebSocket's path (not a route: it is an upgrade, checked by the same guard). */
export const SOCKET_PATH = "/ws";
