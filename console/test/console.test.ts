/**
 * The web console end to end: the REAL runtime and registry (Python), a tool provider, the
 * console started by `codemode console`, and the page in headless Chromium (Debian's, driven by
 * Playwright). The person's clicks approve a client-bearing plugin (its Client half renders in
 * its own frame in its slot and reaches the Host half's handler through `host.call`), reject another (the
 * steering record appears), allow an ordinary tool call, stop a plugin from the panel, and a
 * `run_code` trajectory is drawn as a tree with its program, each call's arguments, result or error
 * text and timings (a result kept aside in history fetched in full on request). A failure leaves a screenshot and the page's HTML
 * under console/test-output/.
 */
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { after, before, describe, it } from "node:test";
import type { Browser, BrowserContext, FrameLocator, Locator, Page } from "playwright-core";
import { RegistryClient, ToolFailed, ToolProvider, type JsonObject, type JsonValue } from "@codemode/client";
import { stopService, type Service } from "@codemode/client/dist/test/services";
import { launchChromium, startConsole, startDeployStack, type RunningConsole } from "./stack";

const OUTPUT = resolve(__dirname, "..", "..", "test-output");
const WAIT_MS = 30_000; // generous: the machine is shared and loaded

const HOST = `def greet(args):
    return {"greeting": f"hello, {args['name']}"}

async def apply(ctx):
    harness.handle("greet", greet)

return apply
`;
// A Client half as docs/cordis.md describes it: an async body given host, console, mount, styles.
const CLIENT = `const { greeting } = await host.call("greet", { name: "console" });
return {
  apply(ctx) {
    const p = document.createElement("p");
    p.className = "greeting " + styles.card;
    p.textContent = greeting;
    const again = document.createElement("button");
    again.className = "again";
    again.textContent = "greet again";
    again.onclick = async () => { p.textContent = (await host.call("greet", { name: "button" })).greeting; };
    mount.append(p, again);
    console.log("rendered", ctx.pluginRunId);
    return () => console.log("unloaded");
  },
};
`;

// A Client half sees its own frame: its document is its mount's, its origin opaque, and the
// page's React (or anything else of the page) is not among its parameters.
const FRAME_CLIENT = `const seen = {
  params: [typeof host, typeof console, typeof mount, typeof styles, typeof React, typeof ReactDOM],
  ownDocument: mount.ownerDocument === document && mount === document.body,
  origin: self.origin,
  framed: window.parent !== window,
};
return (ctx) => {
  const pre = document.createElement("pre");
  pre.className = "seen";
  pre.textContent = JSON.stringify(seen);
  mount.append(pre);
};
`;

let runtime: Service | undefined;
let registry: Service | undefined;
let consoleProcess: RunningConsole | undefined;
let client: RegistryClient;
let provider: ToolProvider | undefined;
let browser: Browser | undefined;
let page: Page;
const agent = "agents/console-e2e";
/** The plugin the first test approves; the panel test stops, runs and removes it. */
let greeter = "";

async function tool(toolName: string, args: JsonValue): Promise<JsonObject> {
  const result = await client.executeToolCall({ agent, toolName, arguments: args }).result;
  assert.ok(!result.isError, result.error?.message);
  return result.value as JsonObject;
}

async function defineAndRun(
  idPrefix: string,
  name: string,
  purpose: string,
  clientHalf = CLIENT,
): Promise<{ pluginId: string; packageId: string }> {
  const defined = await tool("cordis_define", { plugin: { kind: "new", idPrefix }, name, purpose, code: { host: HOST, client: clientHalf } });
  const pluginId = defined.pluginId as string;
  const packageId = defined.packageId as string;
  const run = await tool("cordis_run", { pluginId, packageId, mode: "run" });
  assert.equal(run.status, "awaiting-approval"); // the tool returned; the page decides later
  return { pluginId, packageId };
}

before(async () => {
  // Results over 4 KiB are kept aside in history: the trajectory shows a preview, then all of it.
  ({ runtime, registry } = await startDeployStack({ CODEMODE_REGISTRY_HISTORY_MAX_INLINE_BYTES: "4096" }));
  client = new RegistryClient(`127.0.0.1:${registry.port}`, { timeoutMs: 10_000, executeTimeoutMs: 60_000 });
  await client.createAgent("console-e2e", { mode: "both", selfModification: true });
  provider = new ToolProvider(client, "ops")
    .tool({ name: "deploy", description: "Deploys a service." }, (args) => `deployed ${(args as JsonObject).service as string}`)
    .tool({ name: "lookup", description: "Looks a number up.", concurrencySafe: true }, (args) => ({ n: (args as JsonObject).n as number }))
    .tool({ name: "probe", description: "Probes a host." }, (args) => {
      // An error text with markup in it: the page must show it as text.
      throw new ToolFailed(`${(args as JsonObject).host as string} is down <img src=x data-injected=1> for maintenance`, "HOST_DOWN");
    })
    .tool({ name: "dump", description: "Dumps a long log." }, () => `${"log line\n".repeat(1000)}END OF LOG`);
  await provider.start();
  consoleProcess = await startConsole(`127.0.0.1:${registry.port}`, agent);
  browser = await launchChromium();
  page = await browser.newPage();
  page.setDefaultTimeout(WAIT_MS);
  await page.goto(consoleProcess.url); // the printed URL: its key signs this browser in
  await page.locator('body[data-connected="true"]').waitFor();
});

after(async () => {
  await browser?.close();
  await consoleProcess?.stop();
  await provider?.close();
  client?.close();
  await stopService(registry);
  await stopService(runtime);
});

/** The document of a slot's Client half (its frame). */
function inFrame(slot: Locator): FrameLocator {
  return slot.frameLocator("iframe[data-client-frame]");
}

/** Runs a step; on failure keeps a screenshot and the page's HTML, then fails. */
async function step(name: string, body: () => Promise<void>): Promise<void> {
  try {
    await body();
  } catch (e) {
    mkdirSync(OUTPUT, { recursive: true });
    const file = join(OUTPUT, name.replace(/[^a-z0-9]+/gi, "-"));
    await page.screenshot({ path: `${file}.png`, fullPage: true }).catch(() => undefined);
    writeFileSync(`${file}.html`, await page.content().catch(() => ""));
    writeFileSync(`${file}.console.log`, consoleProcess?.log() ?? "");
    throw e;
  }
}

describe("the web console", () => {
  it("approves a client-bearing plugin: its Client half renders and reaches its Host handler", () =>
    step("approve", async () => {
      const { pluginId, packageId } = await defineAndRun("greet", "Greeter", "Greets in the page.");
      greeter = pluginId;
      const request = page.locator(`#requests li[data-plugin="${pluginId}"]`);
      await request.waitFor();
      assert.equal(await request.locator(".name").textContent(), "Greeter");
      assert.equal(await request.locator(".purpose").textContent(), "Greets in the page.");
      await request.locator('[data-action="approve-once"]').click();

      const slot = page.locator(`[data-plugin-slot="${pluginId}"]`);
      await inFrame(slot).locator(".greeting", { hasText: "hello, console" }).waitFor(); // host.call at load
      await inFrame(slot).locator("button.again").click();
      await inFrame(slot).locator(".greeting", { hasText: "hello, button" }).waitFor(); // host.call from a click
      await request.waitFor({ state: "detached" });
      await page.locator(`#plugins li[data-plugin="${pluginId}"][data-state="running"]`).waitFor();
      const steer = page.locator('#messages li[data-kind="agent/steer"]', { hasText: `${pluginId}/${packageId}` });
      await steer.waitFor();
      assert.match((await steer.locator("pre").textContent()) ?? "", /completed successfully\. currentPackageId is pkg-\d+/);
      const state = await tool("cordis_inspect_self", { pluginId });
      assert.equal(state.state, "running");
      assert.equal(state.currentPackageId, packageId);
    }));

  it("runs a Client half in its own opaque-origin frame, without the page's React; stopping removes the frame", () =>
    step("frame", async () => {
      const { pluginId } = await defineAndRun("frame", "Framed", "Shows what it can see.", FRAME_CLIENT);
      await page.locator(`#requests li[data-plugin="${pluginId}"] [data-action="approve-once"]`).click();
      const slot = page.locator(`[data-plugin-slot="${pluginId}"]`);
      const seen = JSON.parse((await inFrame(slot).locator("pre.seen").textContent()) ?? "") as JsonObject;
      assert.deepEqual(seen, {
        params: ["object", "object", "object", "object", "undefined", "undefined"],
        ownDocument: true,
        origin: "null",
        framed: true,
      });
      assert.equal(await slot.locator("iframe").getAttribute("sandbox"), "allow-scripts");
      await tool("cordis_stop", { pluginId });
      await slot.locator("iframe").waitFor({ state: "detached" }); // unloading removes the frame
    }));

  it("rejects another plugin: nothing runs and the steering record appears", () =>
    step("reject", async () => {
      const { pluginId, packageId } = await defineAndRun("nope", "Nope", "Should not run.");
      const request = page.locator(`#requests li[data-plugin="${pluginId}"]`);
      await request.locator('[data-action="reject"]').click();
      const steer = page.locator('#messages li[data-kind="agent/steer"]', { hasText: "The user rejected" });
      await steer.waitFor();
      assert.match(
        (await steer.locator("pre").textContent()) ?? "",
        new RegExp(`^The user rejected Cordis run ${pluginId}/${packageId} \\(run-\\d+\\)\\. Do not request the same activation again unless the user asks\\.$`),
      );
      await page.locator(`#plugins li[data-plugin="${pluginId}"][data-state="rejected"]`).waitFor();
      assert.equal(await page.locator(`[data-plugin-slot="${pluginId}"]`).count(), 0);
      assert.equal((await tool("cordis_inspect_self", { pluginId })).state, "failed");
    }));

  it("answers an ordinary tool approval from the page", () =>
    step("tool-approval", async () => {
      const call = client.executeToolCall({ agent, toolName: "deploy", arguments: { service: "web" } });
      const row = page.locator('#approvals li[data-tool="deploy"]');
      await row.waitFor();
      assert.match((await row.textContent()) ?? "", /deploys need a person/);
      await row.locator('[data-action="allow"]').click();
      const result = await call.result;
      assert.ok(!result.isError, result.error?.message);
      assert.equal(result.value, "deployed web");
      await row.waitFor({ state: "detached" });

      const refused = client.executeToolCall({ agent, toolName: "deploy", arguments: { service: "db" } });
      await page.locator('#approvals li[data-tool="deploy"] [data-action="reject"]').click();
      assert.equal((await refused.result).isError, true);
    }));

  it("draws a run_code trajectory live: the tree, the program, each call's arguments, result, error text and timings", () =>
    step("trajectory", async () => {
      const program = [
        'a = await tools.lookup({"n": 1})',
        'b = await tools.lookup({"n": 2, "big": 12345678901234567890})',
        "try:",
        '    await tools.probe({"host": "db-7"})',
        "except ToolCallError:",
        "    pass",
        'log = await tools.dump({"pad": "x" * 25000})',
        'return a["n"] + b["n"]',
      ].join("\n");
      const result = await client.runCode(agent, program, "two lookups, a probe and a log", { callId: "traj-1" }).result;
      assert.ok(!result.isError, result.error?.message);
      const call = page.locator('#calls section[data-call-id="traj-1"][data-outcome="ok"]');
      await call.waitFor();
      await call.locator("pre.tree", { hasText: "traj-1:code:4" }).waitFor();
      const lines = ((await call.locator("pre.tree").textContent()) ?? "").split("\n");
      const ms = String.raw`  \d+\.\d ms`;
      assert.equal(lines.length, 5, lines.join("\n"));
      assert.match(lines[0]!, new RegExp(`^run_code  traj-1  ok${ms}$`));
      assert.match(lines[1]!, new RegExp(`^├─ lookup  traj-1:code:1  ok${ms}$`));
      assert.match(lines[2]!, new RegExp(`^├─ lookup  traj-1:code:2  ok${ms}$`));
      assert.match(lines[3]!, new RegExp(`^├─ probe  traj-1:code:3  error HOST_DOWN${ms}$`));
      assert.match(lines[4]!, new RegExp(`^└─ dump  traj-1:code:4  ok${ms}$`));

      // The outer call: the program's source exactly as sent, its description, its result.
      const outer = call.locator('li.step[data-call-id="traj-1"]');
      assert.equal(await outer.locator("pre.program").textContent(), program);
      assert.equal(await outer.locator(".description").textContent(), "two lookups, a probe and a log");
      assert.equal(await outer.locator("pre.result").textContent(), "3");
      assert.match((await outer.locator(".timing").textContent()) ?? "", /^took \d+\.\d ms$/);

      // A nested call: its arguments (digit for digit), its result, when it started and how long it took.
      const second = call.locator('li.step[data-call-id="traj-1:code:2"]');
      assert.equal(await second.locator("pre.arguments").textContent(), '{\n  "n": 2,\n  "big": 12345678901234567890\n}');
      assert.match((await second.locator("pre.result").textContent()) ?? "", /"n": 2/);
      assert.match((await second.locator(".timing").textContent()) ?? "", /^started at \+\d+\.\d ms, took \d+\.\d ms$/);

      // The failed call: its error code and text, shown as text (the markup in it is not HTML).
      const probe = call.locator('li.step[data-call-id="traj-1:code:3"][data-outcome="error HOST_DOWN"]');
      assert.equal(await probe.locator("pre.arguments").textContent(), '{\n  "host": "db-7"\n}');
      assert.equal(await probe.locator(".error-block .value-title").textContent(), "error HOST_DOWN");
      const errorText = (await probe.locator("pre.error").textContent()) ?? "";
      assert.match(errorText, /db-7 is down <img src=x data-injected=1> for maintenance/);
      assert.equal(await page.locator("[data-injected]").count(), 0);

      // A result kept aside, and arguments longer than the page shows at first: both whole on request.
      const dump = call.locator('li.step[data-call-id="traj-1:code:4"]');
      assert.doesNotMatch((await dump.locator("pre.result").textContent()) ?? "", /END OF LOG/);
      assert.match((await dump.locator("pre.arguments").textContent()) ?? "", /^\{\n {2}"pad": "x+\n… \(\d+ more characters\)$/);
      await dump.locator('[data-action="show-all"]').click();
      await call.locator('li.step[data-call-id="traj-1:code:4"] pre.result', { hasText: "END OF LOG" }).waitFor();
      const full = (await call.locator('li.step[data-call-id="traj-1:code:4"] pre.result').textContent()) ?? "";
      assert.equal(full, `${"log line\n".repeat(1000)}END OF LOG`);
      const padded = await call.locator('li.step[data-call-id="traj-1:code:4"] pre.arguments').textContent();
      assert.equal(padded, `{\n  "pad": "${"x".repeat(25000)}"\n}`);
      assert.equal(await call.locator('li.step[data-call-id="traj-1:code:4"] [data-action="show-all"]').count(), 0);

      // What the verb refuses: a seq that is not one, and one this agent's history does not have.
      const answers = (await page.evaluate(`(async () => {
        const socket = new WebSocket("ws://" + location.host + "/ws");
        const replies = new Map();
        await new Promise((opened) => socket.addEventListener("open", opened, { once: true }));
        const done = new Promise((all) =>
          socket.addEventListener("message", (e) => {
            const message = JSON.parse(e.data);
            if (message.type === "reply") replies.set(message.id, message.result);
            if (replies.size === 3) all();
          }),
        );
        for (const [id, seq] of [[1, "abc"], [2, "0"], [3, "999999999"]]) {
          socket.send(JSON.stringify({ id, verb: "recordContent", args: { seq } }));
        }
        await done;
        socket.close();
        return [1, 2, 3].map((id) => replies.get(id));
      })()`)) as unknown[];
      assert.deepEqual(answers.slice(0, 2), [
        { ok: false, message: "seq must be a record's seq" },
        { ok: false, message: "seq must be a record's seq" },
      ]);
      const missing = answers[2] as { ok: boolean; message: string };
      assert.equal(missing.ok, false);
      assert.match(missing.message, /NOT_FOUND/);
    }));

  it("publishes client inspect providers and answers the model's queries from the page", () =>
    step("inspect", async () => {
      const listed = await tool("cordis_inspect_list", {});
      const clients = (listed.providers as JsonObject[]).filter((p) => p.platform === "client");
      assert.deepEqual(clients.map((p) => p.id), ["Slots", "Theme"]);
      const query = (provider: string, method: string, input: JsonValue) =>
        tool("cordis_inspect_query", { platform: "client", provider, method, input });
      const slots = (await query("Slots", "listSubTree", { pluginId: greeter })).data as JsonObject;
      assert.deepEqual(slots.slots, [{ pluginId: greeter, pluginRunId: (slots.slots as JsonObject[])[0]!.pluginRunId!, state: "running", text: "hello, buttongreet again" }]);
      const tokens = ((await query("Theme", "listTokens", {})).data as JsonObject).tokens as JsonObject[];
      assert.ok(tokens.some((t) => t.name === "card" && t.className === "cm-card"));
    }));

  it("approves future versions: updates load without asking, one at a time; a failed Client half is absorbed", () =>
    step("future-versions", async () => {
      const version = (text: string): string =>
        `return { apply(ctx) { const p = document.createElement("p"); p.className = "version"; p.textContent = ${JSON.stringify(text)}; mount.append(p); } };`;
      const define = async (pluginId: string | undefined, client: string): Promise<{ pluginId: string; packageId: string }> => {
        const plugin: JsonObject = pluginId ? { kind: "existing", pluginId } : { kind: "new", idPrefix: "vers" };
        const out = await tool("cordis_define", { plugin, name: "Versions", purpose: "Shows its version.", code: { client } });
        return { pluginId: out.pluginId as string, packageId: out.packageId as string };
      };
      const first = await define(undefined, version("v1"));
      const pluginId = first.pluginId;
      assert.equal((await tool("cordis_run", { pluginId, packageId: first.packageId, mode: "run" })).status, "awaiting-approval");
      await page.locator(`#requests li[data-plugin="${pluginId}"] [data-action="approve-future"]`).click();
      const slot = page.locator(`[data-plugin-slot="${pluginId}"]`);
      await inFrame(slot).locator(".version", { hasText: "v1" }).waitFor();

      // A broken update: asked of nobody (the grant applies), its load fails and is settled so.
      const broken = await define(pluginId, 'return { apply() { throw new Error("no DOM for v2") } };');
      assert.equal((await tool("cordis_run", { pluginId, packageId: broken.packageId, mode: "update" })).status, "starting");
      const failed = page.locator('#messages li[data-kind="agent/steer"]', { hasText: `${pluginId}/${broken.packageId}` });
      await failed.waitFor();
      assert.match((await failed.locator("pre").textContent()) ?? "", /client-half-failed\nno DOM for v2\n/);
      await page.locator(`[data-plugin-slot="${pluginId}"][data-state="failed"]`).waitFor();
      assert.equal(await slot.locator("iframe").count(), 0); // v1 was torn down before v2 loaded

      // The queue absorbed the failure: the fixed package loads.
      const fixed = await define(
        pluginId,
        version("v3").replace("mount.append(p);", 'mount.append(p); const b = document.createElement("button"); b.className = "break"; b.onclick = () => ctx.reportError(new Error("render broke")); mount.append(b);'),
      );
      assert.equal((await tool("cordis_run", { pluginId, packageId: fixed.packageId, mode: "update" })).status, "starting");
      await page.locator(`[data-plugin-slot="${pluginId}"][data-state="running"]`).waitFor();
      assert.deepEqual(await inFrame(slot).locator(".version").allTextContents(), ["v3"]);
      assert.equal(await slot.locator("iframe").count(), 1);
      await page.locator(`#plugins li[data-plugin="${pluginId}"][data-state="running"]`).waitFor();
      assert.equal((await tool("cordis_inspect_self", { pluginId })).currentPackageId, fixed.packageId);

      // A render failure after the activation settled reaches the registry (kept per run) and the agent.
      await inFrame(slot).locator("button.break").click();
      await page.locator('#messages li[data-kind="agent/steer"]', { hasText: "render broke" }).waitFor();
      const view = await tool("cordis_inspect_self", { pluginId, packageId: fixed.packageId });
      const failure = ((view.runtime as JsonObject).client as JsonObject).renderFailure as JsonObject;
      assert.deepEqual([failure.phase, failure.message], ["client-render", "render broke"]);
    }));

  it("stops, runs and removes a plugin from the panel: its Client half follows and the agent is told", () =>
    step("panel", async () => {
      const pluginId = greeter;
      const row = page.locator(`#plugins li[data-plugin="${pluginId}"]`);
      const slot = page.locator(`[data-plugin-slot="${pluginId}"]`);
      await row.locator('[data-action="stop"]').click();
      await page.locator(`[data-plugin-slot="${pluginId}"][data-state="unloaded"]`).waitFor();
      assert.equal(await slot.locator("iframe").count(), 0); // its frame is gone
      await page.locator('#messages li[data-kind="agent/inject"]', { hasText: `The user stopped Cordis Plugin ${pluginId}` }).waitFor();
      assert.equal((await tool("cordis_inspect_self", { pluginId })).state, "stopped");

      await row.locator('[data-action="run"]').click(); // a direct gesture: no request to approve
      await inFrame(slot).locator(".greeting", { hasText: "hello, console" }).waitFor();
      await page.locator('#messages li[data-kind="agent/inject"]', { hasText: `The user ran Cordis run ${pluginId}/` }).waitFor();
      assert.equal((await tool("cordis_inspect_self", { pluginId })).state, "running");

      await page.locator(`#plugins li[data-plugin="${pluginId}"] [data-action="remove"]`).click();
      await slot.waitFor({ state: "detached" });
      await row.waitFor({ state: "detached" });
      await page.locator('#messages li[data-kind="agent/inject"]', { hasText: `The user removed Cordis Plugin ${pluginId}` }).waitFor();
      const gone = await client.executeToolCall({ agent, toolName: "cordis_inspect_self", arguments: { pluginId } }).result;
      assert.equal(gone.isError, true);
    }));
});
