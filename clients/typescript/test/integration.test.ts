/**
 * The TypeScript client against the REAL services: a runtime and a registry (Python processes on
 * 127.0.0.1:0), a TS ToolProvider serving tools, a TS Approver, and code-mode programs calling
 * the TS tools through the registry's pipeline.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import {
  Approver,
  CodemodeError,
  PresentationMode,
  RegistryClient,
  ToolFailed,
  ToolOutput,
  ToolProvider,
  status,
  type ApprovalRequest,
  type InvocationContext,
  type JsonObject,
  type JsonValue,
  type RunCodeValue,
  type ToolCallEvent,
  type ToolCallResult,
} from "../src/index";
import { startService, stopService, type Service } from "./services";

const BIG = 2n ** 53n + 1n;

let runtime: Service | undefined;
let registry: Service | undefined;
let client: RegistryClient;
let provider: ToolProvider;
let approver: Approver;
let tmp: string;
const invocations: InvocationContext[] = [];
const approvals: ApprovalRequest[] = [];
const cancelled: { callId: string; reason: string }[] = [];
let onWaitStarted: (() => void) | undefined;

async function collect(call: AsyncIterable<ToolCallEvent>): Promise<{ events: ToolCallEvent[]; result: ToolCallResult }> {
  const events: ToolCallEvent[] = [];
  for await (const event of call) events.push(event);
  const last = events.at(-1);
  assert.ok(last?.type === "result", "the last event is the result");
  return { events, result: last.result };
}

async function eventually<T>(probe: () => Promise<T | undefined>, timeoutMs = 5000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 50));
  }
}

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), "codemode-ts-test-"));
  const rules = join(tmp, "rules.yaml");
  writeFileSync(rules, 'rules:\n  - tool: "guarded_*"\n    action: ask\n    reason: a human signs off on writes\n');
  runtime = await startService("runtime_service", "runtime listening on port ", { CODEMODE_RUNTIME_POOL_SIZE: "1" });
  registry = await startService("registry_service", "registry listening on port ", {
    CODEMODE_REGISTRY_RUNTIME_TARGETS: JSON.stringify([`127.0.0.1:${runtime.port}`]),
    CODEMODE_REGISTRY_HISTORY_PATH: ":memory:",
    CODEMODE_REGISTRY_POLICY_RULES: rules,
  });
  client = new RegistryClient(`127.0.0.1:${registry.port}`, { timeoutMs: 10_000, executeTimeoutMs: 30_000 });

  provider = new ToolProvider(client, "ts-tools")
    .tool(
      {
        name: "add",
        description: "Adds two integers exactly",
        concurrencySafe: true,
        inputSchema: {
          type: "object",
          properties: { a: { type: "integer" }, b: { type: "integer" } },
          required: ["a", "b"],
        },
      },
      async (args: { a: number | bigint; b: number | bigint }, ctx) => {
        invocations.push(ctx);
        const sum = BigInt(args.a) + BigInt(args.b);
        return sum >= -(2n ** 53n - 1n) && sum <= 2n ** 53n - 1n ? Number(sum) : sum;
      },
    )
    .tool(
      { name: "echo", description: "Returns its value and the JS type it arrived as", concurrencySafe: true },
      async (args: JsonObject, ctx) => {
        invocations.push(ctx);
        return { value: args.value ?? null, type: typeof args.value };
      },
    )
    .tool({ name: "fail", description: "Always fails" }, async () => {
      throw new ToolFailed("nothing to see here", "E_NOPE");
    })
    .tool({ name: "wait_for_cancel", description: "Waits until cancelled" }, (_args, ctx) => {
      onWaitStarted?.();
      return new Promise((_resolve, reject) => {
        ctx.signal.addEventListener("abort", () => {
          cancelled.push({ callId: ctx.callId, reason: String((ctx.signal.reason as Error).message) });
          reject(ctx.signal.reason);
        });
      });
    })
    .tool(
      {
        name: "guarded_write",
        description: "Writes (needs approval)",
        inputSchema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
      },
      async (args: { path: string }) => `wrote ${args.path}`,
    );
  await provider.start();
  approver = new Approver(client, "ts-approver", async (request) => {
    approvals.push(request);
    if ((request.arguments as JsonObject).path?.toString().startsWith("ask-later/")) return undefined; // abstain
    return (request.arguments as JsonObject).path?.toString().startsWith("ok/") ? "allow" : "reject";
  });
  await approver.start();
  await client.createAgent("ts-code", { mode: "code" });
  await client.createAgent("ts-native", { mode: "native" });
});

after(async () => {
  await approver?.close();
  await provider?.close();
  client?.close();
  await Promise.all([stopService(registry), stopService(runtime)]);
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

describe("RegistryClient against the real services", () => {
  it("serves the provider's tools and manages agents and presets", async () => {
    assert.ok(provider.providerId !== "");
    const agent = await client.getAgent("agents/ts-code");
    assert.equal(agent.mode, PresentationMode.PRESENTATION_MODE_CODE);
    const { agents } = await client.listAgents();
    assert.deepEqual(
      agents.map((a) => a.name),
      ["agents/ts-code", "agents/ts-native"],
    );
    const preset = await client.createPreset("ts-preset", { mode: "both", codeLanguage: "typescript" });
    assert.equal(preset.name, "presets/ts-preset");
    assert.equal(preset.codeLanguage, "typescript");
    const member = await client.createAgent("ts-member", { preset: preset.name });
    assert.deepEqual([member.codeLanguage, member.effectiveCodeLanguage], ["", "typescript"]);
    const own = await client.createAgent("ts-own", { preset: preset.name, codeLanguage: "python" });
    assert.deepEqual([own.codeLanguage, own.effectiveCodeLanguage], ["python", "python"]);
    await client.deleteAgent("agents/ts-member");
    await client.deleteAgent("agents/ts-own");
    assert.ok(preset.createTime instanceof Date);
    assert.equal((await client.getPreset("presets/ts-preset")).mode, PresentationMode.PRESENTATION_MODE_BOTH);
    assert.deepEqual(
      (await client.listPresets()).presets.map((p) => p.name),
      ["presets/ts-preset"],
    );
    await client.deletePreset("presets/ts-preset");
    const visible = await client.listVisibleTools("agents/ts-native");
    const names = visible.tools.map((t) => t.name);
    for (const name of ["add", "echo", "fail", "guarded_write", "wait_for_cancel"]) assert.ok(names.includes(name), name);
    assert.equal(visible.tools.find((t) => t.name === "add")?.owner, "ts-tools");
    const wire = await client.getWireSchemas("agents/ts-code");
    assert.deepEqual(
      wire.schemas.map((s) => s.name),
      ["run_code"],
    );
  });

  it("turns gRPC errors into CodemodeError with ErrorInfo", async () => {
    await assert.rejects(client.getAgent("agents/missing"), (e: unknown) => {
      assert.ok(e instanceof CodemodeError);
      assert.equal(e.code, status.NOT_FOUND);
      assert.equal(e.codeName, "NOT_FOUND");
      assert.equal(e.reason, "AGENT_NOT_FOUND");
      assert.equal(e.domain, "codemode.registry");
      return true;
    });
    await assert.rejects(client.createAgent("ts-code"), (e: unknown) => e instanceof CodemodeError && e.code === status.ALREADY_EXISTS);
  });

  it("executes a direct call with events, and carries 2^53+1 exactly both ways", async () => {
    const call = client.executeToolCall({
      agent: "agents/ts-native",
      callId: "big-1",
      toolName: "echo",
      arguments: { value: BIG },
    });
    const { events, result } = await collect(call);
    assert.deepEqual(
      events.map((e) => e.type),
      ["started", "result"],
    );
    assert.deepEqual(events[0], { type: "started", callId: "big-1", toolName: "echo" });
    assert.equal(result.isError, false);
    assert.deepEqual(result.value, { value: BIG, type: "bigint" });
    assert.match(result.valueJson!, /9007199254740993/);
    assert.equal(await call.result, result);
    const ctx = invocations.find((c) => c.callId === "big-1")!;
    assert.equal(ctx.agent, "agents/ts-native");
    assert.ok(ctx.timeoutMs !== undefined && ctx.timeoutMs > 0 && ctx.timeoutMs <= 30_000);
  });

  it("runs a code-mode program that calls the TypeScript tools", async () => {
    const program = [
      "import asyncio",
      "total = await tools.add({'a': 2**53, 'b': 1})",
      "print('sum', total)",
      "pair = await asyncio.gather(tools.add({'a': 1, 'b': 2}), tools.echo({'value': total}))",
      "try:",
      "    await tools.fail({})",
      "except ToolCallError as e:",
      "    print('failed:', e)",
      "return {'total': total, 'pair': pair}",
    ].join("\n");
    const call = client.runCode("agents/ts-code", program, "Add big numbers with TS tools", { callId: "run-1" });
    const { events, result } = await collect(call);
    assert.equal(result.isError, false, result.text);
    const value = result.value as unknown as RunCodeValue;
    assert.equal(value.logs[0], `sum ${BIG}`);
    assert.match(value.logs[1]!, /failed: .*nothing to see here/);
    assert.deepEqual(value.result, { total: BIG, pair: [3, { value: BIG, type: "bigint" }] });
    const kinds = events.map((e) => e.type);
    assert.equal(kinds[0], "started");
    const started = events.filter((e) => e.type === "nestedStarted");
    assert.equal(started.length, 4);
    assert.ok(started.every((e) => e.queueWaitMs >= 0));
    const settled = events.filter((e) => e.type === "nestedSettled");
    assert.equal(settled.length, 4);
    assert.ok(kinds.includes("log"));
    const failed = settled.find((e) => e.toolName === "fail")!;
    assert.deepEqual([failed.isError, failed.errorCode], [true, "E_NOPE"]);
    assert.ok(settled.every((e) => e.durationMs >= 0));
    const nested = invocations.filter((c) => c.rootCallId === "run-1");
    assert.deepEqual(nested.map((c) => c.callId).sort(), ["run-1:code:1", "run-1:code:2", "run-1:code:3"]);
    assert.ok(nested.every((c) => c.agent === "agents/ts-code" && c.timeoutMs !== undefined));
  });

  it("carries only the result when asked for no progress events", async () => {
    const program = "a = await tools.add({'a': 1, 'b': 2})\nprint('a', a)\nreturn a";
    const quiet = client.runCode("agents/ts-code", program, "Add quietly", { callId: "quiet-1", progress: "none" });
    const { events, result } = await collect(quiet);
    assert.deepEqual(events.map((e) => e.type), ["result"]);
    assert.deepEqual(result.value, { logs: ["a 3"], result: 3 });
  });

  it("lists and watches the history of the run", async () => {
    const { records } = await client.listHistory("agents/ts-code", { callId: "run-1" });
    // Outer layer around the nested layer; each nested call starts before it settles (the two
    // gathered calls may interleave).
    const summary = records.map((r) => `${r.kind} ${r.callId}`);
    assert.equal(summary[0], "tool/call run-1");
    assert.equal(summary.at(-1), "tool/result run-1");
    assert.equal(records.length, 10);
    for (let n = 1; n <= 4; n++) {
      const begin = summary.indexOf(`tool/code-dispatch-start run-1:code:${n}`);
      const settle = summary.indexOf(`tool/code-dispatch run-1:code:${n}`);
      assert.ok(begin > 0 && settle > begin, `sub-call ${n}: ${summary.join(", ")}`);
    }
    assert.ok(records.slice(1, -1).every((r) => r.rootCallId === "run-1" && r.parentCallId === "run-1"));
    assert.deepEqual(records[1]!.arguments, { a: 2n ** 53n, b: 1 });
    assert.equal(typeof records[0]!.seq, "bigint");
    // A record's content read on its own is the content the listing carries (nothing spilled).
    const outer = records.at(-1)!;
    assert.deepEqual(await client.recordContent("agents/ts-code", outer.seq), outer.content);
    const controller = new AbortController();
    const watched: string[] = [];
    for await (const record of client.watchHistory("agents/ts-code", { signal: controller.signal })) {
      watched.push(record.kind);
      if (watched.length === records.length) break;
    }
    assert.equal(watched.length, records.length);
  });

  it("reads a deleted agent's history by its agentId; a re-created name starts empty", async () => {
    const old = await client.createAgent("ts-reborn");
    assert.match(old.agentId, /^[0-9a-f]{32}$/);
    await client.executeToolCall({ agent: old.name, callId: "once", toolName: "echo", arguments: { value: 1 } }).result;
    await client.deleteAgent(old.name);
    const reborn = await client.createAgent("ts-reborn");
    assert.notEqual(reborn.agentId, old.agentId);
    assert.deepEqual((await client.listHistory(reborn.name)).records, []);
    const { records } = await client.listHistory({ agentId: old.agentId });
    assert.deepEqual(records.map((r) => `${r.kind} ${r.callId} ${r.agentId}`), [
      `tool/call once ${old.agentId}`,
      `tool/result once ${old.agentId}`,
    ]);
    assert.ok((await client.recordContent({ agentId: old.agentId }, records[1]!.seq)).length > 0);
    await client.deleteAgent(reborn.name);
  });

  it("routes approvals to the TypeScript approver", async () => {
    const allowed = await collect(
      client.executeToolCall({ agent: "agents/ts-native", callId: "ask-1", toolName: "guarded_write", arguments: { path: "ok/a.txt" } }),
    );
    assert.deepEqual(
      allowed.events.map((e) => e.type),
      ["started", "approvalPending", "approvalResolved", "result"],
    );
    const pending = allowed.events[1] as Extract<ToolCallEvent, { type: "approvalPending" }>;
    assert.equal(pending.reason, "a human signs off on writes");
    assert.deepEqual(allowed.events[2], { type: "approvalResolved", approvalId: pending.approvalId, outcome: "allowedOnce" });
    assert.equal(allowed.result.value, "wrote ok/a.txt");
    const request = approvals.find((r) => r.callId === "ask-1")!;
    assert.deepEqual([request.agent, request.toolName, request.arguments], ["agents/ts-native", "guarded_write", { path: "ok/a.txt" }]);

    const rejected = await client
      .executeToolCall({ agent: "agents/ts-native", toolName: "guarded_write", arguments: { path: "etc/passwd" } })
      .result;
    assert.equal(rejected.isError, true);
    assert.equal(rejected.error?.code, "DENIED");
  });

  it("lists and resolves a pending approval without a stream (ListPendingApprovals / ResolveApproval)", async () => {
    const call = client.executeToolCall({
      agent: "agents/ts-native",
      callId: "ask-unary",
      toolName: "guarded_write",
      arguments: { path: "ask-later/b.txt" },
    }).result;
    const request = await eventually(async () =>
      (await client.listPendingApprovals()).approvals.find((r) => r.callId === "ask-unary"),
    );
    assert.deepEqual([request.agent, request.toolName, request.arguments], ["agents/ts-native", "guarded_write", { path: "ask-later/b.txt" }]);
    await client.resolveApproval(request.approvalId, "reject");
    const result = await call;
    assert.equal(result.error?.code, "DENIED");
    await assert.rejects(client.resolveApproval(request.approvalId, "allow"), (error: unknown) => {
      assert.ok(error instanceof CodemodeError);
      assert.deepEqual([error.code, error.reason], [status.FAILED_PRECONDITION, "APPROVAL_NOT_PENDING"]);
      return true;
    });
    await assert.rejects(client.resolveApproval("approval-nope", "allow"), (error: unknown) => {
      assert.ok(error instanceof CodemodeError);
      assert.deepEqual([error.code, error.reason], [status.NOT_FOUND, "APPROVAL_NOT_FOUND"]);
      return true;
    });
  });

  it("cancels a running tool: the provider's AbortSignal fires", async () => {
    const started = new Promise<void>((r) => (onWaitStarted = r));
    const controller = new AbortController();
    const call = client.executeToolCall(
      { agent: "agents/ts-native", callId: "cancel-1", toolName: "wait_for_cancel" },
      { signal: controller.signal },
    );
    await started;
    controller.abort();
    await assert.rejects(call.result, (e: unknown) => e instanceof CodemodeError && e.code === status.CANCELLED);
    const seen = await eventually(async () => cancelled.find((c) => c.callId === "cancel-1"));
    assert.ok(seen.reason.length > 0);
  });

  it("reports tool failures as results with their code", async () => {
    const result = await client.executeToolCall({ agent: "agents/ts-native", toolName: "fail" }).result;
    assert.equal(result.isError, true);
    assert.deepEqual([result.error?.code, result.error?.message], ["E_NOPE", "nothing to see here"]);
    assert.equal(result.text, "Error: nothing to see here");
  });

  it("serves rich results: content blocks, contexts, concluding the turn; refuses bad output", async () => {
    // Not UTF-8, with a NUL: image bytes must arrive untouched.
    const png = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x00, 0xff, 0xfe, 0x0d, 0x0a]);
    const shot = (): ToolOutput =>
      new ToolOutput({
        value: { width: 640, height: BIG },
        content: [
          { type: "text", text: "The page:" },
          { type: "image", data: png, mimeType: "image/png" },
          { type: "json", value: { title: "Ünïcode", n: BIG, ok: [true, null, 1.5] } },
        ],
        additionalContexts: [
          { content: [{ type: "text", text: "Cookies were accepted." }], source: "browser" },
          { content: [{ type: "image", data: Buffer.from("GIF89a"), mimeType: "image/gif" }] },
        ],
        concludesTurn: true,
      });
    const schema = { type: "object", properties: { n: { type: "integer" } }, required: ["n"] };
    const rich = new ToolProvider(client, "ts-rich")
      .tool({ name: "ts_shot" }, async () => shot())
      .tool({ name: "ts_words" }, async () => new ToolOutput({ content: [{ type: "text", text: "just words" }] }))
      .tool({ name: "ts_plain" }, async () => ({ content: ["a plain value"] }))
      .tool({ name: "ts_off_schema", outputSchema: schema }, async () => new ToolOutput({ value: { n: "seven" } }))
      .tool({ name: "ts_nan" }, async () => new ToolOutput({ value: { x: NaN }, content: [{ type: "text", text: "x" }] }))
      .tool({ name: "ts_nan_block" }, async () => new ToolOutput({ content: [{ type: "json", value: Infinity as JsonValue }] }))
      .tool({ name: "ts_refuse" }, async () => {
        throw new ToolFailed("quota exceeded", "QUOTA", {
          additionalContexts: [{ content: [{ type: "text", text: "Try after 5pm." }], source: "billing" }],
        });
      });
    await rich.start();
    try {
      const call = (toolName: string): Promise<ToolCallResult> =>
        client.executeToolCall({ agent: "agents/ts-native", toolName }).result;
      const got = await call("ts_shot");
      assert.equal(got.isError, false, got.text);
      assert.equal(got.valueJson, '{"width":640,"height":9007199254740993}');
      assert.deepEqual(got.value, { width: 640, height: BIG });
      assert.equal(got.text, "The page:");
      assert.deepEqual(
        got.content.map((b) => b.block?.$case),
        ["text", "image", "json"],
      );
      const image = got.content[1]!.block as { $case: "image"; value: { mimeType: string; data: Buffer } };
      assert.equal(image.value.mimeType, "image/png");
      assert.deepEqual(new Uint8Array(image.value.data), png);
      const json = got.content[2]!.block as { $case: "json"; value: { json: string } };
      assert.equal(json.value.json, '{"title":"Ünïcode","n":9007199254740993,"ok":[true,null,1.5]}');
      assert.deepEqual(
        got.additionalContexts.map((c) => [c.source, c.content.map((b) => b.block?.$case)]),
        [
          ["browser", ["text"]],
          ["", ["image"]],
        ],
      );
      assert.equal(got.concludesTurn, true);

      const words = await call("ts_words");
      assert.deepEqual([words.isError, words.valueJson, words.text], [false, undefined, "just words"]);
      // A plain object shaped like an output is still a plain value, rendered by the registry.
      const plain = await call("ts_plain");
      assert.deepEqual([plain.value, plain.concludesTurn], [{ content: ["a plain value"] }, false]);
      assert.match(plain.text, /a plain value/);

      for (const [tool, detail] of [
        ["ts_off_schema", '"n" must be an integer'],
        ["ts_nan", "output is not lossless JSON: NaN is not valid JSON"],
        ["ts_nan_block", "content[0] is not lossless JSON: Infinity is not valid JSON"],
      ]) {
        const bad = await call(tool!);
        assert.equal(bad.isError, true, tool);
        assert.deepEqual([bad.error?.code, bad.error?.name], ["INVALID_TOOL_OUTPUT", "ToolOutputError"], tool);
        assert.ok(bad.error!.message.startsWith(`tool "${tool}" returned invalid output: `), bad.error!.message);
        assert.ok(bad.error!.message.includes(detail!), bad.error!.message);
      }

      const refused = await call("ts_refuse");
      assert.deepEqual([refused.isError, refused.error?.code, refused.text], [true, "QUOTA", "Error: quota exceeded"]);
      assert.deepEqual(
        refused.additionalContexts.map((c) => c.source),
        ["billing"],
      );

      // A program gets the value; the image-bearing content and the contexts ride run_code's result.
      const run = await client.runCode("agents/ts-code", "return await tools.ts_shot({})", "Take a shot").result;
      assert.equal(run.isError, false, run.text);
      assert.deepEqual(run.value, { logs: [], result: { width: 640, height: BIG } });
      assert.deepEqual(
        run.additionalContexts.map((c) => [c.source, c.content.length]),
        [
          ["tools-code-mode", 3],
          ["browser", 1],
          ["", 1],
        ],
      );
      assert.equal(run.concludesTurn, true);
    } finally {
      await rich.close();
    }
  });

  it("declares its channel's receive limit: a larger invocation fails alone, the stream goes on", async () => {
    assert.equal(client.maxReceiveMessageBytes, 64 * 1024 * 1024);
    // A channel that receives what gRPC does by default (4 MiB).
    const small = new RegistryClient(`127.0.0.1:${registry!.port}`, {
      timeoutMs: 10_000,
      channelOptions: { "grpc.max_receive_message_length": 4 * 1024 * 1024 },
    });
    assert.equal(small.maxReceiveMessageBytes, 4 * 1024 * 1024);
    const measuring = new ToolProvider(small, "ts-small").tool(
      { name: "ts_measure", description: "Measures its text", inputSchema: { type: "object" } },
      async (args: { text: string }) => args.text.length,
    );
    await measuring.start();
    try {
      const call = (text: string, callId: string) =>
        collect(client.executeToolCall({ agent: "agents/ts-native", callId, toolName: "ts_measure", arguments: { text } }));
      const { result: refused } = await call("x".repeat(5 * 1024 * 1024), "too-big");
      assert.equal(refused.isError, true);
      assert.equal(refused.error?.code, "INVOCATION_TOO_LARGE");
      assert.match(refused.error?.message ?? "", /4194304/);
      const { result: fits } = await call("abc", "fits");
      assert.equal(fits.value, 3);
    } finally {
      await measuring.close();
      small.close();
    }
  });

  it("approvers declare their channel's receive limit: a request goes only to those that receive it", async () => {
    const MiB = 1024 * 1024;
    const channel = (receives: number) =>
      new RegistryClient(`127.0.0.1:${registry!.port}`, {
        timeoutMs: 10_000,
        channelOptions: { "grpc.max_receive_message_length": receives },
      });
    // Over gRPC's 4 MiB default: only a declared limit lets the registry send it a 5 MiB request.
    const roomy = channel(8 * MiB);
    const small = channel(4 * MiB);
    assert.equal(roomy.maxReceiveMessageBytes, 8 * MiB);
    const seen: Record<string, string[]> = { roomy: [], small: [] };
    // They leave the answer to the suite's approver (first answer wins).
    const watching = (name: string, on: RegistryClient) =>
      new Approver(on, `ts-${name}`, (request) => void seen[name]!.push(request.callId));
    const approvers = [watching("roomy", roomy), watching("small", small)];
    for (const a of approvers) await a.start();
    try {
      const call = (path: string, callId: string) =>
        client.executeToolCall({ agent: "agents/ts-native", callId, toolName: "guarded_write", arguments: { path } }).result;
      const big = await call(`ok/${"x".repeat(5 * MiB)}`, "ts-approve-big");
      assert.equal(big.isError, false, big.error?.message);
      await eventually(async () => (seen.roomy!.includes("ts-approve-big") ? true : undefined));
      const fits = await call("ok/small.txt", "ts-approve-small");
      assert.equal(fits.value, "wrote ok/small.txt");
      await eventually(async () => (seen.small!.length > 0 ? true : undefined));
      // In order on its stream: the big request, had it been sent, would have come (or broken it) first.
      assert.deepEqual(seen.small, ["ts-approve-small"]);
    } finally {
      for (const a of approvers) await a.close();
      roomy.close();
      small.close();
    }
  });

  it("refuses a conflicting registration and revokes tools when a provider disconnects", async () => {
    const clash = new ToolProvider(client, "clash").tool({ name: "add" }, () => 0);
    await assert.rejects(clash.start(), (e: unknown) => e instanceof CodemodeError && e.reason === "TOOL_ALREADY_REGISTERED");

    const ephemeral = new ToolProvider(client, "ephemeral").tool({ name: "temp_tool", description: "short-lived" }, () => "here");
    await ephemeral.start();
    const names = async (): Promise<string[]> => (await client.listVisibleTools("agents/ts-native")).tools.map((t) => t.name);
    assert.ok((await names()).includes("temp_tool"));
    assert.equal((await client.executeToolCall({ agent: "agents/ts-native", toolName: "temp_tool" }).result).value, "here");
    await ephemeral.close();
    assert.equal(await ephemeral.closed, undefined);
    await eventually(async () => ((await names()).includes("temp_tool") ? undefined : true));
    const gone = await client.executeToolCall({ agent: "agents/ts-native", toolName: "temp_tool" }).result;
    assert.equal(gone.error?.code, "UNKNOWN_TOOL");
    assert.ok((await names()).includes("add"), "other providers' tools stay");
  });

  it("hides every inherited tool with addRestriction({ allow: [] })", async () => {
    const agent = (await client.createAgent("ts-allow-none", { mode: "both" })).name;
    const names = async (): Promise<string[]> => (await client.listVisibleTools(agent)).tools.map((t) => t.name);
    try {
      const denied = await client.addRestriction(agent, { deny: ["add"] }); // no allow list: the rest stay
      assert.ok(!(await names()).includes("add") && (await names()).includes("echo"));
      await client.removeRestriction(agent, denied);
      const none = await client.addRestriction(agent, { allow: [] });
      assert.deepEqual(await names(), ["run_code"]);
      const hidden = await client.executeToolCall({ agent, toolName: "echo", arguments: { value: 1 } }).result;
      assert.equal(hidden.error?.code, "UNKNOWN_TOOL");
      await client.removeRestriction(agent, none);
      assert.ok((await names()).includes("echo"));
    } finally {
      await client.deleteAgent(agent);
    }
  });
});
