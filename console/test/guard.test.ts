/**
 * The console belongs to the person who started it: attacks from other origins, rebinding names
 * and browsers without the session, through the REAL registry, `codemode console` and headless
 * Chromium. A page on another port of 127.0.0.1 is same-site with the console (cookies ignore
 * ports), so the signed-in browser sends it the session cookie: only the Origin check stops it.
 * `evil.example` resolves to 127.0.0.1 in this Chromium, as a rebinding name would.
 */
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer, request, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { WebSocket } from "ws";
import { RegistryClient, ToolProvider, type JsonObject } from "@codemode/client";
import { startService, stopService, type Service } from "@codemode/client/dist/test/services";
import { launchChromium, startConsole, type RunningConsole } from "./stack";

const WAIT_MS = 30_000;
const agent = "agents/console-guard";
const SECRET = "s3cret-in-the-history";

// The attacker's page: reads what it can of the console, opens its WebSocket, answers every
// approval it is shown with "allow", and reports what it got once its socket is closed.
const ATTACK_PAGE = `<!doctype html><html><body><script>
(async () => {
  const params = new URLSearchParams(location.search);
  const target = params.get("target");
  const out = { opened: false, messages: [], answered: 0, fetched: "" };
  try {
    const r = await fetch("http://" + target + "/", { credentials: "include" });
    out.fetched = r.status + " " + (await r.text());
  } catch (e) {
    out.fetched = "error: " + e;
  }
  const ws = new WebSocket("ws://" + target + "/ws");
  ws.onopen = () => { out.opened = true; };
  ws.onmessage = (e) => {
    out.messages.push(e.data);
    const m = JSON.parse(e.data);
    if (m.type === "tool-approval") {
      out.answered += 1;
      ws.send(JSON.stringify({ id: out.answered, verb: "answerToolApproval", args: { approvalId: m.request.approvalId, answer: "allow" } }));
    }
    if (m.type === "reply") ws.close();
  };
  ws.onclose = () => {
    document.body.dataset.result = JSON.stringify(out);
    document.body.dataset.done = "true";
  };
})();
</script></body></html>`;

let registry: Service | undefined;
let client: RegistryClient;
let provider: ToolProvider | undefined;
let con: RunningConsole;
let attacker: Server;
let attackPort = 0;
let browser: Browser | undefined;
/** The person's browser: signed in with the printed URL. */
let person: BrowserContext;
let personPage: Page;
/** The session cookie, `name=value`, as the person's browser holds it. */
let cookie = "";

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/** One plain HTTP request to the console with exactly these headers. */
function http(path: string, headers: Record<string, string>, method = "GET"): Promise<Answer> {
  return new Promise((resolvePromise, reject) => {
    const req = request({ host: "127.0.0.1", port: con.port, path, method, headers, setHost: false }, (res) => {
      let body = "";
      res.on("data", (c: Buffer) => (body += c.toString()));
      res.on("end", () => resolvePromise({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

/** A WebSocket upgrade with these headers: the refusal's status, or the first message. */
function socket(headers: Record<string, string>): Promise<{ status: number } | { first: JsonObject }> {
  return new Promise((resolvePromise, reject) => {
    const { origin, ...rest } = headers;
    const ws = new WebSocket(`ws://127.0.0.1:${con.port}/ws`, { origin, headers: rest });
    ws.on("unexpected-response", (_req, res) => {
      resolvePromise({ status: res.statusCode ?? 0 });
      res.resume();
      ws.terminate();
    });
    ws.on("message", (data) => {
      resolvePromise({ first: JSON.parse(data.toString()) as JsonObject });
      ws.close();
    });
    ws.on("error", (e) => reject(e));
  });
}

/** Opens the attacker's page in `context` and resolves with what it managed. */
async function attack(context: BrowserContext, pageOrigin: string, target: string): Promise<{ opened: boolean; messages: string[]; answered: number; fetched: string }> {
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT_MS);
  try {
    await page.goto(`${pageOrigin}/attack.html?target=${encodeURIComponent(target)}`);
    await page.locator('body[data-done="true"]').waitFor({ state: "attached" });
    return JSON.parse((await page.locator("body").getAttribute("data-result"))!) as { opened: boolean; messages: string[]; answered: number; fetched: string };
  } finally {
    await page.close();
  }
}

before(async () => {
  const dir = mkdtempSync(join(tmpdir(), "codemode-console-guard-"));
  const rules = join(dir, "rules.yaml");
  writeFileSync(rules, "rules:\n  - tool: deploy\n    action: ask\n    reason: deploys need a person\n");
  registry = await startService("registry_service", "registry listening on port ", {
    CODEMODE_REGISTRY_HISTORY_PATH: ":memory:",
    CODEMODE_REGISTRY_POLICY_RULES: rules,
  });
  client = new RegistryClient(`127.0.0.1:${registry.port}`, { timeoutMs: 10_000, executeTimeoutMs: 60_000 });
  await client.createAgent("console-guard", { mode: "both", selfModification: true });
  provider = new ToolProvider(client, "ops")
    .tool({ name: "deploy", description: "Deploys a service." }, (args) => `deployed ${(args as JsonObject).service as string}`)
    .tool({ name: "lookup", description: "Looks a value up.", concurrencySafe: true }, (args) => ({ echoed: args }));
  await provider.start();
  const looked = await client.executeToolCall({ agent, toolName: "lookup", arguments: { secret: SECRET } }).result;
  assert.ok(!looked.isError, looked.error?.message);

  con = await startConsole(`127.0.0.1:${registry.port}`, agent);
  attacker = createServer((req, res) => {
    res.writeHead(req.url?.startsWith("/attack.html") ? 200 : 404, { "content-type": "text/html" });
    res.end(ATTACK_PAGE);
  });
  await new Promise<void>((r) => attacker.listen(0, "127.0.0.1", () => r()));
  attackPort = (attacker.address() as AddressInfo).port;
  browser = await launchChromium(["--host-resolver-rules=MAP evil.example 127.0.0.1"]);
  person = await browser.newContext();
  personPage = await person.newPage();
  personPage.setDefaultTimeout(WAIT_MS);
  await personPage.goto(con.url);
  await personPage.locator('body[data-connected="true"]').waitFor();
  const held = (await person.cookies()).find((c) => c.name === `codemode-console-${con.port}`);
  cookie = held ? `${held.name}=${held.value}` : "";
});

after(async () => {
  await browser?.close();
  await con?.stop();
  await new Promise((r) => (attacker ? attacker.close(r) : r(undefined)));
  await provider?.close();
  client?.close();
  await stopService(registry);
});

describe("the console's guard", () => {
  it("exchanges the printed URL's key for an HttpOnly, SameSite=Strict cookie and redirects to the clean URL", async () => {
    const context = await browser!.newContext();
    try {
      const page = await context.newPage();
      page.setDefaultTimeout(WAIT_MS);
      const response = (await page.goto(con.url))!;
      assert.equal(page.url(), `${con.origin}/`); // the key is not in the address bar
      const exchange = response.request().redirectedFrom();
      assert.ok(exchange, "the key URL redirects");
      assert.equal(exchange.url(), con.url);
      const exchanged = (await exchange.response())!;
      assert.equal(exchanged.status(), 303);
      assert.equal(exchanged.headers()["cache-control"], "no-store");
      assert.equal(exchanged.headers()["referrer-policy"], "no-referrer");
      const key = new URL(con.url).searchParams.get("key")!;
      assert.ok(key.length >= 40, `an unguessable key, not ${key}`);
      const cookies = await context.cookies();
      assert.equal(cookies.length, 1);
      assert.deepEqual([cookies[0]!.name, cookies[0]!.httpOnly, cookies[0]!.sameSite], [`codemode-console-${con.port}`, true, "Strict"]);
      assert.notEqual(cookies[0]!.value, key); // the key is not what travels with each request
      await page.locator('body[data-connected="true"]').waitFor();
      assert.equal(await page.evaluate("document.cookie"), ""); // scripts cannot read it
    } finally {
      await context.close();
    }
  });

  it("serves nothing, and opens no WebSocket, to a browser without the session", async () => {
    const context = await browser!.newContext();
    try {
      const page = await context.newPage();
      for (const path of ["/", "/app.js", "/console.css", `/?key=not-the-key`]) {
        const response = (await page.goto(`${con.origin}${path}`))!;
        assert.equal(response.status(), 403, path);
        assert.doesNotMatch(await response.text(), /Codemode console|WebSocket\(/, path);
      }
      assert.deepEqual(await context.cookies(), []); // a wrong key sets nothing
      const result = await attack(context, `http://127.0.0.1:${attackPort}`, `127.0.0.1:${con.port}`);
      assert.deepEqual([result.opened, result.messages], [false, []]);
    } finally {
      await context.close();
    }
    assert.deepEqual(await socket({ origin: con.origin }), { status: 403 });
    assert.deepEqual(await socket({ origin: con.origin, cookie: `codemode-console-${con.port}=forged` }), { status: 403 });
  });

  it("keeps a page on another origin from opening the WebSocket, reading the history or answering an approval", async () => {
    const call = client.executeToolCall({ agent, toolName: "deploy", arguments: { service: "web" } });
    const row = personPage.locator('#approvals li[data-tool="deploy"]');
    await row.waitFor();
    // The person's own browser, signed in: it sends the cookie to 127.0.0.1 whatever the port.
    const result = await attack(person, `http://127.0.0.1:${attackPort}`, `127.0.0.1:${con.port}`);
    assert.equal(result.opened, false);
    assert.deepEqual(result.messages, []);
    assert.equal(result.answered, 0);
    assert.doesNotMatch(result.fetched, new RegExp(SECRET));
    assert.match(result.fetched, /^error: /); // no CORS grant: the page cannot read a byte
    // The approval is still the person's: their Reject is the answer the registry took.
    await row.locator('[data-action="reject"]').click();
    const settled = await call.result;
    assert.equal(settled.isError, true, `the attacker's "allow" ran the call: ${settled.text}`);
    await row.waitFor({ state: "detached" });
  });

  it("refuses a rebinding name (Host) on the page and on the WebSocket", async () => {
    const page = await person.newPage();
    try {
      const response = (await page.goto(`http://evil.example:${con.port}/`))!;
      assert.equal(response.status(), 421);
      assert.doesNotMatch(await response.text(), /Codemode console/);
    } finally {
      await page.close();
    }
    // What a rebound page would send: its own name as Host and Origin, and a cookie it got.
    const rebound = `evil.example:${con.port}`;
    assert.equal((await http("/", { host: rebound, cookie })).status, 421);
    assert.deepEqual(await socket({ host: rebound, origin: `http://${rebound}`, cookie }), { status: 421 });
    const result = await attack(person, `http://evil.example:${attackPort}`, rebound);
    assert.deepEqual([result.opened, result.messages], [false, []]);
  });

  it("checks Origin and fetch metadata on every request, whatever its path", async () => {
    assert.ok(cookie, "the person's browser holds the session");
    const host = `127.0.0.1:${con.port}`;
    const ok = await socket({ host, origin: con.origin, cookie });
    assert.ok("first" in ok && ok.first.type === "hello", JSON.stringify(ok)); // the control
    for (const origin of [`http://127.0.0.1:${attackPort}`, "null", `http://localhost:${con.port}`, ""]) {
      assert.deepEqual(await socket({ host, origin, cookie }), { status: 403 }, `Origin ${origin}`);
    }
    const served = await http("/app.js", { host, cookie });
    assert.equal(served.status, 200);
    assert.equal(served.headers["x-content-type-options"], "nosniff");
    assert.equal(served.headers["referrer-policy"], "no-referrer");
    const refused: [string, Record<string, string>, string][] = [
      ["/", { origin: "null" }, "GET"], // a sandboxed frame's request
      ["/", { origin: `http://127.0.0.1:${attackPort}` }, "GET"],
      ["/", {}, "POST"], // a change without Origin
      ["/app.js", { "sec-fetch-site": "same-site", "sec-fetch-mode": "no-cors", "sec-fetch-dest": "script" }, "GET"],
      ["/", { "sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate", "sec-fetch-dest": "iframe" }, "GET"],
    ];
    for (const [path, headers, method] of refused) {
      const answer = await http(path, { host, cookie, ...headers }, method);
      assert.equal(answer.status, 403, `${method} ${path} ${JSON.stringify(headers)}`);
      assert.equal(answer.body.includes("<script"), false);
    }
    // A person following a link from elsewhere still gets the page (the cookie is what counts).
    const link = await http("/", { host, cookie, "sec-fetch-site": "same-site", "sec-fetch-mode": "navigate", "sec-fetch-dest": "document" });
    assert.equal(link.status, 200);
  });

  it("sends a strict CSP with the page: an injected script does not run", async () => {
    const response = (await personPage.reload())!;
    await personPage.locator('body[data-connected="true"]').waitFor();
    const csp = response.headers()["content-security-policy"] ?? "";
    const directives = new Map(csp.split(";").map((d) => d.trim().split(/\s+/)).map(([name, ...values]) => [name!, values]));
    assert.deepEqual(directives.get("default-src"), ["'none'"]);
    assert.deepEqual(directives.get("connect-src"), [`ws://127.0.0.1:${con.port}`]);
    assert.deepEqual(directives.get("frame-ancestors"), ["'none'"]);
    assert.deepEqual(directives.get("base-uri"), ["'none'"]);
    assert.deepEqual(directives.get("form-action"), ["'none'"]);
    assert.deepEqual(directives.get("style-src"), ["'self'"]);
    assert.equal(directives.get("script-src")?.[0], "'self'");
    assert.ok(!csp.includes("unsafe-inline"), csp);
    assert.equal(response.headers()["x-frame-options"], "DENY");
    assert.equal(response.headers()["x-content-type-options"], "nosniff");
    // Run from outside the page (Playwright's evaluation is not subject to the page's CSP):
    // the element it appends is, and the violation event is the latch.
    const blocked = await personPage.evaluate(`new Promise((resolve) => {
      document.addEventListener("securitypolicyviolation",
        (e) => resolve({ directive: e.effectiveDirective, ran: window.injected === true }), { once: true });
      const script = document.createElement("script");
      script.textContent = "window.injected = true;";
      document.body.append(script);
    })`);
    assert.deepEqual(blocked, { directive: "script-src-elem", ran: false });
    assert.equal(await personPage.evaluate("window.injected"), undefined);
  });
});
