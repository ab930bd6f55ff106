/**
 * Logs that a tool result carries once on the wire (`ToolResult.sharedLogs`).
 *
 * A `run_code` result shows its program's logs twice: in its value (`{"logs": [...], ...}`) and
 * at the start of its content text. This client asks for them once (`shareLogs`), so that output
 * over half the registry's message limit still arrives, and restores the result as shown before
 * anything reads it: splicing JSON text, so `valueJson` is byte for byte the whole form. A
 * failure's captured output (after `\nCaptured output:\n` in its message and text) and the
 * `result` (shown at the end of the text: `sharedResult`) travel once the same way.
 */
import type { ToolResult } from "./gen/codemode/registry/v1/tool";
import { memberJson, renderPrettyJson, stringifyJson } from "./json";

/** What precedes a failed run's captured output in its error message and content text. */
export const CAPTURED = "\nCaptured output:\n";

/** `result` as the registry would have sent it whole (`result` itself when it is whole). */
export function wholeResult(result: ToolResult): ToolResult {
  const logs = result.sharedLogs;
  if (logs.length === 0) return withResult(result);
  const first = result.content[0]?.block;
  if (result.isError) {
    if (first?.$case !== "text") throw new Error("a failure with sharedLogs has no text block to restore");
    const tail = CAPTURED + logs.join("\n");
    const error = result.error ?? { message: "", code: "", name: "" };
    return {
      ...result,
      error: { ...error, message: error.message + tail },
      content: [{ block: { $case: "text", value: { text: first.value.text + tail } } }, ...result.content.slice(1)],
      sharedLogs: [],
    };
  }
  const rest = result.valueJson;
  if (rest === undefined || !rest.startsWith("{")) {
    throw new Error("a result with sharedLogs has no object valueJson to restore");
  }
  if (first?.$case !== "text") throw new Error("a result with sharedLogs has no text block to restore");
  const head = `{"logs":${stringifyJson(logs)}`;
  const text = [logs.join("\n"), first.value.text].filter((part) => part !== "").join("\n");
  return withResult({
    ...result,
    valueJson: rest === "{}" ? `${head}}` : `${head},${rest.slice(1)}`,
    content: [{ block: { $case: "text", value: { text } } }, ...result.content.slice(1)],
    sharedLogs: [],
  });
}

/** The text block given back the result it left out (`sharedResult`): as shown, a string is
 * itself and any other value its pretty JSON (`renderPrettyJson` of its text in `valueJson`). */
function withResult(result: ToolResult): ToolResult {
  if (!result.sharedResult) return result;
  const member = result.valueJson === undefined ? undefined : memberJson(result.valueJson, "result");
  if (member === undefined) throw new Error("a result with sharedResult has no result to restore");
  const shown = renderPrettyJson(member);
  if (shown === "") throw new Error("a result with sharedResult has an empty result to restore");
  const first = result.content[0]?.block;
  if (first?.$case !== "text") throw new Error("a result with sharedResult has no text block to restore");
  const text = first.value.text === "" ? shown : `${first.value.text}\n${shown}`;
  return {
    ...result,
    content: [{ block: { $case: "text", value: { text } } }, ...result.content.slice(1)],
    sharedResult: false,
  };
}
