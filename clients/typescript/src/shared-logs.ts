/**
 * Logs that a tool result carries once on the wire (`ToolResult.sharedLogs`).
 *
 * A `run_code` result shows its program's logs twice: in its value (`{"logs": [...], ...}`) and
 * at the start of its content text. This client asks for them once (`shareLogs`), so that output
 * over half the registry's message limit still arrives, and restores the result as shown before
 * anything reads it: splicing JSON text, so `valueJson` is byte for byte the whole form.
 */
import type { ToolResult } from "./gen/codemode/registry/v1/tool";
import { stringifyJson } from "./json";

/** `result` as the registry would have sent it whole (`result` itself when it is whole). */
export function wholeResult(result: ToolResult): ToolResult {
  const logs = result.sharedLogs;
  if (logs.length === 0) return result;
  const rest = result.valueJson;
  const first = result.content[0]?.block;
  if (rest === undefined || !rest.startsWith("{")) {
    throw new Error("a result with sharedLogs has no object valueJson to restore");
  }
  if (first?.$case !== "text") throw new Error("a result with sharedLogs has no text block to restore");
  const head = `{"logs":${stringifyJson(logs)}`;
  const text = [logs.join("\n"), first.value.text].filter((part) => part !== "").join("\n");
  return {
    ...result,
    valueJson: rest === "{}" ? `${head}}` : `${head},${rest.slice(1)}`,
    content: [{ block: { $case: "text", value: { text } } }, ...result.content.slice(1)],
    sharedLogs: [],
  };
}
