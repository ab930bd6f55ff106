// A Cordis plugin host inside a TypeScript worker: evaluate a host half, apply its plugin,
// serve its tools until the runtime retracts it.
//
// The twin of runtime_service/worker/plugin_harness.py: worker.js hands its first frame here
// when it is `{"t":"host",...}` instead of a program's `start`, and the worker then lives until
// the runtime retracts the plugin (or kills it). It speaks exactly the Python harness's
// protocol, so the runtime's PluginHost has nothing per language:
//
//   runtime -> worker  host (once), invoke {id, name, args} (a tool) | invoke {id, handler, args}
//                      (a harness.handle handler) | invoke {id, service, name, args} (a provided
//                      service's method) | invoke {id, event, args} (an event), cancel {id},
//                      retract, services {services}, call_result {id, ok, value | message}
//   worker -> runtime  log {text}, started {regs} | failed {phase, message, stack}, regs {regs},
//                      result {id, ok, value [, meta] | message [, stack, notFound]},
//                      call {id, service, method, args}, call_cancel {id} (the invocation
//                      awaiting that call was cancelled), retracted
//
// The façade is specified in codemode_wire/host_facade.json (tests/runtime/test_host_facade.py
// holds both harnesses to it); in TypeScript's style (the Python harness's names in camelCase):
//
// - the host half is a strict async function body, types stripped with amaro as a program's
//   are (positions kept), that returns the plugin: a function `plugin(ctx)` or an object with
//   `apply(ctx)`, either may be async and may carry `inject` (service names). Its parameters:
//   `harness` ({defineTool, registerTool, handle}) and `console` (lines become logs tagged
//   `[cordis:<plugin id>]`); `require`, `fetch` and the timer globals are traps with a
//   teaching error, `process` and `Buffer` are undefined. Nothing executes another tool;
// - `ctx` is a read-only proxy: `ctx.tools` (schemas(), get(name), register(tool)),
//   `ctx.get(name)`, `ctx.effect(fn)`, `ctx.provide(name, value)`, `ctx.on`/`ctx.once`,
//   `ctx.timer` (timeout/interval, throttle/debounce) only when injected, and the injected
//   services;
// - the start is bounded by the start timeout: its synchronous parts by V8 itself (a vm
//   timeout interrupts a busy loop), its asynchronous waits by a timer. Busy work after an
//   `await` cannot be interrupted from inside: the runtime's own start deadline ends it;
// - every tool, handler, service method and event delivery is one invocation, cancellable
//   (its `signal` aborts; the call answers at once); the runtime bounds each one's CPU.
//
// The names, Python -> TypeScript: harness.define_tool(name=, description=, parameters=,
// execute=, output_schema=, presentation_meta=) -> harness.defineTool({name, description,
// parameters, execute, outputSchema, presentationMeta}); register_tool -> registerTool; None ->
// undefined (`ctx.get`, `ctx.tools.get`); `print` -> `console.log`; an `execute(args)` also gets
// `{signal}` (aborted when the call is cancelled: a promise cannot be cancelled from outside);
// a service method that returns nothing gives null, as Python's None. Everything else is
// spelled alike: ctx.tools.schemas/get/register, ctx.get/effect/provide/on/once, ctx.timer.
// timeout/interval/throttle/debounce, `inject`, events and their payloads.
//
// Not a security boundary by itself: the worker's sandbox is (worker/sandbox_child.py).

import { AsyncLocalStorage } from 'node:async_hooks';
import util from 'node:util';
import vm from 'node:vm';

import * as wire from './flatwire.js';
import {
  ArrayIsArray,
  ObjectDefineProperty,
  ObjectFreeze,
  ObjectGetOwnPropertyDescriptor,
  ObjectGetPrototypeOf,
  ObjectPrototype,
  ReflectOwnKeys,
  SafeMap,
  StringCtor,
  descriptor,
} from './intrinsics.js';
import {
  LOG_LINE_OVERHEAD,
  OutputLedger,
  fitPrefix,
  jsonStringSize,
  validText,
} from './ledger.js';
import {
  PROGRAM_FILENAME,
  ProgramError,
  compileProgram,
  field,
  finish,
  installOutput,
  renderException,
  send,
} from './core.js';

// The façade's error texts (codemode_wire/host_facade.json; the Python harness says the same in
// Python's terms).
export const LOSSY =
  'must be lossless JSON data (objects, arrays, strings, numbers, booleans, null) — not a ' +
  'class instance, function, Map/Set, Date, or undefined';
export const NOT_A_DEFINITION =
  'dynamic tool registration must use a tool returned by harness.defineTool(...)';
export const MISSING_RETURN = 'the Host half returned `undefined` — did you forget `return`?';
export const WRONG_RETURN = 'the Host half must return a Plugin function or an object with apply(ctx)';
export const NOT_A_SERVICE =
  "ctx.provide needs lossless JSON data, or an object with public methods, as the service: it " +
  "crosses to the owner's other plugins, which run in other processes";

// The host half's parameters: the façade, then the traps (one line: positions are kept).
const TRAPS = ['require', 'fetch', 'setTimeout', 'setInterval', 'setImmediate', 'clearTimeout', 'clearInterval'];
const HEAD = `(async function (harness, console, ${TRAPS.join(', ')}, process, Buffer) {"use strict";\n`;
// A script that calls the function under `BOUNDED_KEY`, run with a vm timeout: V8 interrupts
// it when it runs past (the only way to stop a busy loop from inside the worker).
const BOUNDED_KEY = '\u0000cordis-bounded';
const BOUNDED = new vm.Script(`globalThis[${JSON.stringify(BOUNDED_KEY)}]()`, { filename: 'cordis-bounded.js' });

// Captured before any host half runs: it may replace the globals.
const realSetTimeout = setTimeout;
const realClearTimeout = clearTimeout;
const realSetInterval = setInterval;
const realClearInterval = clearInterval;
const format = util.format;
const isPromise = util.types.isPromise;
const NumberIsSafeInteger = Number.isSafeInteger;
const FunctionPrototype = Function.prototype;

// The invocation (its AbortController) whose work is running: a service call made from it is
// cancelled with it, as a Python task's awaited call is (Node has no task to cancel).
/** @type {AsyncLocalStorage<AbortController>} */
const invocationScope = new AsyncLocalStorage();

class StartTimeout extends Error {}
class LoadError extends Error {}

/** @param {unknown} value */
function isThenable(value) {
  if (isPromise(value)) return true;
  if ((typeof value !== 'object' && typeof value !== 'function') || value === null) return false;
  try {
    return typeof (/** @type {any} */ (value).then) === 'function';
  } catch {
    return false;
  }
}

/** @param {unknown} value */
function isPlainObject(value) {
  if (typeof value !== 'object' || value === null || ArrayIsArray(value)) return false;
  const proto = ObjectGetPrototypeOf(value);
  return proto === ObjectPrototype || proto === null;
}

/**
 * What a failure says (the Python harness's `str(exc) or type(exc).__name__`).
 * @param {unknown} error
 */
function messageOf(error) {
  try {
    if (error instanceof Error || util.types.isNativeError(error)) {
      const raw = /** @type {any} */ (error);
      return StringCtor(raw.message || raw.name || 'Error');
    }
    return typeof error === 'symbol' ? error.toString() : StringCtor(error);
  } catch {
    return 'an unrenderable value';
  }
}

/**
 * `value`'s flat-wire tokens, or an Error whose message is `<what> <LOSSY>`.
 * @param {unknown} value
 * @param {string} what
 */
function lossless(value, what) {
  try {
    return wire.encode(value);
  } catch {
    throw new TypeError(`${what} ${LOSSY}`);
  }
}

/**
 * @param {string} name
 */
function notInjected(name) {
  return `service "${name}" is not injected. Declare it: inject: ['${name}', ...] on the plugin (or look it up with ctx.get)`;
}

/** @param {string} service */
function contextReturned(service) {
  return `service "${service}" returned a cordis Context, which the sandbox does not expose; return data instead`;
}

/**
 * An object whose assignments all fail with `<what> is read-only; cannot assign "<name>"`.
 * @param {object} target
 * @param {string} what
 */
function readOnly(target, what) {
  /** @param {string | symbol} name */
  const refuse = (name) => {
    throw new TypeError(`${what} is read-only; cannot assign "${StringCtor(name)}"`);
  };
  return new Proxy(ObjectFreeze(target), {
    set: (_t, name) => refuse(name),
    defineProperty: (_t, name) => refuse(name),
    deleteProperty: (_t, name) => refuse(name),
    setPrototypeOf: () => refuse('__proto__'),
  });
}

/**
 * The public methods of a provided service object: functions (data properties only, no getter
 * runs) along its prototype chain up to Object.prototype (or Function.prototype: a function's
 * `call` and `bind` are no service), not `constructor`, not `_private`.
 * @param {object} value
 */
function methodNames(value) {
  const names = new Set();
  /** @type {any} */
  let level = value;
  while (level !== null && level !== ObjectPrototype && level !== FunctionPrototype) {
    for (const key of ReflectOwnKeys(level)) {
      if (typeof key !== 'string' || key === 'constructor' || key.startsWith('_') || key === 'then') continue;
      const desc = ObjectGetOwnPropertyDescriptor(level, key);
      if (desc !== undefined && 'value' in desc && typeof desc.value === 'function') names.add(key);
    }
    level = ObjectGetPrototypeOf(level);
  }
  return [...names].sort();
}

/**
 * The function a consumer's call of `method` reaches (public methods only), or null.
 * @param {any} value
 * @param {string} method
 */
function methodOf(value, method) {
  if ((typeof value !== 'object' && typeof value !== 'function') || value === null) return null;
  return methodNames(value).includes(method) ? value[method] : null;
}

/**
 * @typedef {{name: string, description: string, inputSchema: unknown, outputSchema: unknown,
 *   execute: Function, presentationMeta: Function | null}} ToolDefinition
 */

class Host {
  /** @param {any} start */
  constructor(start) {
    this.pluginId = StringCtor(field(start, 'plugin_id') ?? '');
    this.source = StringCtor(field(start, 'source') ?? '');
    const timeout = Number(field(start, 'start_timeout_s'));
    this.startTimeoutS = timeout > 0 ? timeout : 5;
    const maxOutput = Number(field(start, 'max_output_bytes'));
    this.maxOutput = NumberIsSafeInteger(maxOutput) && maxOutput >= 4 ? maxOutput : 1 << 20;
    let visible = [];
    try {
      visible = /** @type {any} */ (wire.decode(field(start, 'tools') ?? []));
    } catch {
      visible = [];
    }
    /** @type {any[]} */
    this.visible = ArrayIsArray(visible) ? visible.filter(isPlainObject) : [];
    /** @type {Map<string, ToolDefinition>} */
    this.tools = new SafeMap();
    /** @type {Map<string, Function>} */
    this.handlers = new SafeMap();
    /** @type {Map<string, unknown>} */
    this.provides = new SafeMap();
    /** @type {Map<string, {name: string, methods: string[], data: string}>} */
    this.contracts = new SafeMap();
    this.available = services(decodeOr(field(start, 'services'), []));
    /** @type {any} */
    this.plugin = undefined;
    /** @type {string[]} */
    this.inject = [];
    this.applied = false;
    /** @type {Promise<unknown>} */
    this.transition = Promise.resolve(); // apply / park / retract, one at a time
    /** @type {Map<string, {fn: Function, once: boolean}[]>} */
    this.listeners = new SafeMap();
    /** @type {Map<number, {resolve: (v: unknown) => void, reject: (e: unknown) => void}>} */
    this.calls = new SafeMap(); // its service calls awaiting a call_result
    this.nextCall = 1;
    /** @type {string[]} */
    this.waitingFor = [];
    /** @type {Function[]} */
    this.disposers = [];
    /** @type {Map<number, AbortController>} */
    this.invocations = new SafeMap();
    this.started = false;
    this.retracting = false;
    this.ended = false;
    /** @type {WeakSet<object>} */
    this.definitions = new WeakSet(); // the private marker of harness.defineTool's results
    /** @type {WeakSet<object>} */
    this.contexts = new WeakSet(); // every ctx given out (a service may not return one)
    this.harness = readOnly(
      {
        defineTool: (/** @type {unknown} */ options) => this.defineTool(options),
        registerTool: (/** @type {unknown} */ tool) => this.registerTool(tool),
        handle: (/** @type {unknown} */ method, /** @type {unknown} */ fn) => this.handle(method, fn),
      },
      'harness',
    );
  }

  // -- output ------------------------------------------------------------------------------

  /** @param {string} text */
  log(text) {
    if (this.ended) return;
    text = validText(`[cordis:${this.pluginId}] ${text}`);
    // Cut so that the line, with its overhead, fits the output budget the runtime charges it
    // to (plugin_host.py: a call's lines past it stop the host).
    const room = this.maxOutput - LOG_LINE_OVERHEAD;
    if (jsonStringSize(text) > room) text = fitPrefix(text, room);
    send(`{"t":"log","text":${wire.spellString(text)}}`);
  }

  /** The tagged `console` of the host half: each call one line. */
  console() {
    /** @param {any[]} args */
    const line = (...args) => this.log(`${format(...args)}\n`);
    /** @type {Record<string, Function>} */
    const shim = {};
    for (const name of ['log', 'info', 'warn', 'error', 'debug']) shim[name] = line;
    return ObjectFreeze(shim);
  }

  registrations() {
    const tools = [...this.tools.values()].map((tool) => ({
      name: tool.name,
      description: tool.description,
      input: wire.jsonOfTokens(wire.encode(tool.inputSchema)),
      output: tool.outputSchema === undefined ? '' : wire.jsonOfTokens(wire.encode(tool.outputSchema)),
    }));
    const regs = {
      tools,
      handlers: [...this.handlers.keys()].sort(),
      provides: [...this.provides.keys()].sort(),
      services: [...this.contracts.keys()].sort().map((name) => this.contracts.get(name)),
      events: [...this.listeners.entries()].filter(([, items]) => items.length).map(([name]) => name).sort(),
      waiting_for: [...this.waitingFor],
    };
    return wire.spellTokens(wire.encode(regs));
  }

  changed() {
    if (this.started && !this.retracting && !this.ended) send(`{"t":"regs","regs":${this.registrations()}}`);
  }

  // -- the façade ----------------------------------------------------------------------------

  /** @param {unknown} options */
  defineTool(options) {
    if (!isPlainObject(options)) {
      throw new TypeError('harness.defineTool needs an options object { name, description, parameters, execute }');
    }
    const o = /** @type {any} */ (options);
    const { name, description = '', parameters, execute, outputSchema, presentationMeta } = o;
    if (typeof name !== 'string' || name === '') throw new TypeError('harness.defineTool needs a non-empty string `name`');
    if (typeof description !== 'string') throw new TypeError('harness.defineTool `description` must be a string');
    if (typeof execute !== 'function') throw new TypeError('harness.defineTool needs a function `execute(args)`');
    if (presentationMeta !== undefined && typeof presentationMeta !== 'function') {
      throw new TypeError('harness.defineTool `presentationMeta` must be a function (args, result) => object');
    }
    const schema = parameters === undefined ? { type: 'object', properties: {} } : parameters;
    if (!isPlainObject(schema)) throw new TypeError('harness.defineTool `parameters` must be a JSON Schema object');
    const input = lossless(schema, 'harness.defineTool `parameters`');
    let output;
    if (outputSchema !== undefined) {
      if (!isPlainObject(outputSchema)) throw new TypeError('harness.defineTool `outputSchema` must be an object');
      output = lossless(outputSchema, 'harness.defineTool `outputSchema`');
    }
    // Snapshots: later changes to the caller's objects change nothing registered.
    /** @type {ToolDefinition} */
    const tool = ObjectFreeze({
      name,
      description,
      inputSchema: wire.decode(input),
      outputSchema: output === undefined ? undefined : wire.decode(output),
      execute,
      presentationMeta: presentationMeta ?? null,
    });
    this.definitions.add(tool);
    return tool;
  }

  /** @param {unknown} tool */
  registerTool(tool) {
    if (typeof tool !== 'object' || tool === null || !this.definitions.has(tool)) throw new TypeError(NOT_A_DEFINITION);
    const definition = /** @type {ToolDefinition} */ (tool);
    if (this.tools.has(definition.name)) {
      throw new Error(
        `tool "${definition.name}" is already registered by this plugin; to replace it, keep the ` +
          'disposer registerTool returned and call it first',
      );
    }
    this.tools.set(definition.name, definition);
    const unregister = () => {
      if (this.tools.get(definition.name) === definition) {
        this.tools.delete(definition.name);
        this.changed();
      }
    };
    this.disposers.push(unregister);
    this.changed();
    return unregister;
  }

  /**
   * @param {unknown} method
   * @param {unknown} fn
   */
  handle(method, fn) {
    if (typeof method !== 'string' || method === '') throw new TypeError('harness.handle needs a non-empty string method name');
    if (typeof fn !== 'function') throw new TypeError('harness.handle needs a handler function');
    this.handlers.set(method, fn);
    const remove = () => {
      if (this.handlers.get(method) === fn) {
        this.handlers.delete(method);
        this.changed();
      }
    };
    this.disposers.push(remove);
    this.changed();
    return remove;
  }

  /** @param {unknown} fn */
  effect(fn) {
    if (typeof fn !== 'function') throw new TypeError('ctx.effect needs a function');
    const disposer = fn();
    if (isThenable(disposer)) throw new TypeError('ctx.effect runs its function synchronously: it may not be async');
    if (typeof disposer === 'function') this.disposers.push(disposer);
  }

  /**
   * @param {unknown} name
   * @param {unknown} value
   */
  provide(name, value) {
    if (typeof name !== 'string' || name === '') throw new TypeError('ctx.provide needs a non-empty string service name');
    if (name === 'timer') throw new Error('service "timer" is built in; provide it under another name');
    this.contracts.set(name, describe(name, value));
    this.provides.set(name, value);
    const withdraw = () => {
      if (this.provides.get(name) === value) {
        this.provides.delete(name);
        this.contracts.delete(name);
        this.changed();
      }
    };
    this.disposers.push(withdraw);
    this.changed();
  }

  /**
   * @param {unknown} event
   * @param {unknown} fn
   * @param {boolean} once
   */
  on(event, fn, once) {
    const verb = once ? 'ctx.once' : 'ctx.on';
    if (typeof event !== 'string' || event === '') throw new TypeError(`${verb} needs a non-empty string event name`);
    if (typeof fn !== 'function') throw new TypeError(`${verb} needs a listener function`);
    const listener = { fn, once };
    const items = this.listeners.get(event) ?? [];
    items.push(listener);
    this.listeners.set(event, items);
    const off = () => {
      const current = this.listeners.get(event) ?? [];
      const at = current.indexOf(listener);
      if (at >= 0) {
        current.splice(at, 1);
        if (!current.length) this.changed(); // no longer observed: the runtime stops delivering it
      }
    };
    this.disposers.push(off);
    if (items.length === 1) this.changed();
    return off;
  }

  /**
   * Runs the listeners of `event` in registration order; a failing one is logged.
   * @param {string} event
   * @param {unknown} payload
   */
  async emit(event, payload) {
    for (const listener of [...(this.listeners.get(event) ?? [])]) {
      if (listener.once) {
        const items = this.listeners.get(event) ?? [];
        const at = items.indexOf(listener);
        if (at < 0) continue; // fired already by an earlier delivery
        items.splice(at, 1);
        if (!items.length) this.changed();
      }
      try {
        await listener.fn(wire.snapshot(payload));
      } catch (error) {
        this.log(`a listener of "${event}" failed: ${renderException(error)}\n`);
      }
    }
  }

  // -- services of the owner's other plugins --------------------------------------------------

  /**
   * What a consumer reaches as `ctx.<name>` / `ctx.get(name)`: a copy of a data service, a proxy
   * of a service of methods; undefined when no other plugin provides it.
   * @param {string} name
   */
  service(name) {
    const contract = this.available.get(name);
    if (contract === undefined) return undefined;
    if (contract.data !== '') return wire.parseJson(contract.data);
    return serviceProxy(name, contract.methods, (service, method, args) => this.callService(service, method, args));
  }

  /**
   * @param {string} service
   * @param {string} method
   * @param {unknown[]} args
   */
  callService(service, method, args) {
    if (this.retracting) return Promise.reject(new Error(`service "${service}" cannot be called: the plugin is stopping`));
    let tokens;
    try {
      tokens = wire.encode(args);
    } catch {
      return Promise.reject(new TypeError(`the arguments of service "${service}".${method} ${LOSSY}`));
    }
    const invocation = invocationScope.getStore();
    if (invocation?.signal.aborted) return Promise.reject(new Error('the call was cancelled'));
    const id = this.nextCall;
    this.nextCall += 1;
    return new Promise((resolve, reject) => {
      const cancelled = () => {
        // The invocation awaiting it was cancelled: so is the provider's (a late answer finds
        // no call any more).
        if (!this.calls.has(id)) return;
        this.calls.delete(id);
        if (!this.ended) send(`{"t":"call_cancel","id":${id}}`);
        reject(new Error('the call was cancelled'));
      };
      const settled = () => invocation?.signal.removeEventListener('abort', cancelled);
      this.calls.set(id, {
        resolve: (value) => {
          settled();
          resolve(value);
        },
        reject: (error) => {
          settled();
          reject(error);
        },
      });
      invocation?.signal.addEventListener('abort', cancelled, { once: true });
      send(
        `{"t":"call","id":${id},"service":${wire.spellString(service)},"method":${wire.spellString(method)},` +
          `"args":${wire.spellTokens(tokens)}}`,
      );
    });
  }

  /** @param {any} message */
  callAnswered(message) {
    const id = field(message, 'id');
    const call = this.calls.get(id);
    if (call === undefined) return;
    this.calls.delete(id);
    if (field(message, 'ok') === true) {
      try {
        call.resolve(wire.decode(field(message, 'value')));
      } catch {
        call.reject(new Error("the service's result was not lossless JSON"));
      }
    } else {
      const text = field(message, 'message');
      call.reject(new Error(typeof text === 'string' ? text : 'the call failed'));
    }
  }

  missing() {
    return this.inject.filter((name) => name !== 'timer' && !this.available.has(name));
  }

  /**
   * `work` after every earlier transition (apply, park, retract), one at a time.
   * @template T
   * @param {() => Promise<T>} work
   * @returns {Promise<T>}
   */
  serialized(work) {
    const next = this.transition.then(work, work);
    this.transition = next.then(
      () => undefined,
      () => undefined,
    );
    return next;
  }

  /**
   * The owner's other plugins' services changed: start a parked plugin whose services are all
   * there now; dispose and park a running one that lost one.
   * @param {unknown} raw
   */
  servicesChanged(raw) {
    this.available = services(raw);
    return this.serialized(async () => {
      if (this.plugin === undefined || this.retracting || this.ended) return;
      const missing = this.missing();
      if (this.applied && missing.length) {
        await this.emit('plugin/dispose', { reason: 'waiting', waitingFor: missing });
        await this.dispose();
        this.applied = false;
        this.waitingFor = missing;
        this.changed();
      } else if (!this.applied && !missing.length) {
        const late = `the Plugin did not start within ${seconds(this.startTimeoutS)} s`;
        try {
          await this.bounded(() => this.applyNow(), late);
        } catch (error) {
          // The plugin cannot run: the host ends, the registry steers the owner.
          await this.dispose();
          const text = error instanceof StartTimeout ? late : messageOf(error);
          this.fail('host-apply', `its injected services appeared, but its start failed: ${text}`, renderException(error));
        }
        this.changed();
      } else if (!this.applied) {
        this.waitingFor = missing;
        this.changed();
      }
    });
  }

  /**
   * `ctx.timer.timeout(fn, ms)`: disposed on retract; returns its own cancel.
   * @param {unknown} fn
   * @param {unknown} ms
   */
  timeout(fn, ms) {
    if (typeof fn !== 'function') throw new TypeError('ctx.timer.timeout needs a function');
    const handle = realSetTimeout(() => this.guarded(fn), Math.max(0, Number(ms) || 0));
    const cancel = () => realClearTimeout(handle);
    this.disposers.push(cancel);
    return cancel;
  }

  /**
   * @param {unknown} fn
   * @param {unknown} ms
   */
  interval(fn, ms) {
    if (typeof fn !== 'function') throw new TypeError('ctx.timer.interval needs a function');
    const handle = realSetInterval(() => this.guarded(fn), Math.max(1, Number(ms) || 0));
    const cancel = () => realClearInterval(handle);
    this.disposers.push(cancel);
    return cancel;
  }

  /**
   * `ctx.timer.throttle(fn, ms)`: a function that calls `fn` at once, then at most once per
   * `ms`: calls inside a window are folded into one at its end, with the last call's arguments.
   * @param {unknown} fn
   * @param {unknown} ms
   */
  throttle(fn, ms) {
    if (typeof fn !== 'function') throw new TypeError('ctx.timer.throttle needs a function');
    const period = Math.max(0, Number(ms) || 0);
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let window;
    /** @type {unknown[] | undefined} */
    let pending;
    let stopped = false;
    const windowEnds = () => {
      window = undefined;
      if (pending !== undefined) {
        const args = pending;
        pending = undefined;
        throttled(...args);
      }
    };
    const throttled = (/** @type {unknown[]} */ ...args) => {
      if (stopped) return;
      if (window !== undefined) {
        pending = args;
        return;
      }
      window = realSetTimeout(windowEnds, period);
      this.guarded(() => fn(...args));
    };
    this.disposers.push(() => {
      stopped = true;
      pending = undefined;
      if (window !== undefined) realClearTimeout(window);
    });
    return throttled;
  }

  /**
   * `ctx.timer.debounce(fn, ms)`: a function that calls `fn` once `ms` after the last of a burst
   * of calls, with that call's arguments.
   * @param {unknown} fn
   * @param {unknown} ms
   */
  debounce(fn, ms) {
    if (typeof fn !== 'function') throw new TypeError('ctx.timer.debounce needs a function');
    const delay = Math.max(0, Number(ms) || 0);
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let waiting;
    let stopped = false;
    const debounced = (/** @type {unknown[]} */ ...args) => {
      if (stopped) return;
      if (waiting !== undefined) realClearTimeout(waiting);
      waiting = realSetTimeout(() => {
        waiting = undefined;
        this.guarded(() => fn(...args));
      }, delay);
    };
    this.disposers.push(() => {
      stopped = true;
      if (waiting !== undefined) realClearTimeout(waiting);
    });
    return debounced;
  }

  /** @param {Function} fn */
  guarded(fn) {
    const failed = (/** @type {unknown} */ error) => this.log(`timer callback failed: ${renderException(error)}\n`);
    try {
      const outcome = fn();
      if (isThenable(outcome)) Promise.resolve(outcome).catch(failed);
    } catch (error) {
      failed(error);
    }
  }

  // -- start -----------------------------------------------------------------------------------

  /**
   * `work()` within the start timeout: its synchronous part interrupted by V8 (vm timeout),
   * its wait by a timer; either way a StartTimeout with `late`.
   * @param {() => unknown} work
   * @param {string} late
   */
  async bounded(work, late) {
    const ms = Math.max(1, Math.ceil(this.startTimeoutS * 1000));
    let outcome;
    ObjectDefineProperty(globalThis, BOUNDED_KEY, descriptor({ value: work, configurable: true, writable: true }));
    try {
      outcome = BOUNDED.runInThisContext({ timeout: ms });
    } catch (error) {
      if (/** @type {any} */ (error)?.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') throw new StartTimeout(late);
      throw error;
    } finally {
      delete (/** @type {any} */ (globalThis))[BOUNDED_KEY];
    }
    if (!isThenable(outcome)) return outcome;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;
    const expired = new Promise((_resolve, reject) => {
      timer = realSetTimeout(() => reject(new StartTimeout(late)), ms);
    });
    try {
      return await Promise.race([outcome, expired]);
    } finally {
      realClearTimeout(timer);
    }
  }

  /** The plugin the host half returns (throws LoadError for what it cannot be). */
  async evaluate() {
    const main = compileProgram(this.source, HEAD);
    const traps = TRAPS.map(trap);
    const result = await this.bounded(
      () => main(this.harness, this.console(), ...traps, undefined, undefined),
      `the Host half did not finish within ${seconds(this.startTimeoutS)} s`,
    );
    if (result === undefined) throw new LoadError(MISSING_RETURN);
    const plugin = /** @type {any} */ (result);
    let apply;
    try {
      apply = typeof plugin === 'function' ? plugin : plugin?.apply;
    } catch {
      apply = undefined;
    }
    if (typeof apply !== 'function') throw new LoadError(WRONG_RETURN);
    return plugin;
  }

  /**
   * The first apply, called synchronously (inside `bounded`: a busy start is interrupted). It
   * is the first transition: a services change that arrives meanwhile waits for it.
   * @param {any} plugin
   */
  apply(plugin) {
    const inject = plugin.inject ?? [];
    if (!ArrayIsArray(inject) || !inject.every((name) => typeof name === 'string')) {
      throw new TypeError('`inject` must be an array of service names');
    }
    this.plugin = plugin;
    this.inject = [...inject];
    const missing = this.missing();
    if (missing.length) {
      this.waitingFor = missing; // parked: counts as a successful activation
      return undefined;
    }
    const outcome = this.applyNow();
    const settled = Promise.resolve(outcome).then(
      () => undefined,
      () => undefined,
    );
    this.transition = this.transition.then(() => settled);
    return outcome;
  }

  applyNow() {
    this.waitingFor = [];
    const ctx = this.context(new Set(this.inject));
    this.applied = true;
    const plugin = this.plugin;
    return typeof plugin === 'function' ? plugin(ctx) : plugin.apply(ctx);
  }

  async start() {
    const lateApply = `the Plugin did not start within ${seconds(this.startTimeoutS)} s`;
    let plugin;
    try {
      plugin = await this.evaluate();
    } catch (error) {
      if (error instanceof StartTimeout || error instanceof LoadError) return this.fail('host-load', error.message);
      if (error instanceof ProgramError) return this.fail('host-load', withSourceLine(error.message, this.source));
      return this.fail('host-load', messageOf(error), renderException(error));
    }
    try {
      await this.bounded(() => this.apply(plugin), lateApply);
    } catch (error) {
      await this.dispose(); // a plugin whose start throws is disposed first
      if (error instanceof StartTimeout) return this.fail('host-apply', lateApply);
      return this.fail('host-apply', messageOf(error), renderException(error));
    }
    this.started = true;
    send(`{"t":"started","regs":${this.registrations()}}`);
    return undefined;
  }

  /**
   * The last word of a host whose plugin cannot go on: then it waits to be killed.
   * @param {string} phase
   * @param {string} message
   * @param {string} [stack]
   */
  fail(phase, message, stack = '') {
    message = fitPrefix(validText(message), this.maxOutput);
    stack = fitPrefix(validText(stack), this.maxOutput);
    this.ended = true;
    finish(
      `{"t":"failed","phase":${wire.spellString(phase)},"message":${wire.spellString(message)},` +
        `"stack":${wire.spellString(stack)}}`,
    );
  }

  /**
   * The plugin's `ctx`: read-only, exposing only the façade and the injected services.
   * @param {Set<string>} injected
   */
  context(injected) {
    const host = this;
    const tools = readOnly(
      {
        schemas: () => wire.snapshot(host.visible),
        get: (/** @type {unknown} */ name) => {
          const item = host.visible.find((view) => view.name === name);
          return item === undefined ? undefined : wire.snapshot(item);
        },
        register: (/** @type {unknown} */ tool) => host.registerTool(tool),
      },
      'ctx.tools',
    );
    // The built-in injectable service; setTimeout / setInterval are timeout / interval.
    const timer = readOnly(
      {
        timeout: (/** @type {unknown} */ fn, /** @type {unknown} */ ms) => host.timeout(fn, ms),
        interval: (/** @type {unknown} */ fn, /** @type {unknown} */ ms) => host.interval(fn, ms),
        setTimeout: (/** @type {unknown} */ fn, /** @type {unknown} */ ms) => host.timeout(fn, ms),
        setInterval: (/** @type {unknown} */ fn, /** @type {unknown} */ ms) => host.interval(fn, ms),
        throttle: (/** @type {unknown} */ fn, /** @type {unknown} */ ms) => host.throttle(fn, ms),
        debounce: (/** @type {unknown} */ fn, /** @type {unknown} */ ms) => host.debounce(fn, ms),
      },
      'the timer service',
    );
    /** @type {Record<string, unknown>} */
    const facade = {
      tools,
      get: (/** @type {string} */ name) => (host.provides.has(name) ? host.provides.get(name) : host.service(name)),
      effect: (/** @type {unknown} */ fn) => host.effect(fn),
      provide: (/** @type {unknown} */ name, /** @type {unknown} */ value) => host.provide(name, value),
      on: (/** @type {unknown} */ event, /** @type {unknown} */ fn) => host.on(event, fn, false),
      once: (/** @type {unknown} */ event, /** @type {unknown} */ fn) => host.on(event, fn, true),
    };
    /** @param {string | symbol} name */
    const refuse = (name) => {
      throw new TypeError(`sandbox ctx is read-only; cannot assign "${StringCtor(name)}"`);
    };
    // An ordinary target: a `has` that reports names a frozen one lacks would break the
    // proxy's invariants.
    const ctx = new Proxy({}, {
      get(_target, name) {
        if (typeof name === 'symbol' || name === 'then') return undefined; // `await ctx` is no lookup
        if (Object.hasOwn(facade, name)) return facade[name];
        if (name === 'timer') {
          if (injected.has('timer')) return timer;
          throw new TypeError(notInjected('timer'));
        }
        if (injected.has(name)) {
          const service = host.service(name);
          if (service !== undefined) return service;
          throw new TypeError(`service "${name}" is not available right now`);
        }
        if (host.available.has(name) || host.provides.has(name)) throw new TypeError(notInjected(name));
        throw new TypeError(`sandbox ctx does not expose "${name}"`);
      },
      has(_target, name) {
        return typeof name === 'string' && (Object.hasOwn(facade, name) || injected.has(name));
      },
      // Its own keys are the façade's (as a Python ctx's dir()), so Object.keys(ctx) says what
      // it exposes; the injected services are reached by name.
      ownKeys: () => Object.keys(facade),
      getOwnPropertyDescriptor(_target, name) {
        if (typeof name !== 'string' || !Object.hasOwn(facade, name)) return undefined;
        return { value: facade[name], writable: false, enumerable: true, configurable: true };
      },
      set: (_t, name) => refuse(name),
      defineProperty: (_t, name) => refuse(name),
      deleteProperty: (_t, name) => refuse(name),
      setPrototypeOf: () => refuse('__proto__'),
    });
    this.contexts.add(ctx);
    return ctx;
  }

  // -- serving -------------------------------------------------------------------------------

  /** @param {any} message */
  onMessage(message) {
    if (this.ended) return;
    const kind = field(message, 't');
    const id = field(message, 'id');
    if (kind === 'invoke' && NumberIsSafeInteger(id)) {
      const handler = field(message, 'handler');
      const event = field(message, 'event');
      const service = field(message, 'service');
      if (typeof handler === 'string' && handler !== '') this.invokeHandler(id, handler, field(message, 'args'));
      else if (typeof event === 'string' && event !== '') this.deliver(id, event, field(message, 'args'));
      else if (typeof service === 'string' && service !== '') {
        this.serve(id, service, field(message, 'name'), field(message, 'args'));
      } else this.invoke(id, field(message, 'name'), field(message, 'args'));
    } else if (kind === 'call_result') {
      this.callAnswered(message);
    } else if (kind === 'services') {
      let raw;
      try {
        raw = wire.decode(field(message, 'services'));
      } catch {
        return;
      }
      this.servicesChanged(raw);
    } else if (kind === 'cancel') {
      const running = this.invocations.get(id);
      if (running !== undefined) {
        this.invocations.delete(id);
        running.abort();
        this.reply(id, false, 'the call was cancelled', true);
      }
    } else if (kind === 'retract' && !this.retracting) {
      this.retracting = true;
      this.retract();
    }
  }

  /** An error thrown where nothing awaits it (a timer's callback): logged, the host goes on.
   * @param {unknown} error */
  uncaught(error) {
    this.log(`an error nothing awaited: ${renderException(error)}\n`);
  }

  /**
   * @param {number} id
   * @param {unknown} name
   * @param {unknown} tokens
   */
  invoke(id, name, tokens) {
    const tool = typeof name === 'string' ? this.tools.get(name) : undefined;
    if (tool === undefined || this.retracting) {
      this.reply(id, false, `the plugin has no tool "${StringCtor(name)}"`);
      return;
    }
    const args = decodeOr(tokens, INVALID);
    if (args === INVALID) {
      this.reply(id, false, 'tool arguments must be lossless JSON');
      return;
    }
    this.runTool(id, `tool "${tool.name}"`, (/** @type {AbortSignal} */ signal) => tool.execute(args, { signal }), {
      presentationMeta: tool.presentationMeta,
      args,
    });
  }

  /**
   * Another plugin of the owner calls a method of a service this one provides.
   * @param {number} id
   * @param {string} service
   * @param {unknown} method
   * @param {unknown} tokens
   */
  serve(id, service, method, tokens) {
    const value = this.provides.get(service);
    const fn = typeof method === 'string' ? methodOf(value, method) : null;
    if (fn === null || this.retracting) {
      this.reply(id, false, `service "${service}" has no method "${StringCtor(method)}"`);
      return;
    }
    const args = decodeOr(tokens, INVALID);
    if (!ArrayIsArray(args)) {
      this.reply(id, false, 'service arguments must be a JSON array');
      return;
    }
    // A method without a result gives null, as Python's gives None.
    this.runTool(id, `service "${service}".${StringCtor(method)}`, async () => (await fn.apply(value, args)) ?? null, {
      service,
    });
  }

  /**
   * @param {number} id
   * @param {string} event
   * @param {unknown} tokens
   */
  deliver(id, event, tokens) {
    const payload = decodeOr(tokens, INVALID);
    if (payload === INVALID) {
      this.reply(id, false, 'event payloads must be lossless JSON');
      return;
    }
    if (this.retracting) {
      this.reply(id, false, 'the plugin is stopping');
      return;
    }
    this.runTool(id, `event "${event}"`, async () => {
      await this.emit(event, payload);
      return null;
    });
  }

  /**
   * A page's `invoke` of a `harness.handle` handler.
   * @param {number} id
   * @param {string} method
   * @param {unknown} tokens
   */
  invokeHandler(id, method, tokens) {
    const handler = this.handlers.get(method);
    if (handler === undefined || this.retracting) {
      const text = wire.spellString(`the plugin has no handler "${method}"`);
      send(`{"t":"result","id":${id},"ok":false,"message":${text},"notFound":true}`);
      return;
    }
    const args = decodeOr(tokens, INVALID);
    if (args === INVALID) {
      this.reply(id, false, 'handler arguments must be lossless JSON');
      return;
    }
    this.runTool(id, `handler "${method}"`, () => handler(args), { withStack: true });
  }

  /**
   * Runs a tool, a service method, an event's listeners or (`withStack`: its failure carries the
   * stack, for the page) a handler, and sends the result unless the call was cancelled first.
   * @param {number} id
   * @param {string} what
   * @param {(signal: AbortSignal) => unknown} execute
   * @param {{service?: string, presentationMeta?: Function | null, args?: unknown, withStack?: boolean}} [options]
   */
  async runTool(id, what, execute, options = {}) {
    const controller = new AbortController();
    this.invocations.set(id, controller);
    const current = () => this.invocations.get(id) === controller && !this.ended;
    let value;
    /** @type {unknown} */
    let meta = NO_META;
    try {
      value = await invocationScope.run(controller, () => execute(controller.signal));
      if (options.presentationMeta && current()) {
        // Given a copy: the card's metadata cannot change the value sent.
        meta = await options.presentationMeta(options.args, wire.snapshot(value));
      }
    } catch (error) {
      if (!current()) return; // cancelled (answered already) or the host is over
      this.invocations.delete(id);
      if (!options.withStack) {
        this.reply(id, false, messageOf(error));
        return;
      }
      const message = fitPrefix(validText(messageOf(error)), this.maxOutput);
      const stack = fitPrefix(validText(renderException(error)), this.maxOutput);
      send(`{"t":"result","id":${id},"ok":false,"message":${wire.spellString(message)},"stack":${wire.spellString(stack)}}`);
      return;
    }
    if (!current()) return;
    this.invocations.delete(id);
    if (options.service && typeof value === 'object' && value !== null && this.contexts.has(value)) {
      this.reply(id, false, contextReturned(options.service));
      return;
    }
    this.sendValue(id, what, value, meta);
  }

  /**
   * The successful result frame; `meta` (unless NO_META) is the tool's presentation metadata,
   * which must be a lossless plain object.
   * @param {number} id
   * @param {string} what
   * @param {unknown} value
   * @param {unknown} meta
   */
  sendValue(id, what, value, meta) {
    let tokens;
    try {
      tokens = wire.encode(value);
    } catch {
      this.reply(id, false, `the result of ${what} ${LOSSY}`);
      return;
    }
    if (!new OutputLedger(this.maxOutput).fitsTokens(tokens)) {
      this.reply(id, false, `the result exceeds the output budget of ${this.maxOutput} bytes`);
      return;
    }
    let text = `{"t":"result","id":${id},"ok":true,"value":${wire.spellTokens(tokens)}`;
    if (meta !== NO_META) {
      try {
        if (!isPlainObject(meta)) throw new TypeError('not an object');
        text += `,"meta":${wire.spellTokens(wire.encode(meta))}`;
      } catch {
        this.reply(id, false, `the presentationMeta of ${what} must return an object that ${LOSSY}`);
        return;
      }
    }
    try {
      send(`${text}}`); // framing refuses (before writing) what the channel cannot carry
    } catch {
      this.reply(id, false, `the result of ${what} is too large for the channel`);
    }
  }

  /**
   * @param {number} id
   * @param {boolean} ok
   * @param {string} message
   */
  reply(id, ok, message, cancelled = false) {
    message = fitPrefix(validText(message), this.maxOutput);
    const flag = cancelled ? ',"cancelled":true' : '';
    send(`{"t":"result","id":${id},"ok":${ok},"message":${wire.spellString(message)}${flag}}`);
  }

  async dispose() {
    for (const [id, controller] of [...this.invocations]) {
      this.invocations.delete(id);
      controller.abort();
      this.reply(id, false, 'the call was cancelled', true);
    }
    for (const [id, call] of [...this.calls]) {
      this.calls.delete(id);
      call.reject(new Error('the plugin was disposed'));
    }
    while (this.disposers.length) {
      const disposer = /** @type {Function} */ (this.disposers.pop()); // reverse order of registration
      try {
        await disposer();
      } catch (error) {
        this.log(`a disposer failed: ${renderException(error)}\n`);
      }
    }
  }

  retract() {
    return this.serialized(async () => {
      if (this.applied) await this.emit('plugin/dispose', { reason: 'stop' });
      await this.dispose();
      this.ended = true;
      finish('{"t":"retracted"}');
    });
  }
}

const NO_META = Symbol('no presentation metadata');
const INVALID = Symbol('not lossless JSON');

/**
 * @param {unknown} tokens
 * @param {any} fallback
 * @returns {any}
 */
function decodeOr(tokens, fallback) {
  try {
    return wire.decode(/** @type {any} */ (tokens));
  } catch {
    return fallback;
  }
}

/** @param {number} value */
function seconds(value) {
  // As Python's `:g` spells the start timeout (0.3, 5, 1.25).
  return StringCtor(Number(value.toPrecision(6)));
}

/**
 * A trap standing in for a global the host half cannot use, with a teaching error.
 * @param {string} name
 */
function trap(name) {
  const why =
    name === 'require'
      ? 'require is not available in a Host half: it is a plain async function body without modules'
      : name === 'fetch'
        ? 'fetch is not available in a Host half: a plugin host has no network'
        : `${name} is not available in a Host half: inject "timer" and use ctx.timer.timeout / ctx.timer.interval, which are disposed with the plugin`;
  return {
    [name]() {
      throw new TypeError(why);
    },
  }[name];
}

/**
 * A compile error with the offending line of the host half and a caret under the place.
 * @param {string} text "SyntaxError: <message>\n    at program.ts:<line>:<column>"
 * @param {string} source
 */
function withSourceLine(text, source) {
  const at = /at program\.ts:(\d+):(\d+)$/.exec(text);
  if (at === null) return text;
  const line = source.split('\n')[Number(at[1]) - 1] ?? '';
  return `${text}\n${line}\n${' '.repeat(Math.max(0, Math.min(Number(at[2]) - 1, line.length)))}^`;
}

/**
 * The contract of a provided service: `{name, methods, data}` (data: JSON text, or "").
 * @param {string} name
 * @param {unknown} value
 */
function describe(name, value) {
  let tokens = null;
  try {
    tokens = wire.encode(value);
  } catch {
    tokens = null;
  }
  if (tokens !== null) return { name, methods: [], data: wire.jsonOfTokens(tokens) };
  const methods = (typeof value === 'object' || typeof value === 'function') && value !== null ? methodNames(value) : [];
  if (!methods.length) throw new TypeError(NOT_A_SERVICE);
  return { name, methods, data: '' };
}

/**
 * An injected service of methods: `await ctx.<service>.<method>(...args)`.
 * @param {string} name
 * @param {string[]} methods
 * @param {(service: string, method: string, args: unknown[]) => Promise<unknown>} call
 */
function serviceProxy(name, methods, call) {
  const known = new Set(methods);
  return new Proxy({}, {
    get(_target, method) {
      if (typeof method === 'symbol' || method === 'then') return undefined;
      if (!known.has(method)) throw new TypeError(`service "${name}" has no method "${method}"`);
      return (/** @type {unknown[]} */ ...args) => call(name, method, args);
    },
    has: (_target, method) => typeof method === 'string' && known.has(method),
    set(_target, key) {
      throw new TypeError(`service "${name}" is read-only; cannot assign "${StringCtor(key)}"`);
    },
  });
}

/**
 * The services the runtime says other plugins provide, by name (rebuilt field by field).
 * @param {unknown} raw
 */
function services(raw) {
  /** @type {Map<string, {methods: string[], data: string}>} */
  const out = new SafeMap();
  for (const item of ArrayIsArray(raw) ? raw : []) {
    if (!isPlainObject(item)) continue;
    const { name, methods, data } = /** @type {any} */ (item);
    if (typeof name !== 'string' || out.has(name)) continue;
    out.set(name, {
      methods: ArrayIsArray(methods) ? methods.filter((m) => typeof m === 'string') : [],
      data: typeof data === 'string' ? data : '',
    });
  }
  return out;
}

/**
 * Becomes the plugin host of the `host` message; returns what serves the later frames.
 * @param {any} start
 */
export function serveHost(start) {
  const host = new Host(start);
  // The host half's raw stream writes are logs too, as a Python host's sys.stdout is.
  installOutput({ emit: (/** @type {string} */ text) => host.log(text) });
  ObjectDefineProperty(process, 'env', descriptor({ value: {}, writable: true, configurable: true, enumerable: true }));
  host.start().catch((error) => host.fail('host-load', messageOf(error), renderException(error)));
  return host;
}

export { PROGRAM_FILENAME };
