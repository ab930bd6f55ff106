/**
 * Client halves in the page: each plugin has its own slot (a mount element), and its loads and
 * unloads run one after another on a queue of its own (seed 002 §18): a new run first tears the
 * old entry down, an exact-run unload leaves a newer activation alone, and a failed step is
 * absorbed by the queue so that the next load (a fixed package) still runs.
 *
 * A Client half is a plain JavaScript async function body, evaluated with the parameters the
 * reference gives it (§9.2, seed 002 §17): `host` (`host.call(method, args)` reaches the Host
 * half's `harness.handle` handlers through `invoke`), `console` (tagged with the plugin),
 * `mount` (the slot's element), `styles` (the console's class names), `React` (the page's own
 * React, pinned with the console) and `ReactDOM` (`createRoot`; a root made through it is
 * unmounted when the half is unloaded). It returns a plugin: a function or an object with
 * `apply(ctx)`; `apply` may return a disposer, run on unload.
 */
import * as React from "react";
import { createRoot, type Root } from "react-dom/client";
import { el } from "./dom";

/** What `host.call` reaches: the page's `invoke` for one run. */
export type Invoke = (method: string, args: unknown) => Promise<unknown>;

export interface ClientContext {
  pluginId: string;
  packageId: string;
  pluginRunId: string;
  mount: HTMLElement;
  host: { call: Invoke };
  console: Console;
  /** Runs `fn` when this run's Client half is unloaded. */
  onDispose(fn: () => void | Promise<void>): void;
  /** Reports a failure to render after the activation settled (the agent is steered). */
  reportError(error: unknown): void;
}

export interface LoadRequest {
  pluginId: string;
  packageId: string;
  pluginRunId: string;
  name: string;
  code: string;
  invoke: Invoke;
  reportError: (error: unknown) => void;
}

interface Entry {
  pluginRunId: string;
  disposers: (() => void | Promise<void>)[];
}

/** The class names a Client half may use for a look that matches the console. */
export const STYLES = Object.freeze({ card: "cm-card", button: "cm-button", muted: "cm-muted", title: "cm-title" });

type AsyncBody = (...args: unknown[]) => Promise<unknown>;
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor as new (...params: string[]) => AsyncBody;

export class ClientSlots {
  private readonly tails = new Map<string, Promise<void>>();
  private readonly entries = new Map<string, Entry>();
  private readonly slots = new Map<string, HTMLElement>();

  constructor(private readonly container: HTMLElement) {}

  /** Loads a run's Client half (after unloading the plugin's previous one); rejects on failure. */
  load(request: LoadRequest): Promise<void> {
    return this.enqueue(request.pluginId, async () => {
      await this.teardown(request.pluginId);
      const slot = this.slot(request.pluginId, request.name);
      const mount = slot.querySelector<HTMLElement>("[data-mount]")!;
      slot.dataset.runId = request.pluginRunId;
      slot.dataset.state = "loading";
      const entry: Entry = { pluginRunId: request.pluginRunId, disposers: [] };
      this.entries.set(request.pluginId, entry);
      try {
        await evaluate(request, mount, entry);
        slot.dataset.state = "running";
      } catch (e) {
        slot.dataset.state = "failed";
        await this.teardown(request.pluginId, request.pluginRunId);
        throw e;
      }
    });
  }

  /** Unloads the plugin's Client half; with `pluginRunId`, only if that run is the loaded one. */
  unload(pluginId: string, pluginRunId?: string): Promise<void> {
    return this.enqueue(pluginId, async () => {
      await this.teardown(pluginId, pluginRunId);
      const slot = this.slots.get(pluginId);
      if (slot && !this.entries.has(pluginId)) slot.dataset.state = "unloaded";
    });
  }

  /** Unloads the plugin and removes its slot. */
  async remove(pluginId: string): Promise<void> {
    await this.unload(pluginId);
    this.slots.get(pluginId)?.remove();
    this.slots.delete(pluginId);
  }

  private enqueue(pluginId: string, task: () => Promise<void>): Promise<void> {
    const run = (this.tails.get(pluginId) ?? Promise.resolve()).then(task);
    this.tails.set(
      pluginId,
      run.catch(() => undefined), // absorbed: the next step runs whatever this one did
    );
    return run;
  }

  private async teardown(pluginId: string, pluginRunId?: string): Promise<void> {
    const entry = this.entries.get(pluginId);
    if (entry === undefined || (pluginRunId !== undefined && entry.pluginRunId !== pluginRunId)) return;
    this.entries.delete(pluginId);
    for (const dispose of entry.disposers.reverse()) {
      try {
        await dispose();
      } catch (e) {
        console.warn(`[cordis:${pluginId}] a disposer failed`, e);
      }
    }
    this.slots.get(pluginId)?.querySelector("[data-mount]")?.replaceChildren();
  }

  private slot(pluginId: string, name: string): HTMLElement {
    let slot = this.slots.get(pluginId);
    if (slot === undefined) {
      slot = el("section", { class: "slot", "data-plugin-slot": pluginId }, el("h3", {}, `${name} `, el("code", {}, pluginId)), el("div", { "data-mount": "" }));
      this.container.append(slot);
      this.slots.set(pluginId, slot);
    }
    return slot;
  }
}

async function evaluate(request: LoadRequest, mount: HTMLElement, entry: Entry): Promise<void> {
  const host = Object.freeze({ call: (method: string, args: unknown = null) => request.invoke(method, args) });
  const tagged = taggedConsole(request.pluginId);
  // Roots a half creates are its own: unmounted on unload, with its disposers (in reverse order).
  const reactDom = Object.freeze({
    createRoot: (container: Element | DocumentFragment): Root => {
      const root = createRoot(container);
      entry.disposers.push(() => root.unmount());
      return root;
    },
  });
  // a SyntaxError fails the load
  const body = new AsyncFunction("host", "console", "mount", "styles", "React", "ReactDOM", request.code);
  const plugin = await body(host, tagged, mount, STYLES, React, reactDom);
  if (plugin === undefined) throw new Error("the Client half returned `undefined` — did you forget `return`?");
  const apply =
    typeof plugin === "function"
      ? (plugin as (ctx: ClientContext) => unknown)
      : typeof (plugin as { apply?: unknown } | null)?.apply === "function"
        ? (ctx: ClientContext) => (plugin as { apply: (ctx: ClientContext) => unknown }).apply(ctx)
        : undefined;
  if (apply === undefined) throw new Error("the Client half must return a Plugin function or an object with apply(ctx)");
  const ctx: ClientContext = Object.freeze({
    pluginId: request.pluginId,
    packageId: request.packageId,
    pluginRunId: request.pluginRunId,
    mount,
    host,
    console: tagged,
    onDispose: (fn: () => void | Promise<void>) => void entry.disposers.push(fn),
    reportError: request.reportError,
  });
  const disposer = await apply(ctx);
  if (typeof disposer === "function") entry.disposers.push(disposer as () => void);
}

function taggedConsole(pluginId: string): Console {
  const tag = `[cordis:${pluginId}]`;
  return {
    ...console,
    log: (...a: unknown[]) => console.log(tag, ...a),
    info: (...a: unknown[]) => console.info(tag, ...a),
    warn: (...a: unknown[]) => console.warn(tag, ...a),
    error: (...a: unknown[]) => console.error(tag, ...a),
    debug: (...a: unknown[]) => console.debug(tag, ...a),
  };
}
