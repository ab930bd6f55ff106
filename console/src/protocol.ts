/**
 * The WebSocket messages between the console's bridge (Node) and its page (the browser).
 *
 * The page is the page runner: it decides (with the person) what to approve, runs Client halves
 * and reports their settlement. The bridge only carries its verbs to the registry's gRPC streams
 * (PageRunnerService.Attach, Approve, WatchHistory) and their events back. Lossless JSON values
 * (big integers) travel as JSON text (`...Json` fields) so that nothing is rounded on the way.
 */

/** An activation request (its metadata and the source to review), as `PageRunner` delivers it. */
export interface RunRequestView {
  requestId: string;
  agent: string;
  pluginId: string;
  packageId: string;
  pluginRunId: string;
  mode: string;
  name: string;
  purpose: string;
  requiresApproval: boolean;
  hasHostHalf: boolean;
  /** Both halves' source for the person to read (shown as text, never evaluated); each cut at 65,536 characters. */
  source: { host: string; client: string; truncated: boolean };
}

/** An ordinary tool approval request of the console's agent. */
export interface ToolApprovalView {
  approvalId: string;
  callId: string;
  agent: string;
  toolName: string;
  argumentsJson: string;
  reason: string;
}

/** One history record, reduced to what the page draws. */
export interface HistoryView {
  seq: string;
  kind: string;
  callId: string;
  rootCallId: string;
  parentCallId: string;
  toolName: string;
  argumentsJson: string;
  /** The arguments for a person to read: `argumentsJson` pretty-printed digit for digit. */
  argumentsText: string;
  /** The content as text: text blocks as they are, JSON blocks pretty, images described. */
  text: string;
  /** The content was too large to keep inline: `text` is the registry's preview, and the
   * `recordContent` verb fetches all of it. */
  spilled: boolean;
  isError: boolean;
  errorCode: string;
  /** When the record was written, in ms since the epoch (0: unknown). */
  timeMs: number;
}

/** A client inspect query for the page's providers. */
export interface InspectQueryView {
  queryId: string;
  provider: string;
  method: string;
  /** The validated input as JSON text. */
  inputJson: string;
}

/**
 * A registry stream the console could not keep (its principal may not approve, say): the page
 * shows it; what the principal may not do, the registry refuses, not the console.
 */
export interface NoticeView {
  stream: "approver" | "history";
  message: string;
}

/** Bridge → page. */
export type ServerMessage =
  | { type: "hello"; agent: string }
  | { type: "notice"; notice: NoticeView }
  | { type: "run-requested"; request: RunRequestView }
  | { type: "run-resolved"; requestId: string; outcome: string }
  | { type: "tool-approval"; request: ToolApprovalView }
  | { type: "tool-approval-withdrawn"; approvalId: string; outcome: string }
  | { type: "history"; record: HistoryView }
  | { type: "inspect-query"; query: InspectQueryView }
  | { type: "inspect-query-resolved"; queryId: string; outcome: string }
  | { type: "reply"; id: number; ok: true; result: unknown }
  | { type: "reply"; id: number; ok: false; error: string };

/** The page-runner verbs (and the tool-approval answer) the page asks the bridge for. */
export interface Verbs {
  runHostHalf: {
    args: { requestId: string; pluginId: string; packageId: string; mode: string; approveFutureVersions: boolean };
    result: PageAnswerView;
  };
  panelRun: { args: { pluginId: string; packageId: string; mode: string }; result: PageAnswerView };
  clientCode: { args: { pluginId: string; pluginRunId: string }; result: PageAnswerView & { code?: string } };
  settle: {
    args: { requestId: string; pluginRunId: string; outcome: SettleOutcomeView; message?: string; stack?: string };
    result: PageAnswerView;
  };
  settlePanelRun: {
    args: { pluginId: string; pluginRunId: string; outcome: Exclude<SettleOutcomeView, "rejected">; message?: string; stack?: string };
    result: PageAnswerView;
  };
  stop: { args: { pluginId: string }; result: PageAnswerView };
  remove: { args: { pluginId: string }; result: PageAnswerView };
  invoke: {
    args: { pluginId: string; pluginRunId: string; method: string; argsJson: string };
    result: { ok: true; valueJson: string } | { ok: false; code: string; message: string; stack?: string };
  };
  renderFailure: { args: { pluginId: string; pluginRunId: string; message: string; stack?: string }; result: PageAnswerView };
  /** Replaces the agent's client inspect manifest (a JSON array of providers). */
  syncManifest: { args: { providersJson: string }; result: PageAnswerView };
  answerQuery: { args: { queryId: string; dataJson: string }; result: PageAnswerView };
  failQuery: { args: { queryId: string; message: string }; result: PageAnswerView };
  answerToolApproval: { args: { approvalId: string; answer: "allow" | "reject" }; result: { delivered: boolean } };
  /** A spilled record's full content as text (the console's agent's history only), cut at
   * `RECORD_TEXT_LIMIT` characters. */
  recordContent: {
    args: { seq: string };
    result: { ok: true; text: string; truncated: boolean } | { ok: false; message: string };
  };
}

export type VerbName = keyof Verbs;

/** Characters of a record's full content the page is sent at most. */
export const RECORD_TEXT_LIMIT = 1_000_000;

/** Page → bridge. */
export interface ClientMessage<V extends VerbName = VerbName> {
  id: number;
  verb: V;
  args: Verbs[V]["args"];
}

export type SettleOutcomeView = "success" | "rejected" | "host-half-failed" | "client-half-failed";

export interface PageAnswerView {
  accepted: boolean;
  message: string;
  code: string;
  pluginRunId: string;
  startedHere: boolean;
}
