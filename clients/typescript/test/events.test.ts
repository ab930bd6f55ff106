import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { describe, it } from "node:test";
import type { ClientReadableStream } from "@grpc/grpc-js";
import { ExecuteToolCallResponse } from "../src/gen/codemode/registry/v1/registry_service";
import { ToolResult } from "../src/gen/codemode/registry/v1/tool";
import { ToolCall, type ToolCallEvent } from "../src/registry";

/** A stand-in for the execute stream: the test pushes decoded messages into it. */
class FakeStream extends EventEmitter {
  cancelled = false;
  cancel(): void {
    this.cancelled = true;
  }
}

function progress(text: string): ExecuteToolCallResponse {
  return { event: { $case: "log", value: { text } } };
}

describe("execute stream decoding", () => {
  it("delivers a batch's events one by one, in order, before the result", async () => {
    const stream = new FakeStream();
    const call = new ToolCall("c", stream as unknown as ClientReadableStream<ExecuteToolCallResponse>, undefined);
    const started: ExecuteToolCallResponse = { event: { $case: "started", value: { callId: "c", toolName: "t" } } };
    stream.emit("data", started);
    stream.emit("data", { event: { $case: "batch", value: { events: [progress("a"), progress("b"), progress("c")] } } });
    const result = ToolResult.fromPartial({ valueJson: '"done"' });
    stream.emit("data", { event: { $case: "result", value: result } });
    const seen: ToolCallEvent[] = [];
    for await (const event of call) seen.push(event);
    assert.deepEqual(
      seen.map((e) => (e.type === "log" ? `log ${e.text}` : e.type)),
      ["started", "log a", "log b", "log c", "result"],
    );
    assert.equal((await call.result).value, "done");
    assert.equal(stream.cancelled, false);
  });

  it("delivers a tool's own progress, with and without a total", async () => {
    const stream = new FakeStream();
    const call = new ToolCall("c", stream as unknown as ClientReadableStream<ExecuteToolCallResponse>, undefined);
    const toolProgress = (progress: number, total: number | undefined, message: string): ExecuteToolCallResponse => ({
      event: { $case: "toolProgress", value: { callId: "c:code:1", toolName: "read", progress, total, message } },
    });
    stream.emit("data", toolProgress(1, 3, "one"));
    stream.emit("data", { event: { $case: "batch", value: { events: [toolProgress(2, undefined, "")] } } });
    stream.emit("data", { event: { $case: "result", value: ToolResult.fromPartial({ valueJson: "1" }) } });
    const seen: ToolCallEvent[] = [];
    for await (const event of call) seen.push(event);
    assert.deepEqual(seen.slice(0, 2), [
      { type: "toolProgress", callId: "c:code:1", toolName: "read", progress: 1, total: 3, message: "one" },
      { type: "toolProgress", callId: "c:code:1", toolName: "read", progress: 2, total: undefined, message: "" },
    ]);
    assert.equal(seen[2]?.type, "result");
  });

  it("skips a progress event it does not know (a newer registry's) and still settles", async () => {
    const stream = new FakeStream();
    const call = new ToolCall("c", stream as unknown as ClientReadableStream<ExecuteToolCallResponse>, undefined);
    // An event case this client was generated without decodes as a message with no case set.
    stream.emit("data", {} as ExecuteToolCallResponse);
    stream.emit("data", { event: { $case: "batch", value: { events: [{} as ExecuteToolCallResponse, progress("a")] } } });
    stream.emit("data", { event: { $case: "result", value: ToolResult.fromPartial({ valueJson: "2" }) } });
    const seen: ToolCallEvent[] = [];
    for await (const event of call) seen.push(event);
    assert.deepEqual(
      seen.map((e) => e.type),
      ["log", "result"],
    );
    assert.equal((await call.result).value, 2);
    assert.equal(stream.cancelled, false);
  });
});
