/**
 * The console against a registry with authorization on (TLS, client certificates required,
 * static bearer tokens, grants): started with `--tls-ca/--tls-cert/--tls-key` and `--token-file`
 * it is the token's principal, `token:dana`, which may `execute` and use `cordis` on agents/dana
 * but not `approve`. Its page runner attaches and answers an activation, its history watch
 * draws calls, and its approver is refused by the registry (the page says so): a tool approval
 * of the agent finds no approver, and the call is not run. Real registry, real Chromium.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { Browser, Page } from "playwright-core";
import { RegistryClient, ToolProvider, tlsCredentials, type JsonObject } from "@codemode/client";
import { PYTHON, REPO_ROOT, startService, stopService, type Service } from "@codemode/client/dist/test/services";
import { launchChromium, startConsole, type RunningConsole } from "./stack";

const WAIT_MS = 30_000;
const DANA_TOKEN = "dana-console-token-0123456789";
const DRIVER_TOKEN = "driver-token-0123456789";
const agent = "agents/dana";

const sha256 = (text: string): string => createHash("sha256").update(text).digest("hex");

let registry: Service | undefined;
let driver: RegistryClient;
let provider: ToolProvider | undefined;
let con: RunningConsole | undefined;
let browser: Browser | undefined;
let page: Page;

before(async () => {
  const dir = mkdtempSync(join(tmpdir(), "codemode-console-auth-"));
  // The test CA of tests/auth: a server certificate for 127.0.0.1 and a client certificate.
  execFileSync(
    PYTHON,
    [
      "-c",
      "import sys; from pathlib import Path; from tests.auth.certs import Authority\n" +
        "d = Path(sys.argv[1]); a = Authority(); (d / 'ca.pem').write_bytes(a.pem)\n" +
        "a.server().write(d, 'server'); a.client().write(d, 'client')",
      dir,
    ],
    { cwd: REPO_ROOT },
  );
  writeFileSync(join(dir, "dana.token"), `${DANA_TOKEN}\n`);
  const rules = join(dir, "rules.yaml");
  writeFileSync(rules, "rules:\n  - tool: deploy\n    action: ask\n    reason: deploys need a person\n");
  registry = await startService("registry_service", "registry listening on port ", {
    CODEMODE_REGISTRY_HISTORY_PATH: ":memory:",
    CODEMODE_REGISTRY_POLICY_RULES: rules,
    CODEMODE_REGISTRY_TLS_CERT_FILE: join(dir, "server.pem"),
    CODEMODE_REGISTRY_TLS_KEY_FILE: join(dir, "server.key"),
    CODEMODE_REGISTRY_TLS_CLIENT_CA_FILE: join(dir, "ca.pem"),
    CODEMODE_REGISTRY_AUTH: JSON.stringify({
      tokens: [
        { principal: "dana", sha256: sha256(DANA_TOKEN) },
        { principal: "driver", sha256: sha256(DRIVER_TOKEN) },
      ],
    }),
    CODEMODE_REGISTRY_GRANTS: JSON.stringify([
      { principals: ["token:dana"], permissions: ["execute", "cordis"], resources: [agent] },
      { principals: ["token:driver"], permissions: ["execute", "cordis", "register"], resources: [agent, "global"] },
    ]),
    CODEMODE_REGISTRY_AGENTS: JSON.stringify([{ id: "dana", mode: "both", self_modification: true }]),
  });
  const address = `localhost:${registry.port}`; // the name in the server's certificate
  const tls = { ca: readFileSync(join(dir, "ca.pem")), cert: readFileSync(join(dir, "client.pem")), key: readFileSync(join(dir, "client.key")) };
  driver = new RegistryClient(address, {
    credentials: tlsCredentials(tls),
    metadata: { authorization: `Bearer ${DRIVER_TOKEN}` },
    timeoutMs: 10_000,
    executeTimeoutMs: 60_000,
  });
  provider = new ToolProvider(driver, "ops")
    .tool({ name: "deploy", description: "Deploys a service." }, (args) => `deployed ${(args as JsonObject).service as string}`)
    .tool({ name: "lookup", description: "Looks a number up.", concurrencySafe: true }, (args) => ({ n: (args as JsonObject).n as number }));
  await provider.start();
  con = await startConsole(address, agent, [
    "--tls-ca",
    join(dir, "ca.pem"),
    "--tls-cert",
    join(dir, "client.pem"),
    "--tls-key",
    join(dir, "client.key"),
    "--token-file",
    join(dir, "dana.token"),
  ]);
  browser = await launchChromium();
  page = await browser.newPage();
  page.setDefaultTimeout(WAIT_MS);
  await page.goto(con.url);
  await page.locator('body[data-connected="true"]').waitFor();
});

after(async () => {
  await browser?.close();
  await con?.stop();
  await provider?.close();
  driver?.close();
  await stopService(registry);
});

describe("the console against a registry with authorization on", () => {
  it("watches the history and runs the page as its principal", async () => {
    const result = await driver.executeToolCall({ agent, toolName: "lookup", arguments: { n: 4 }, callId: "auth-1" }).result;
    assert.ok(!result.isError, result.error?.message);
    await page.locator('#calls section[data-call-id="auth-1"][data-outcome="ok"]').waitFor();

    const defined = await driver.executeToolCall({
      agent,
      toolName: "cordis_define",
      arguments: {
        plugin: { kind: "new", idPrefix: "hello" },
        name: "Hi",
        purpose: "Says hi.",
        code: { client: 'return { apply() { const p = document.createElement("p"); p.className = "hi"; p.textContent = "hi"; mount.append(p); } };' },
      },
    }).result;
    assert.ok(!defined.isError, defined.error?.message);
    const { pluginId, packageId } = defined.value as { pluginId: string; packageId: string };
    const run = await driver.executeToolCall({ agent, toolName: "cordis_run", arguments: { pluginId, packageId, mode: "run" } }).result;
    assert.equal((run.value as JsonObject).status, "awaiting-approval");
    await page.locator(`#requests li[data-plugin="${pluginId}"] [data-action="approve-once"]`).click();
    const slot = page.locator(`[data-plugin-slot="${pluginId}"][data-state="running"]`);
    await slot.frameLocator("iframe[data-client-frame]").locator(".hi").waitFor(); // the half's own frame
  });

  it("is refused by the registry what its principal may not do: approving tool calls", async () => {
    const notice = page.locator('#notices li[data-stream="approver"]');
    await notice.waitFor();
    // The registry's own refusal, naming the principal: the console asked, as token:dana.
    assert.match((await notice.textContent()) ?? "", /token:dana may not approve .*\(PERMISSION_DENIED, PERMISSION_DENIED\)/);
    const call = await driver.executeToolCall({ agent, toolName: "deploy", arguments: { service: "web" } }).result;
    assert.equal(call.isError, true, "a deploy ran with no approver allowed to approve it");
    // No approver may answer for agents/dana: the registry settles it unavailable, nothing runs.
    assert.equal(call.error?.code, "DENIED");
    assert.match(call.error?.message ?? "", /no approval channel is available/);
    assert.equal(await page.locator('#approvals li[data-tool="deploy"]').count(), 0);
  });
});
