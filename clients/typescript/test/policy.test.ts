/**
 * Client policies that the real services cannot provoke on demand: one deadline over all the
 * attempts of a call, the service-config retry policy (idempotent reads, the server's pushback),
 * watch resumption, and rich error decoding.
 * A stand-in RegistryService (grpc-js, in-process, 127.0.0.1:0) scripts the failures.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Metadata, Server, ServerCredentials, status, type ServiceError, type UntypedServiceImplementation } from "@grpc/grpc-js";
import { CodemodeError, RegistryClient } from "../src/index";
import { HistoryRecord } from "../src/gen/codemode/registry/v1/history";
import { RegistryServiceService } from "../src/gen/codemode/registry/v1/registry_service";
import { Agent } from "../src/gen/codemode/registry/v1/scope";
import { ErrorInfo } from "../src/gen/google/rpc/error_details";
import { Status } from "../src/gen/google/rpc/status";

const calls: Record<string, number> = {};
const deadlines: number[] = [];
let getAgentFailures = 0;
const attemptTimes: number[] = [];
const watchRequests: bigint[] = [];
let server: Server;
let client: RegistryClient;

function unavailable(): ServiceError {
  return Object.assign(new Error("down"), { code: status.UNAVAILABLE, details: "down", metadata: new Metadata() });
}

function count(name: string, deadline: unknown): void {
  calls[name] = (calls[name] ?? 0) + 1;
  deadlines.push(deadline instanceof Date ? deadline.getTime() : Number(deadline));
}

before(async () => {
  const impl: UntypedServiceImplementation = {
    getAgent(call: any, callback: any) {
      count("getAgent", call.getDeadline());
      attemptTimes.push(Date.now());
      if (call.request.name === "agents/stall") {
        setTimeout(() => callback(unavailable()), 1500);
        return;
      }
      if (call.request.name === "agents/pushback" && attemptTimes.length === 1) {
        const md = new Metadata();
        md.set("grpc-retry-pushback-ms", "400");
        callback({ code: status.UNAVAILABLE, details: "later", metadata: md });
        return;
      }
      if (call.request.name === "agents/rich") {
        const info = ErrorInfo.fromPartial({ reason: "AGENT_NOT_FOUND", domain: "codemode.registry", metadata: { agent: "agents/rich" } });
        const rich = Status.fromPartial({
          code: status.NOT_FOUND,
          message: "agent agents/rich not found",
          details: [{ typeUrl: "type.googleapis.com/google.rpc.ErrorInfo", value: Buffer.from(ErrorInfo.encode(info).finish()) }],
        });
        const md = new Metadata();
        md.set("grpc-status-details-bin", Buffer.from(Status.encode(rich).finish()));
        callback({ code: status.NOT_FOUND, details: "agent agents/rich not found", metadata: md });
        return;
      }
      if (getAgentFailures > 0) {
        getAgentFailures--;
        callback(unavailable());
        return;
      }
      callback(null, { agent: Agent.fromPartial({ name: call.request.name }) });
    },
    createAgent(call: any, callback: any) {
      count("createAgent", call.getDeadline());
      callback(unavailable());
    },
    watchHistory(call: any) {
      const after = call.request.afterSeq as bigint;
      watchRequests.push(after);
      const record = (seq: bigint) => ({ record: HistoryRecord.fromPartial({ seq, kind: "tool/call", agent: "agents/a" }) });
      if (after === 0n) {
        call.write(record(1n));
        call.write(record(2n));
        setTimeout(() => call.emit("error", unavailable()), 20);
      } else {
        call.write(record(after + 1n));
        call.end();
      }
    },
  };
  server = new Server();
  server.addService(RegistryServiceService, impl);
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
  );
  client = new RegistryClient(`127.0.0.1:${port}`, { timeoutMs: 5000, retry: { initialBackoffMs: 5, maxBackoffMs: 20 } });
});

after(async () => {
  client?.close();
  await new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
});

describe("client policies", () => {
  it("one deadline covers every attempt", async () => {
    const port = Number(client.stub.getChannel().getTarget().split(":").pop());
    const short = new RegistryClient(`127.0.0.1:${port}`, { timeoutMs: 2000 });
    calls.getAgent = 0;
    const begin = Date.now();
    await assert.rejects(short.getAgent("agents/stall"), (e: unknown) => e instanceof CodemodeError && e.code === status.DEADLINE_EXCEEDED);
    console.log(`2 s deadline, 1.5 s per failing attempt: ${Date.now() - begin} ms, ${calls.getAgent} attempts`);
    // Hand-written retries gave each attempt its own 2 s (4 attempts, UNAVAILABLE).
    assert.ok(calls.getAgent <= 2, String(calls.getAgent));
    short.close();
  });

  it("waits the server's pushback (sent beside RetryInfo) before retrying", async () => {
    attemptTimes.length = 0;
    const agent = await client.getAgent("agents/pushback");
    assert.equal(agent.name, "agents/pushback");
    assert.equal(attemptTimes.length, 2);
    const waited = attemptTimes[1]! - attemptTimes[0]!;
    console.log(`retried after ${waited} ms (pushback 400 ms, backoff <= 20 ms)`);
    assert.ok(waited >= 350, String(waited));
  });

  it("retries idempotent reads on UNAVAILABLE, with a deadline on every attempt", async () => {
    calls.getAgent = 0;
    deadlines.length = 0;
    getAgentFailures = 2;
    const begin = Date.now();
    const agent = await client.getAgent("agents/a");
    assert.equal(agent.name, "agents/a");
    assert.equal(calls.getAgent, 3);
    assert.equal(deadlines.length, 3);
    for (const d of deadlines) assert.ok(Number.isFinite(d) && d > begin && d <= begin + 5000 + 1000, String(d));
  });

  it("gives up after maxAttempts", async () => {
    calls.getAgent = 0;
    getAgentFailures = 100;
    await assert.rejects(client.getAgent("agents/a"), (e: unknown) => e instanceof CodemodeError && e.code === status.UNAVAILABLE);
    assert.equal(calls.getAgent, 4);
    getAgentFailures = 0;
  });

  it("never retries writes", async () => {
    calls.createAgent = 0;
    await assert.rejects(client.createAgent("a"), (e: unknown) => e instanceof CodemodeError && e.code === status.UNAVAILABLE);
    assert.equal(calls.createAgent, 1);
  });

  it("decodes ErrorInfo (reason, domain, metadata) from grpc-status-details-bin", async () => {
    await assert.rejects(client.getAgent("agents/rich"), (e: unknown) => {
      assert.ok(e instanceof CodemodeError);
      assert.deepEqual(
        [e.code, e.reason, e.domain, e.message, { ...e.metadata }],
        [status.NOT_FOUND, "AGENT_NOT_FOUND", "codemode.registry", "agent agents/rich not found", { agent: "agents/rich" }],
      );
      return true;
    });
  });

  it("resumes a watch after UNAVAILABLE from the last record seen", async () => {
    const seqs: bigint[] = [];
    for await (const record of client.watchHistory("agents/a")) seqs.push(record.seq);
    assert.deepEqual(seqs, [1n, 2n, 3n]);
    assert.deepEqual(watchRequests, [0n, 2n]);
  });
});
