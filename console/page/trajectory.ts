/**
 * Live trajectories from WatchHistory: each outer call with the calls its `run_code` program
 * made nested under it, drawn as the tree `codemode demo` prints (├─ / └─, a line per call:
 * tool, call id, outcome), and the agent's `agent/steer` / `agent/inject` messages.
 */
import type { HistoryView } from "../src/protocol";
import { el } from "./dom";

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
  children: string[];
}

/** Calls drawn at most; older outer calls are dropped from the page first. */
const MAX_CALLS = 50;

export class Trajectories {
  private readonly nodes = new Map<string, CallNode>();
  private readonly roots: string[] = [];
  private readonly sections = new Map<string, HTMLElement>();
  private readonly orphans: CallNode[] = [];

  constructor(
    private readonly calls: HTMLElement,
    private readonly messages: HTMLElement,
  ) {}

  add(record: HistoryView): void {
    switch (record.kind) {
      case "tool/call":
      case "tool/code-dispatch-start":
        this.node(record);
        break;
      case "tool/result":
      case "tool/code-dispatch": {
        const node = this.node(record);
        node.outcome = record.isError ? `error ${record.errorCode}`.trim() : "ok";
        if (node.startMs && record.timeMs) node.durationMs = record.timeMs - node.startMs;
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
    }
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
    section.replaceChildren(el("pre", {}, this.lines(root).join("\n")));
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
}

function label(node: CallNode): string {
  const duration = node.durationMs === undefined ? "" : `  ${node.durationMs.toFixed(1)} ms`;
  return `${node.toolName}  ${node.callId}  ${node.outcome}${duration}`;
}
