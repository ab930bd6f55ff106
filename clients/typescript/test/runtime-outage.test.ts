/**
 * A `runCode` that no code runtime takes (the registry's runtime address has nothing listening):
 * the real registry ends the call with UNAVAILABLE, reason CODE_RUNTIME_UNAVAILABLE, metadata
 * `phase: connect`, and a RetryInfo the client exposes as `retryDelay` (milliseconds).
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { CodemodeError, PresentationMode, RegistryClient, status } from "../src/index";
import { freePort, startRegistry, stopService, type Service } from "./services";

let registry: Service | undefined;
let client: RegistryClient;

before(async () => {
  const runtimePort = await freePort(); // nothing listens there
  registry = await startRegistry(0, {
    CODEMODE_REGISTRY_RUNTIME_TARGETS: JSON.stringify([`127.0.0.1:${runtimePort}`]),
    CODEMODE_REGISTRY_RUNTIME_RETRY_DELAY_S: "1.5",
  });
  client = new RegistryClient(`127.0.0.1:${registry.port}`, { timeoutMs: 10_000, executeTimeoutMs: 30_000 });
});

after(async () => {
  client?.close();
  await stopService(registry);
});

describe("a code runtime outage", () => {
  it("is UNAVAILABLE CODE_RUNTIME_UNAVAILABLE with the retry delay", async () => {
    await client.createAgent("outage", { mode: PresentationMode.PRESENTATION_MODE_CODE });
    const call = client.runCode("agents/outage", "return 1", "nothing will run this");
    await assert.rejects(call.result, (e: unknown) => {
      assert.ok(e instanceof CodemodeError);
      assert.equal(e.code, status.UNAVAILABLE);
      assert.equal(e.reason, "CODE_RUNTIME_UNAVAILABLE");
      assert.equal(e.domain, "codemode.registry");
      assert.equal(e.metadata.phase, "connect");
      assert.equal(e.retryDelay, 1500);
      return true;
    });
  });
});
