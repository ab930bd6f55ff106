/**
 * Who may reach the console: the person who started it, through the URL it printed.
 *
 * Each start makes a key (in the printed URL) and a session value (the cookie). Opening the URL
 * exchanges the key for an HttpOnly, SameSite=Strict cookie and redirects to the clean URL, so
 * the key does not stay in the address bar. Then every HTTP request and the WebSocket upgrade
 * pass the same checks, whatever the path:
 *
 * - `Host` is exactly the address the console bound (a DNS-rebinding name is refused, 421);
 * - `Origin`, when sent, is exactly the console's own origin; a request that changes something
 *   (not GET/HEAD) and the WebSocket upgrade must send it. A sandboxed frame's requests carry
 *   `Origin: null` and are refused;
 * - fetch metadata (`Sec-Fetch-Site`, sent by browsers): a request from another site or another
 *   port of the same host is refused unless it is a top-level navigation (a person following a
 *   link; it still needs the cookie, and the cookie is never sent across sites);
 * - the session cookie, compared in constant time.
 *
 * Cookies are not separated by port, so the cookie's name carries the port: two consoles on one
 * host do not overwrite each other's session.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { isIP } from "node:net";
import type { SelfOrigin } from "./routes";

/** The query parameter of the printed URL that carries the key. */
export const KEY_PARAMETER = "key";

export interface Refusal {
  status: 403 | 421;
  reason: string;
}

export type Exchange = { type: "none" } | { type: "accepted"; setCookie: string } | { type: "refused"; refusal: Refusal };

const SAFE_METHODS = new Set(["GET", "HEAD"]);

export class WebGuard {
  /** In the printed URL only: exchanged for the cookie. */
  private readonly key = randomBytes(32).toString("base64url");
  /** The cookie's value. */
  private readonly session = randomBytes(32).toString("base64url");
  readonly cookieName: string;
  readonly self: SelfOrigin;
  /** The one `Host` header the console answers. */
  readonly host: string;

  constructor(bindHost: string, port: number) {
    this.host = `${isIP(bindHost) === 6 ? `[${bindHost}]` : bindHost}:${port}`;
    this.self = { http: `http://${this.host}`, ws: `ws://${this.host}` };
    this.cookieName = `codemode-console-${port}`;
  }

  /** The URL to print: opening it signs the browser in. */
  url(): string {
    return `${this.self.http}/?${KEY_PARAMETER}=${this.key}`;
  }

  /** Host, Origin and fetch-metadata checks of a plain HTTP request (before anything else). */
  checkRequest(req: IncomingMessage): Refusal | undefined {
    const host = this.checkHost(req);
    if (host) return host;
    const origin = req.headers.origin;
    if (origin !== undefined && origin !== this.self.http) return { status: 403, reason: `requests from ${origin} are refused` };
    if (origin === undefined && !SAFE_METHODS.has(req.method ?? "")) return { status: 403, reason: `a ${req.method} without Origin is refused` };
    const site = header(req, "sec-fetch-site");
    if (site === undefined || site === "same-origin" || site === "none") return undefined;
    if (header(req, "sec-fetch-mode") === "navigate" && header(req, "sec-fetch-dest") === "document") return undefined;
    return { status: 403, reason: `a ${site} ${header(req, "sec-fetch-dest") ?? "request"} is refused` };
  }

  /** The WebSocket upgrade: Host, the console's exact Origin, and the session cookie. */
  checkUpgrade(req: IncomingMessage): Refusal | undefined {
    const host = this.checkHost(req);
    if (host) return host;
    const origin = req.headers.origin;
    if (origin !== this.self.http) return { status: 403, reason: `a WebSocket from ${origin ?? "no origin"} is refused` };
    if (!this.hasSession(req)) return { status: 403, reason: "no console session: open the URL the console printed" };
    return undefined;
  }

  /** True when the request carries this start's session cookie. */
  hasSession(req: IncomingMessage): boolean {
    for (const part of (req.headers.cookie ?? "").split(";")) {
      const eq = part.indexOf("=");
      if (eq >= 0 && part.slice(0, eq).trim() === this.cookieName && sameSecret(part.slice(eq + 1).trim(), this.session)) return true;
    }
    return false;
  }

  /** The key exchange of a GET carrying `?key=`: the cookie to set, or a refusal. */
  exchange(req: IncomingMessage, url: URL): Exchange {
    const offered = url.searchParams.get(KEY_PARAMETER);
    if (offered === null) return { type: "none" };
    if (url.pathname !== "/" || !SAFE_METHODS.has(req.method ?? "") || !sameSecret(offered, this.key)) {
      return { type: "refused", refusal: { status: 403, reason: "this is not the console's key" } };
    }
    return { type: "accepted", setCookie: `${this.cookieName}=${this.session}; Path=/; HttpOnly; SameSite=Strict` };
  }

  private checkHost(req: IncomingMessage): Refusal | undefined {
    // DNS rebinding: a foreign name resolving to this address reaches us with its own Host.
    return req.headers.host === this.host ? undefined : { status: 421, reason: `this console answers only ${this.host}` };
  }
}

function header(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** Constant-time comparison (of digests, so that lengths leak nothing either). */
function sameSecret(offered: string, secret: string): boolean {
  const digest = (s: string): Buffer => createHash("sha256").update(s, "utf8").digest();
  return timingSafeEqual(digest(offered), digest(secret));
}
