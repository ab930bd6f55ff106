/**
 * Client halves in the page: each plugin has its own slot, and its loads and unloads run one
 * after another on a queue of its own: a new run first tears the old entry
 * down, an exact-run unload leaves a newer activation alone, and a failed step is absorbed by
 * the queue so that the next load (a fixed package) still runs.
 *
 * A loaded half lives in a frame of its own (page/client-frame.ts): an opaque-origin sandbox
 * whose document is its mount, reaching the page only through its port. There it is a plain
 * JavaScript async function body evaluated with `host` (`host.call(method, args)` reaches the
 * Host half's `harness.handle` handlers of its own run through `invoke`), `console` (printed
 * here, tagged with the plugin), `mount` (the frame's body) and `styles` (the console's class
 * names, styled in the frame). It returns a plugin: a function or an object with `apply(ctx)`;
 * `apply` may return a disposer, run on unload; unloading removes the frame.
 */
import { ClientFrame, type Invoke } from "./client-frame";
import { el } from "./dom";

export { STYLES } from "./frame-messages";
export type { Invoke } from "./client-frame";

export interface LoadRequest {
  pluginId: string;
  packageId: string;
  pluginRunId: string;
  name: string;
  code: string;
  invoke: Invoke;
  reportError: (failure: { message: string; stack?: string }) => void;
}

interface Entry {
  pluginRunId: string;
  frame?: ClientFrame;
}

/** What the `Slots` inspect provider tells of one slot. */
export interface SlotView {
  pluginId: string;
  pluginRunId: string;
  state: string;
  text: string;
}

export class ClientSlots {
  private readonly tails = new Map<string, Promise<void>>();
  private readonly entries = new Map<string, Entry>();
  private readonly slots = new Map<string, HTMLElement>();
  /** The text each plugin's frame last reported. */
  private readonly texts = new Map<string, string>();

  constructor(private readonly container: HTMLElement) {}

  /** Loads a run's Client half (after unloading the plugin's previous one); rejects on failure. */
  load(request: LoadRequest): Promise<void> {
    return this.enqueue(request.pluginId, async () => {
      await this.teardown(request.pluginId);
      const slot = this.slot(request.pluginId, request.name);
      const mount = slot.querySelector<HTMLElement>("[data-mount]")!;
      slot.dataset.runId = request.pluginRunId;
      slot.dataset.state = "loading";
      const entry: Entry = { pluginRunId: request.pluginRunId };
      this.entries.set(request.pluginId, entry);
      const tag = `[cordis:${request.pluginId}]`;
      try {
        entry.frame = await ClientFrame.open(mount, `Client half of ${request.pluginId}`, request, {
          invoke: request.invoke,
          reportError: request.reportError,
          rendered: (text) => {
            if (this.entries.get(request.pluginId) === entry) this.texts.set(request.pluginId, text);
          },
          log: (level, text) => console[level](tag, text),
          broken: () => {
            if (this.entries.get(request.pluginId) === entry) slot.dataset.state = "failed";
          },
        });
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

  /** Each slot (or one plugin's): its run, state and what its frame last showed. */
  describe(pluginId?: string): SlotView[] {
    return [...this.slots.entries()]
      .filter(([id]) => pluginId === undefined || id === pluginId)
      .map(([id, slot]) => ({ pluginId: id, pluginRunId: slot.dataset.runId ?? "", state: slot.dataset.state ?? "", text: this.texts.get(id) ?? "" }));
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
    this.texts.delete(pluginId);
    await entry.frame?.dispose();
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
