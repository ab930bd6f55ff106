/**
 * The page-runner side of activations: pending requests shown to the person
 * with name, purpose and the package's source — both halves, as text — (approve once, approve
 * future versions, reject); a package too long to be shown whole cannot be approved here. A
 * request that needs no approval (a grant applies) runs at once. An approved request runs the Host half, fetches
 * the Client half of the exact active run, loads it into the plugin's slot and settles the
 * request with how that went. Panel gestures (run, stop, remove) go the same way without one.
 */
import type { PageAnswerView, RunRequestView } from "../src/protocol";
import type { Connection } from "./connection";
import { button, describe, el } from "./dom";
import { Plugins, type PluginView } from "./plugins";
import { ClientSlots } from "./slots";

export class Activations {
  readonly plugins: Plugins;
  private readonly rows = new Map<string, HTMLElement>();

  constructor(
    private readonly connection: Connection,
    private readonly pending: HTMLElement,
    private readonly slots: ClientSlots,
    pluginList: HTMLElement,
    private readonly status: (text: string) => void,
  ) {
    this.plugins = new Plugins(
      pluginList,
      {
        run: (plugin) => void this.panelRun(plugin),
        stop: (plugin) => void this.panelStop(plugin),
        remove: (plugin) => void this.panelRemove(plugin),
      },
      (pluginId, removed) => void (removed ? this.slots.remove(pluginId) : this.slots.unload(pluginId)),
    );
  }

  requested(request: RunRequestView): void {
    if (this.rows.has(request.requestId)) return;
    this.plugins.update(request.pluginId, {
      name: request.name,
      purpose: request.purpose,
      state: request.requiresApproval ? "awaiting-approval" : "client-pending",
      nextPackageId: request.packageId,
    });
    if (!request.requiresApproval) {
      void this.approve(request, false); // a grant applies: nobody needs to be asked
      return;
    }
    const approvable = !request.source.truncated;
    const row = el(
      "li",
      { "data-request": request.requestId, "data-plugin": request.pluginId },
      el("strong", { class: "name" }, request.name),
      " ",
      el("span", { class: "purpose" }, request.purpose),
      el("span", { class: "cm-muted" }, ` ${request.mode} ${request.pluginId}/${request.packageId} (${request.pluginRunId})`),
      reviewSource(request),
      " ",
      button("Approve once", "approve-once", () => void this.approve(request, false), approvable),
      button("Approve future versions", "approve-future", () => void this.approve(request, true), approvable),
      button("Reject", "reject", () => void this.reject(request)),
    );
    this.rows.set(request.requestId, row);
    this.pending.append(row);
  }

  resolved(requestId: string, outcome: string): void {
    this.rows.get(requestId)?.remove();
    this.rows.delete(requestId);
    if (outcome === "cancelled") this.status(`request ${requestId} was cancelled`);
  }

  private async approve(request: RunRequestView, future: boolean): Promise<void> {
    this.lock(request.requestId);
    const started = await this.connection.call("runHostHalf", {
      requestId: request.requestId,
      pluginId: request.pluginId,
      packageId: request.packageId,
      mode: request.mode,
      approveFutureVersions: future,
    });
    if (!started.accepted) {
      if (started.code === "host-half-failed") {
        await this.settle(request, "", "host-half-failed", { message: started.message });
      } else {
        this.refused("run the Host half", started);
      }
      return;
    }
    this.plugins.update(request.pluginId, { state: "client-pending" });
    const reviewed = request.source.truncated ? undefined : request.source.client;
    const failure = await this.loadClientHalf(request.pluginId, request.packageId, request.name, started.pluginRunId, reviewed);
    if (failure === undefined) {
      await this.settle(request, started.pluginRunId, "success", {});
      this.plugins.update(request.pluginId, { state: "running", currentPackageId: request.packageId, nextPackageId: undefined });
    } else {
      await this.settle(request, started.pluginRunId, "client-half-failed", failure);
      this.plugins.update(request.pluginId, { state: "failed" });
    }
  }

  private async reject(request: RunRequestView): Promise<void> {
    this.lock(request.requestId);
    const answer = await this.settle(request, "", "rejected", {});
    if (answer.accepted) this.plugins.update(request.pluginId, { state: "rejected" });
  }

  private async settle(
    request: RunRequestView,
    pluginRunId: string,
    outcome: "success" | "rejected" | "host-half-failed" | "client-half-failed",
    failure: { message?: string; stack?: string },
  ): Promise<PageAnswerView> {
    const answer = await this.connection.call("settle", { requestId: request.requestId, pluginRunId, outcome, ...failure });
    if (!answer.accepted) this.refused(`settle ${request.requestId}`, answer);
    return answer;
  }

  /**
   * Fetches and loads a run's Client half; the failure to settle with, or undefined. With
   * `reviewed`, only that code loads: what runs is what the request showed.
   */
  private async loadClientHalf(
    pluginId: string,
    packageId: string,
    name: string,
    pluginRunId: string,
    reviewed?: string,
  ): Promise<{ message: string; stack?: string } | undefined> {
    const fetched = await this.connection.call("clientCode", { pluginId, pluginRunId });
    if (!fetched.accepted || fetched.code === undefined) return { message: `no Client half for ${pluginRunId}: ${fetched.message}` };
    if (reviewed !== undefined && fetched.code !== reviewed) return { message: `the Client half of ${pluginRunId} is not the source its request showed` };
    try {
      await this.slots.load({
        pluginId,
        packageId,
        pluginRunId,
        name,
        code: fetched.code,
        invoke: (method, argsJson) => this.connection.call("invoke", { pluginId, pluginRunId, method, argsJson }),
        reportError: ({ message, stack }) =>
          void this.connection.call("renderFailure", { pluginId, pluginRunId, message, ...(stack ? { stack } : {}) }),
      });
      return undefined;
    } catch (e) {
      return describe(e);
    }
  }

  private async panelRun(plugin: PluginView): Promise<void> {
    const packageId = plugin.nextPackageId ?? plugin.currentPackageId ?? plugin.packages.at(-1);
    if (packageId === undefined) return;
    const mode = plugin.currentPackageId && plugin.currentPackageId !== packageId ? "update" : "run";
    const started = await this.connection.call("panelRun", { pluginId: plugin.pluginId, packageId, mode });
    if (!started.accepted) {
      this.refused(`run ${plugin.pluginId}`, started);
      return;
    }
    const failure = await this.loadClientHalf(plugin.pluginId, packageId, plugin.name, started.pluginRunId);
    const outcome = failure === undefined ? "success" : "client-half-failed";
    const answer = await this.connection.call("settlePanelRun", {
      pluginId: plugin.pluginId,
      pluginRunId: started.pluginRunId,
      outcome,
      ...failure,
    });
    if (answer.accepted && failure === undefined) {
      this.plugins.update(plugin.pluginId, { state: "running", currentPackageId: packageId, nextPackageId: undefined });
    } else if (answer.accepted) {
      this.plugins.update(plugin.pluginId, { state: "failed" });
    } else {
      this.refused(`settle the run of ${plugin.pluginId}`, answer);
    }
  }

  private async panelStop(plugin: PluginView): Promise<void> {
    const answer = await this.connection.call("stop", { pluginId: plugin.pluginId });
    if (!answer.accepted) return this.refused(`stop ${plugin.pluginId}`, answer);
    await this.slots.unload(plugin.pluginId);
    this.plugins.update(plugin.pluginId, { state: "stopped" });
  }

  private async panelRemove(plugin: PluginView): Promise<void> {
    const answer = await this.connection.call("remove", { pluginId: plugin.pluginId });
    if (!answer.accepted) return this.refused(`remove ${plugin.pluginId}`, answer);
    await this.slots.remove(plugin.pluginId);
    this.plugins.delete(plugin.pluginId);
  }

  /** The person answered: the buttons go, so that one click is one answer. */
  private lock(requestId: string): void {
    for (const b of this.rows.get(requestId)?.querySelectorAll("button") ?? []) b.disabled = true;
  }

  private refused(what: string, answer: PageAnswerView): void {
    this.status(`could not ${what}: ${answer.code || "refused"} ${answer.message}`.trim());
  }
}

/** Both halves' source, as text (never markup), and whether it was cut. */
function reviewSource(request: RunRequestView): HTMLElement {
  const half = (which: "host" | "client", label: string, code: string): HTMLElement[] => [
    el("div", { class: "cm-muted" }, label),
    el("pre", { class: "source", "data-half": which }, code),
  ];
  return el(
    "div",
    { class: "review" },
    ...(request.hasHostHalf ? half("host", "Host half (runs in the plugin host):", request.source.host) : [el("div", { class: "cm-muted", "data-half": "host" }, "No Host half.")]),
    ...(request.source.client ? half("client", "Client half (runs in a sandboxed frame of this page):", request.source.client) : []),
    ...(request.source.truncated
      ? [el("p", { class: "source-cut" }, "This package is longer than the console shows (each half is cut at 65,536 characters): it cannot be reviewed whole, so it cannot be approved here.")]
      : []),
  );
}
