/**
 * The agent's plugins as the page knows them, and the panel that shows them.
 *
 * The registry has no "list plugins" call for pages (a tool call would write the agent's
 * history), so the panel is built from what the page sees: the agent's `cordis_*` calls in its
 * history (define, stop, undefine), activation requests, this page's own settlements, and the
 * steering / inject records that report outcomes settled elsewhere.
 */
import type { HistoryView } from "../src/protocol";
import { button, el } from "./dom";

export interface PluginView {
  pluginId: string;
  name: string;
  purpose: string;
  packages: string[];
  /** defined | awaiting-approval | client-pending | running | rejected | failed | stopped */
  state: string;
  currentPackageId?: string;
  nextPackageId?: string;
}

export interface PanelActions {
  run(plugin: PluginView): void;
  stop(plugin: PluginView): void;
  remove(plugin: PluginView): void;
}

const DEFINED = /^Defined (\S+)\/(\S+) \((.*)\); it is not running yet/;
const STOPPED = /^Dynamic Plugin (\S+) is stopped/;
const REMOVED = /^Removed dynamic Plugin (\S+) and all of its Packages/;

export class Plugins {
  private readonly plugins = new Map<string, PluginView>();
  /** The arguments of calls whose results have not been seen yet (by call id). */
  private readonly callArguments = new Map<string, string>();

  constructor(
    private readonly list: HTMLElement,
    private readonly actions: PanelActions,
    /** Told when the agent itself stopped or removed a plugin: its Client half goes too. */
    private readonly onGone: (pluginId: string, removed: boolean) => void,
  ) {}

  get(pluginId: string): PluginView | undefined {
    return this.plugins.get(pluginId);
  }

  /** Updates one plugin (creating it) and redraws the panel. */
  update(pluginId: string, change: Partial<PluginView>): void {
    const plugin = this.plugins.get(pluginId) ?? { pluginId, name: pluginId, purpose: "", packages: [], state: "defined" };
    Object.assign(plugin, change);
    for (const key of ["currentPackageId", "nextPackageId"] as const) if (plugin[key] === undefined) delete plugin[key];
    const packageId = change.nextPackageId ?? change.currentPackageId;
    if (packageId && !plugin.packages.includes(packageId)) plugin.packages.push(packageId);
    this.plugins.set(pluginId, plugin);
    this.draw();
  }

  /** The plugin is gone (undefined). */
  delete(pluginId: string): void {
    this.plugins.delete(pluginId);
    this.draw();
  }

  /** Learns from one history record. */
  observe(record: HistoryView): void {
    if (record.kind === "tool/call" || record.kind === "tool/code-dispatch-start") {
      if (record.toolName.startsWith("cordis_")) this.callArguments.set(record.callId, record.argumentsJson);
      return;
    }
    if (record.kind === "agent/steer" || record.kind === "agent/inject") {
      this.observeMessage(record);
      return;
    }
    if (record.kind !== "tool/result" && record.kind !== "tool/code-dispatch") return;
    const argumentsJson = this.callArguments.get(record.callId) ?? "";
    this.callArguments.delete(record.callId);
    if (record.isError) return;
    const defined = DEFINED.exec(record.text);
    if (defined) {
      const [, pluginId, packageId, name] = defined as unknown as [string, string, string, string];
      const purpose = purposeOf(argumentsJson);
      const plugin = this.plugins.get(pluginId);
      this.update(pluginId, { name, purpose, packages: [...(plugin?.packages ?? []), packageId] });
      return;
    }
    const stopped = STOPPED.exec(record.text);
    if (stopped && this.plugins.has(stopped[1]!)) {
      this.update(stopped[1]!, { state: "stopped" });
      this.onGone(stopped[1]!, false);
      return;
    }
    const removed = REMOVED.exec(record.text);
    if (removed) {
      this.delete(removed[1]!);
      this.onGone(removed[1]!, true);
    }
  }

  /** Outcomes settled elsewhere (another page, a panel elsewhere) arrive as steer/inject text. */
  private observeMessage(record: HistoryView): void {
    let metadata: { pluginId?: unknown; packageId?: unknown } = {};
    try {
      metadata = JSON.parse(record.argumentsJson || "{}") as typeof metadata;
    } catch {
      return;
    }
    const pluginId = typeof metadata.pluginId === "string" ? metadata.pluginId : "";
    const packageId = typeof metadata.packageId === "string" ? metadata.packageId : undefined;
    if (!pluginId || !this.plugins.has(pluginId)) return;
    const text = record.text;
    if (/completed successfully/.test(text) && packageId) {
      this.update(pluginId, { state: "running", currentPackageId: packageId, nextPackageId: undefined });
    } else if (/^The user rejected/.test(text)) {
      this.update(pluginId, { state: "rejected" });
    } else if (/failed after cordis_run returned|failed after/.test(text)) {
      this.update(pluginId, { state: "failed" });
    } else if (/^The user stopped/.test(text)) {
      this.update(pluginId, { state: "stopped" });
    } else if (/^The user removed/.test(text)) {
      this.delete(pluginId);
    }
  }

  private draw(): void {
    const rows = [...this.plugins.values()].map((plugin) =>
      el(
        "li",
        { "data-plugin": plugin.pluginId, "data-state": plugin.state },
        el("strong", {}, plugin.name),
        " ",
        el("code", {}, plugin.pluginId),
        " ",
        el("span", { class: "state" }, plugin.state),
        el(
          "span",
          { class: "cm-muted" },
          ` current: ${plugin.currentPackageId ?? "none"} · next: ${plugin.nextPackageId ?? "none"} · ${plugin.purpose}`,
        ),
        " ",
        button("Run", "run", () => this.actions.run(plugin)),
        button("Stop", "stop", () => this.actions.stop(plugin)),
        button("Remove", "remove", () => this.actions.remove(plugin)),
      ),
    );
    this.list.replaceChildren(...rows);
  }
}

function purposeOf(argumentsJson: string): string {
  try {
    const args = JSON.parse(argumentsJson || "{}") as { purpose?: unknown };
    return typeof args.purpose === "string" ? args.purpose : "";
  } catch {
    return "";
  }
}
