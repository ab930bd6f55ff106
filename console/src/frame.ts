/**
 * `/frame.html`: the document every Client half runs in (page/client-frame.ts embeds one per
 * loaded half with `sandbox="allow-scripts"`).
 *
 * Its only script is the inline bootstrap (page/frame.ts, bundled by scripts/build.mjs into
 * dist/frame/bootstrap.js), allowed by its hash; the half's code arrives later over the
 * MessagePort and is evaluated with `new Function` ('unsafe-eval'). Everything else is denied:
 * the frame makes no request at all — no fetch, XHR, WebSocket, image, font, nested frame or
 * form — so the console's endpoints are unreachable from it whatever else the bridge checks,
 * and its CSP `sandbox` keeps the document opaque-origin even when opened on its own.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import type { Route } from "./routes";

export const FRAME_PATH = "/frame.html";

/** The console's class names (page/frame-messages.ts STYLES), drawn as in the page. */
const FRAME_STYLE = `
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1b1f24; overflow-wrap: anywhere; }
.cm-muted { color: #667; } .cm-card { border: 1px solid #ddd; padding: 0.5rem; border-radius: 4px; }
.cm-title { font-weight: 600; } .cm-button { font: inherit; }
`;

export interface FrameDocument {
  body: Buffer;
  /** Its route in the bridge's table (./routes.ts): the CSP that confines it, framed by the page. */
  route: Route;
}

/** The frame document around a bootstrap script, with the CSP that confines it. */
export function frameDocument(bootstrap: string): FrameDocument {
  if (/<\/script/i.test(bootstrap)) throw new Error("the frame bootstrap cannot be inlined: it contains </script");
  const hash = createHash("sha256").update(bootstrap, "utf8").digest("base64");
  const csp = [
    "default-src 'none'",
    `script-src 'sha256-${hash}' 'unsafe-eval'`,
    "style-src 'unsafe-inline'",
    "img-src data:",
    "connect-src 'none'",
    "form-action 'none'",
    "base-uri 'none'",
    "sandbox allow-scripts",
  ].join("; ");
  const html = `<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><style>${FRAME_STYLE}</style><script>${bootstrap}</script></head>
<body></body></html>`; // nothing after </body>: the half's mount starts empty
  return {
    body: Buffer.from(html, "utf8"),
    route: { path: FRAME_PATH, contentType: "text/html; charset=utf-8", csp: () => csp, framedBy: "self" },
  };
}

/** The built frame document (read once: the bootstrap does not change while the bridge runs). */
export function builtFrameDocument(dir = resolve(__dirname, "..", "frame")): FrameDocument {
  return frameDocument(readFileSync(resolve(dir, "bootstrap.js"), "utf8"));
}
