/**
 * Live trajectories from WatchHistory: each outer call with the calls its `run_code` program
 * made nested under it, drawn as the tree `codemode demo` prints (├─ / └─, a line per call:
 * tool, call id, outcome), and under the tree what happened, step by step: the program's source
 * (the `run_code` call's `code`), each nested call's arguments, its result or its error text,
 * when it started (from the outer call's start) and how long it took. The agent's
 * `agent/steer` / `agent/inject` messages are listed apart.
 *
 * Everything shown is text the page was sent (tool arguments, results, error messages: what a
 * program or a tool wrote): it is set as text nodes, never parsed as HTML. A value the registry
 * kept aside (too large to keep inline) shows its preview and a button that fetches the rest
 * (`recordContent`, the console's agent's history only).
 */
import { RECORD_TEXT_LIMIT, type HistoryView } from "../src/protocol";
import type { Connection } from "./connection";
import { button, el } from "./dom";

interface CallNode {
  callId: string;
  parentCallId: string;
  rootCallId: string;
  toolName: string;
  /** "running", "ok" or "error <code>". */
  outcome: string;
  startMs: number;
  /** From its start record to its result record, once settled. */
  durationMs?: number;
  /** The arguments as dispatched, pretty; the program's source for `run_code`. */
  argumentsText: string;
  program?: string;
  description?: string;
  /** The result (or the error text), once settled. */
  result?: { text: string; isError: boolean; errorCode: string; seq: string; spilled: boolean };
  /** The full content fetched for a spilled result, kept across redraws. */
  full?: string;
  /** The person asked for every value whole (not cut at MAX_SHOWN). */
  expanded?: boolean;
  children: string[];
}

/** Calls drawn at most; older outer calls are dropped from the page first. */
const MAX_CALLS = 50;
/** Steps detailed per trajectory (the tree lists every call). */
const MAX_STEPS = 200;
/** Characters of one value shown before it is cut (*Show all* shows the rest). */
const MAX_SHOWN = 20_000;

export class Trajectories {
  private readonly nodes = new Map<string, CallNode>();
  private readonly roots: string[] = [];
  private readonly sections = new Map<string, HTMLElement>();
  private readonly orphans: CallNode[] = [];
  private connection: Connection | undefined;

  constructor(
    private readonly calls: HTMLElement,
    private readonly messages: HTMLElement,
  ) {}

  /** Where spilled values are fetched from (set once the page is connected). */
  connect(connection: Connection): void {
    this.connection = connection;
  }

  add(record: HistoryView): void {
    switch (record.kind) {
      case "tool/call":
      case "tool/code-dispatch-start": {
        const node = this.node(record);
        node.argumentsText = record.argumentsText;
        if (record.toolName === "run_code" && !record.parentCallId) Object.assign(node, programOf(record.argumentsJson));
        break;
      }
      case "tool/result":
      case "tool/code-dispatch": {
        const node = this.node(record);
        node.outcome = record.isError ? `error ${record.errorCode}`.trim() : "ok";
        if (node.startMs && record.timeMs) node.durationMs = record.timeMs - node.startMs;
        node.result = { text: record.text, isError: record.isError, errorCode: record.errorCode, seq: record.seq, spilled: record.spilled };
        break;
      }
      case "agent/steer":
      case "agent/inject":
        this.messages.append(
          el(
            "li",
            { "data-kind": record.kind, "data-seq": record.seq },
            el("strong", {}, `${record.kind} from ${record.toolName}`),
            el("pre", {}, record.text),
          ),
        );
        return;
      default:
        return;
    }
    this.draw(record.rootCallId || record.callId);
  }

  private node(record: HistoryView): CallNode {
    let node = this.nodes.get(record.callId);
    if (node === undefined) {
      node = {
        callId: record.callId,
        parentCallId: record.parentCallId,
        rootCallId: record.rootCallId || record.callId,
        toolName: record.toolName,
        outcome: "running",
        startMs: record.kind.endsWith("start") || record.kind === "tool/call" ? record.timeMs : 0,
        argumentsText: "",
        children: [],
      };
      this.nodes.set(record.callId, node);
      const parent = record.parentCallId ? this.nodes.get(record.parentCallId) : undefined;
      if (parent) parent.children.push(record.callId);
      else if (record.parentCallId) this.orphans.push(node); // its parent's record comes later
      else this.addRoot(record.callId);
      for (const orphan of this.orphans.filter((o) => o.parentCallId === record.callId)) {
        node.children.push(orphan.callId);
        this.orphans.splice(this.orphans.indexOf(orphan), 1);
      }
    }
    return node;
  }

  private addRoot(callId: string): void {
    this.roots.push(callId);
    while (this.roots.length > MAX_CALLS) {
      const dropped = this.roots.shift()!;
      this.sections.get(dropped)?.remove();
      this.sections.delete(dropped);
      this.forget(dropped);
    }
  }

  /** Drops a call and everything under it (the page keeps MAX_CALLS trajectories). */
  private forget(callId: string): void {
    const node = this.nodes.get(callId);
    this.nodes.delete(callId);
    for (const child of node?.children ?? []) this.forget(child);
  }

  private draw(rootCallId: string): void {
    const root = this.nodes.get(rootCallId);
    if (root === undefined) return;
    let section = this.sections.get(rootCallId);
    if (section === undefined) {
      section = el("section", { class: "call", "data-call-id": rootCallId });
      this.calls.prepend(section);
      this.sections.set(rootCallId, section);
    }
    section.dataset.outcome = root.outcome;
    const order = this.order(root);
    const steps = el("ol", { class: "steps" }, ...order.slice(0, MAX_STEPS).map((node) => this.step(node, root)));
    if (order.length > MAX_STEPS) steps.append(el("li", { class: "more" }, `… ${order.length - MAX_STEPS} more calls (listed in the tree above)`));
    section.replaceChildren(el("pre", { class: "tree" }, this.lines(root).join("\n")), steps);
  }

  /** The root, then each call under its parent in start order (the tree's order). */
  private order(root: CallNode): CallNode[] {
    const out: CallNode[] = [];
    const stack = [root];
    while (stack.length > 0) {
      const node = stack.pop()!;
      out.push(node);
      for (let i = node.children.length - 1; i >= 0; i--) stack.push(this.nodes.get(node.children[i]!)!);
    }
    return out;
  }

  /** The tree's lines: the root, then each child under its parent in start order. */
  private lines(root: CallNode): string[] {
    const lines = [label(root)];
    const walk = (node: CallNode, prefix: string): void => {
      node.children.forEach((id, index) => {
        const child = this.nodes.get(id)!;
        const last = index === node.children.length - 1;
        lines.push(`${prefix}${last ? "└─ " : "├─ "}${label(child)}`);
        walk(child, prefix + (last ? "   " : "│  "));
      });
    };
    walk(root, "");
    return lines;
  }

  /** One call: what it was asked (the program, or the arguments), when, and how it ended. */
  private step(node: CallNode, root: CallNode): HTMLLIElement {
    const at = node === root || !node.startMs || !root.startMs ? "" : `started at +${(node.startMs - root.startMs).toFixed(1)} ms`;
    const took = node.durationMs === undefined ? "running" : `took ${node.durationMs.toFixed(1)} ms`;
    const item = el(
      "li",
      { class: "step", "data-call-id": node.callId, "data-outcome": node.outcome },
      el("div", { class: "step-head" }, el("strong", { class: "tool" }, node.toolName), ` ${node.callId} · `, el("span", { class: "timing" }, [at, took].filter(Boolean).join(", "))),
    );
    const texts: string[] = [];
    const value = (kind: string, text: string, title = kind): HTMLElement => {
      texts.push(text);
      return labelled(kind, node.expanded ? text : shown(text), title);
    };
    if (node.program !== undefined) {
      if (node.description) item.append(el("div", { class: "description" }, node.description));
      item.append(value("program", node.program));
    } else if (node.argumentsText) {
      item.append(value("arguments", node.argumentsText));
    }
    const result = node.result;
    const aside = result !== undefined && result.spilled && node.full === undefined;
    if (result !== undefined) {
      const title = result.isError ? `error${result.errorCode ? ` ${result.errorCode}` : ""}` : "result";
      const block = value(result.isError ? "error" : "result", node.full ?? result.text, title);
      if (aside) block.append(el("div", { class: "cut" }, "a preview: the registry keeps the whole value aside"));
      item.append(block);
    }
    if (aside || (!node.expanded && texts.some((t) => t.length > MAX_SHOWN))) {
      item.append(button("Show all", "show-all", () => void this.expand(node, item)));
    }
    return item;
  }

  /** Shows a call's values whole: a result kept aside is fetched first. */
  private async expand(node: CallNode, item: HTMLElement): Promise<void> {
    if (node.result?.spilled && node.full === undefined) {
      const answer = await this.connection?.call("recordContent", { seq: node.result.seq });
      if (answer === undefined) return;
      if (!answer.ok) {
        item.append(el("div", { class: "cut" }, `cannot fetch it: ${answer.message}`));
        return;
      }
      node.full = answer.truncated ? `${answer.text}\n… (cut at ${RECORD_TEXT_LIMIT} characters)` : answer.text;
    }
    node.expanded = true;
    this.draw(node.rootCallId);
  }
}

function label(node: CallNode): string {
  const duration = node.durationMs === undefined ? "" : `  ${node.durationMs.toFixed(1)} ms`;
  return `${node.toolName}  ${node.callId}  ${node.outcome}${duration}`;
}

/** A titled block of text: `<div class=kind><span>title</span><pre class=kind>text</pre></div>`. */
function labelled(kind: string, text: string, title = kind): HTMLElement {
  return el("div", { class: `value ${kind}-block` }, el("span", { class: "value-title" }, title), el("pre", { class: kind }, text));
}

/** At most MAX_SHOWN characters of a value, saying how much was left out. */
function shown(text: string): string {
  return text.length <= MAX_SHOWN ? text : `${text.slice(0, MAX_SHOWN)}\n… (${text.length - MAX_SHOWN} more characters)`;
}

/** A `run_code` call's program and description, read from its arguments (strings only: no
 * number is read, so nothing is rounded). */
function programOf(argumentsJson: string): { program?: string; description?: string } {
  try {
    const args = JSON.parse(argumentsJson) as unknown;
    if (args === null || typeof args !== "object") return {};
    const { code, description } = args as Record<string, unknown>;
    return {
      ...(typeof code === "string" ? { program: code } : {}),
      ...(typeof description === "string" ? { description } : {}),
    };
  } catch {
    return {};
  }
}
