// The TypeScript worker's program runner: one program, its `tools` namespace, its output, its
// outcome. The entry point (worker.js) hands it the worker when the first frame is a
// program's `start`:
//
//   runtime -> worker  {"t":"start","program","bindings","max_output_bytes",...}
//   worker -> runtime  {"t":"log","text"}                    each console call / stream write
//                      {"t":"call","id","name","args"}       ids 1, 2, 3, ...; args flat wire
//   runtime -> worker  {"t":"reply","id","ok":true,"value"} | {"t":"reply","id","ok":false,"message"}
//   worker -> runtime  {"t":"done"} | {"t":"done","value"} | {"t":"done","error":{"kind","message"}}
//                      | {"t":"output-limit"}                the last message; then it waits
//
// What it shares with the plugin harness (the channel, compilation, rendering, the output
// streams, the last message) is in core.js. Everything it sends is pre-checked against the
// output ledger; the runtime trusts none of it anyway.

import util from 'node:util';

import * as wire from './flatwire.js';
import {
  ArrayIsArray,
  ArrayPrototypeJoin,
  ArrayPrototypeSlice,
  ArrayPrototypeSort,
  ObjectDefineProperty,
  ObjectFreeze,
  SafeMap,
  MapPrototypeGet,
  MapPrototypeSet,
  MapPrototypeDelete,
  MathAbs,
  MathFloor,
  MathMax,
  MathMin,
  ProxyCtor,
  ReflectGet,
  SafeSet,
  SetPrototypeHas,
  StringCtor,
  StringPrototypeCharCodeAt,
  StringPrototypeSlice,
  JSONParse,
  descriptor,
  uncurry,
} from './intrinsics.js';
import { OutputLedger, fitPrefix, jsonStringSize, validText } from './ledger.js';
import {
  FrameBuffer,
  ProgramError,
  compileProgram,
  field,
  finish,
  frame,
  rawFrame,
  hasFinished,
  installOutput,
  parseMessage,
  prepareOutput,
  queueFrame,
  receive,
  renderException,
  send,
} from './core.js';

const RECV_BYTES = 1 << 16; // one channel read at most
const REHEARSED_CALLS = 200; // see rehearseCalls
// The same texts as the Python worker's (framing.py, program.py) and the registry's bridge.
export const LOSSY_ARGUMENTS = 'tool arguments must be lossless JSON';
export const LOSSY_COMPLETION = 'program completion must be lossless JSON';
export const LOSSY_RESOLUTION = 'binding resolution must be lossless JSON';
export const NO_ARGUMENTS = `${LOSSY_ARGUMENTS} (call the tool with an arguments object, e.g. \`{}\`)`;

// Captured before any program code runs (see intrinsics.js).
const format = util.format;
const BufferAllocUnsafe = Buffer.allocUnsafe;
const BufferWrite = uncurry(Buffer.prototype.write);
const BufferToString = uncurry(Buffer.prototype.toString);
const BufferWriteUInt32BE = uncurry(Buffer.prototype.writeUInt32BE);

// -- the program's view --------------------------------------------------------------------

/** A binding call failed: `toolName` names the binding, `message` says why. */
export class ToolCallError extends Error {
  /**
   * @param {string} message
   * @param {string} toolName
   */
  constructor(message, toolName) {
    super(message);
    ObjectDefineProperty(
      this, 'name', descriptor({ value: 'ToolCallError', enumerable: true, writable: true, configurable: true }),
    );
    this.toolName = toolName;
  }
}
ObjectDefineProperty(
  ToolCallError.prototype, 'name', descriptor({ value: 'ToolCallError', writable: true, configurable: true }),
);

/**
 * The `tools` namespace: one own, enumerable property per binding on an object without a
 * prototype, so lookups are own-property only (`constructor`, `__proto__` and `toString` are
 * ordinary binding names) and exotic names are reached as `tools["my-tool"]`. Reading a name
 * that is no binding throws a TypeError that lists the bindings and the closest name (as the
 * Python worker's AttributeError does), except the two the language itself probes any object
 * for (`then` by `await`, `toJSON` by `JSON.stringify`) and symbols: those are undefined.
 * @param {string[]} names
 * @param {(name: string, args: unknown) => Promise<{ok: boolean, value?: unknown, message?: string}>} call
 */
export function makeTools(names, call) {
  const known = new SafeSet(names);
  const proxied = new ProxyCtor(bindingsOf(names, call), {
    get(target, key, receiver) {
      if (typeof key === 'string' && !SetPrototypeHas(known, key) && !SetPrototypeHas(PROBES, key)) {
        throw new TypeError(missingBinding(key, names));
      }
      return ReflectGet(target, key, receiver);
    },
  });
  return proxied;
}

const PROBES = new SafeSet(['then', 'toJSON']);
// What a missing binding's message shows: the same rule and words as the Python worker's
// (worker/program.py), bounded however many bindings there are or however long the name.
const LISTED_BINDINGS = 20;
const SHOWN_NAME_CHARS = 100;
const COMPARED_NAME_CHARS = 200;

/**
 * `tools has no binding 'x' (did you mean 'y'?); bindings: a, b, y`
 * @param {string} name
 * @param {string[]} bindings
 */
export function missingBinding(name, bindings) {
  const names = ArrayPrototypeSort(ArrayPrototypeSlice(bindings));
  const shown = name.length <= SHOWN_NAME_CHARS ? name : StringPrototypeSlice(name, 0, SHOWN_NAME_CHARS) + '…';
  let text = `tools has no binding '${shown}'`;
  if (names.length === 0) return `${text}; this program has no bindings`;
  if (name.length <= COMPARED_NAME_CHARS) {
    const close = closest(name, names);
    if (close !== undefined) text += ` (did you mean '${close}'?)`;
  }
  text += `; bindings: ${ArrayPrototypeJoin(ArrayPrototypeSlice(names, 0, LISTED_BINDINGS), ', ')}`;
  if (names.length > LISTED_BINDINGS) text += ` and ${names.length - LISTED_BINDINGS} more`;
  return text;
}

/**
 * The first of `names` nearest to `name` (optimal string alignment distance: an adjacent swap
 * is one edit) within a third of the longer name's length, at least 1; undefined if none is.
 * @param {string} name
 * @param {string[]} names
 */
function closest(name, names) {
  let best;
  let bestDistance = Infinity;
  for (let i = 0; i < names.length; i++) {
    const candidate = names[i];
    const limit = MathMax(1, MathFloor(MathMax(name.length, candidate.length) / 3));
    if (MathAbs(name.length - candidate.length) > limit) continue;
    const distance = editDistance(name, candidate);
    if (distance <= limit && distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return best;
}

/**
 * @param {string} a
 * @param {string} b
 */
function editDistance(a, b) {
  // Three rows of the dynamic programme: the one before the previous is for adjacent swaps.
  /** @type {number[]} */
  let before = [];
  /** @type {number[]} */
  let previous = [];
  for (let j = 0; j <= b.length; j++) previous[j] = j;
  for (let i = 1; i <= a.length; i++) {
    /** @type {number[]} */
    const current = [i];
    const ai = StringPrototypeCharCodeAt(a, i - 1);
    for (let j = 1; j <= b.length; j++) {
      const bj = StringPrototypeCharCodeAt(b, j - 1);
      let d = MathMin(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ai === bj ? 0 : 1));
      if (i > 1 && j > 1 && ai === StringPrototypeCharCodeAt(b, j - 2) && StringPrototypeCharCodeAt(a, i - 2) === bj) {
        d = MathMin(d, before[j - 2] + 1);
      }
      current[j] = d;
    }
    before = previous;
    previous = current;
  }
  return previous[b.length];
}

/**
 * @param {string[]} names
 * @param {(name: string, args: unknown) => Promise<{ok: boolean, value?: unknown, message?: string}>} call
 */
function bindingsOf(names, call) {
  const tools = { __proto__: null };
  for (const name of names) {
    const binding = {
      async [name](/** @type {unknown} */ args) {
        if (args === undefined) throw new ToolCallError(NO_ARGUMENTS, name);
        // Awaited here and thrown from here, so a failure's stack reaches the program's line.
        const outcome = await call(name, args);
        if (outcome.ok) return outcome.value;
        throw new ToolCallError(/** @type {string} */ (outcome.message), name);
      },
    }[name];
    ObjectDefineProperty(tools, name, descriptor({ value: binding, enumerable: true }));
  }
  return ObjectFreeze(tools);
}


// -- output --------------------------------------------------------------------------------

/** Program output as log messages, pre-checked against the output ledger. */
class LogSink {
  /** @param {number} maxBytes */
  constructor(maxBytes) {
    this.ledger = new OutputLedger(maxBytes);
  }

  /** @param {string} text */
  emit(text) {
    if (hasFinished()) return;
    text = validText(text); // as the runtime will charge it (lone surrogates: U+FFFD)
    const room = this.ledger.remainingForEntry();
    if (jsonStringSize(text) <= room) {
      this.ledger.admitLog(text);
      send(`{"t":"log","text":${wire.spellString(text)}}`);
      return;
    }
    // Send only what can still fit, then let the runtime settle output-limit.
    const prefix = fitPrefix(text, room);
    if (prefix) send(`{"t":"log","text":${wire.spellString(prefix)}}`);
    finish('{"t":"output-limit"}');
  }
}


/**
 * The `console` parameter: five methods, each call one log entry formatted as util.format.
 * @param {LogSink} sink
 */
function makeConsole(sink) {
  /** @param {any[]} args */
  const log = (...args) => sink.emit(format(...args));
  const shim = {};
  for (const name of ['log', 'info', 'warn', 'error', 'debug']) {
    ObjectDefineProperty(shim, name, descriptor({
      value: { [name]: (/** @type {any[]} */ ...args) => log(...args) }[name],
      enumerable: true,
    }));
  }
  return ObjectFreeze(shim);
}

// -- the run -------------------------------------------------------------------------------

export class Worker {
  /**
   * @param {(frame: Buffer) => void} write where call frames go (the channel, coalesced per
   *   loop turn; a rehearsal's loopback)
   */
  constructor(write = queueFrame) {
    this.write = write;
    this.program = '';
    /** @type {string[]} */
    this.names = [];
    /** @type {LogSink | null} */
    this.sink = null;
    this.nextId = 1;
    /** @type {Map<number, {resolve: (outcome: any) => void, name: string}>} */
    this.pending = new SafeMap();
  }

  /**
   * One binding call: snapshot the arguments (refused before an id is taken), send it, and
   * settle with the runtime's reply.
   * @param {string} name
   * @param {unknown} args
   * @returns {Promise<{ok: boolean, value?: unknown, message?: string}>}
   */
  call(name, args) {
    if (hasFinished()) return new Promise(() => {});
    const callId = this.nextId;
    let buffer;
    try {
      const tokens = wire.encode(args);
      // Framed here, before the id is taken: framing refuses what the wire cannot carry. A
      // large value travels as its JSON text, raw (core.js rawFrame).
      const head = `{"t":"call","id":${callId},"name":${wire.spellString(name)}`;
      const body = wire.rawText(tokens);
      buffer = body === null ? frame(`${head},"args":${wire.spellTokens(tokens)}}`) : rawFrame(`${head}}`, body);
    } catch (error) {
      const detail = error instanceof Error ? error.message : StringCtor(error);
      throw new ToolCallError(`${LOSSY_ARGUMENTS}: ${detail}`, name);
    }
    this.nextId += 1;
    const promise = new Promise((resolve) => {
      MapPrototypeSet(this.pending, callId, { resolve, name });
    });
    this.write(buffer);
    return promise;
  }

  /** @param {any} message */
  onReply(message) {
    const callId = field(message, 'id');
    const entry = typeof callId === 'number' ? MapPrototypeGet(this.pending, callId) : undefined;
    if (entry === undefined) return;
    MapPrototypeDelete(this.pending, callId);
    if (field(message, 'ok') === true) {
      let value;
      try {
        value = wire.decode(field(message, 'value'));
      } catch {
        entry.resolve({ ok: false, message: LOSSY_RESOLUTION });
        return;
      }
      entry.resolve({ ok: true, value });
    } else {
      const text = field(message, 'message');
      entry.resolve({ ok: false, message: typeof text === 'string' ? text : 'failed' });
    }
  }

  /**
   * A later frame of the run (after its `start`): the runtime's replies to binding calls.
   * @param {any} message
   */
  onMessage(message) {
    if (field(message, 't') === 'reply') this.onReply(message);
  }

  /** @param {any} start */
  begin(start) {
    this.program = StringCtor(field(start, 'program'));
    const bindings = field(start, 'bindings');
    this.names = ArrayIsArray(bindings) ? bindings.map((name) => StringCtor(name)) : [];
    this.sink = new LogSink(Number(field(start, 'max_output_bytes')));
    // memory_bytes and cpu_seconds: the run's cgroup and the runtime's CPU poll enforce them
    // (V8's heap limit is set when node starts); a per-process RLIMIT_AS would break V8.
    this.execute().then(finish, (error) => finish(this.failure('exception', renderException(error))));
  }

  async execute() {
    const sink = /** @type {LogSink} */ (this.sink);
    let main;
    try {
      main = compileProgram(this.program);
    } catch (error) {
      if (error instanceof ProgramError) return this.failure('exception', error.message);
      throw error;
    }
    installOutput(sink);
    // The program sees an empty environment as a plain object (what it is: nothing is set).
    ObjectDefineProperty(process, 'env', descriptor({ value: {}, writable: true, configurable: true, enumerable: true }));
    const tools = makeTools(this.names, (name, args) => this.call(name, args));
    let result;
    try {
      result = await main(tools, ToolCallError, makeConsole(sink));
    } catch (error) {
      return this.failure('exception', renderException(error));
    }
    if (result === undefined) return '{"t":"done"}';
    let tokens;
    try {
      tokens = wire.encode(result);
    } catch (error) {
      if (error instanceof wire.IntegerTooLong) {
        return this.failure('invalid-output', `${LOSSY_COMPLETION}: ${error.message}`);
      }
      return this.failure('invalid-output', LOSSY_COMPLETION);
    }
    if (!sink.ledger.fitsTokens(tokens)) return this.failure('output-limit', '');
    try {
      const body = wire.rawText(tokens);
      return body === null ? frame(`{"t":"done","value":${wire.spellTokens(tokens)}}`) : rawFrame('{"t":"done"}', body);
    } catch {
      return this.failure('invalid-output', LOSSY_COMPLETION);
    }
  }

  /**
   * @param {string} kind
   * @param {string} message
   */
  failure(kind, message) {
    message = validText(message);
    const ledger = /** @type {LogSink} */ (this.sink).ledger;
    if (kind !== 'output-limit' && !ledger.fitsMessage(message)) {
      kind = 'output-limit';
      message = '';
    }
    return `{"t":"done","error":{"kind":${wire.spellString(kind)},"message":${wire.spellString(message)}}}`;
  }
}


/** Arguments the rehearsal sends: the shapes binding calls usually carry. */
const REHEARSAL_ARGS = [1, { query: 'warm-up', limit: 10 }, 'text', { ids: [1, 2, 3], deep: { ok: true } }];

/**
 * Run the binding-call path -- the `tools` wrapper, encoding and framing, the channel's frame
 * splitter, reply parsing and decoding, promise settlement -- `times` times against a loopback
 * that answers as the runtime does. A fresh worker's first calls otherwise run it cold, in
 * V8's interpreter: a hundred calls cost ~3x as much as warm ones. Repeated here, before
 * ready, V8 compiles those functions (with this warm-up's type feedback) and the program's
 * calls start on compiled code. The rehearsal's worker, ids and tools are its own; `route`
 * gives what reads its frames, as the entry point reads the channel's.
 * @param {number} times
 * @param {(worker: Worker) => {onFrame(payload: string | import('./core.js').RawPayload): void}} route
 */
async function rehearseCalls(times, route) {
  const frames = new FrameBuffer();
  const scratch = BufferAllocUnsafe(RECV_BYTES);
  /** @type {{onFrame(payload: string | import('./core.js').RawPayload): void}} */
  let reader;
  const worker = new Worker((buffer) => {
    const text = BufferToString(buffer, 'latin1', 4);
    const call = JSONParse(text);
    const value = text.slice(text.indexOf('"args":') + 7, -1);
    const reply = call.name === 'fail'
      ? `{"t":"reply","id":${call.id},"ok":false,"message":"refused"}`
      : `{"t":"reply","id":${call.id},"ok":true,"value":${value}}`;
    const length = BufferWrite(scratch, reply, 4, 'latin1');
    BufferWriteUInt32BE(scratch, length, 0);
    receive(frames, reader, scratch, 4 + length);
  });
  reader = route(worker);
  const tools = /** @type {Record<string, (args: unknown) => Promise<unknown>>} */ (
    makeTools(['echo', 'fail'], (name, args) => worker.call(name, args))
  );
  for (let index = 0; index < times; index++) {
    await tools.echo(REHEARSAL_ARGS[index % REHEARSAL_ARGS.length]);
  }
  for (let index = 0; index < 3; index++) {
    try {
      await tools.fail({});
    } catch {
      // expected: a failed call is a ToolCallError
    }
  }
}

/**
 * Pay first-use costs (the type stripper's WebAssembly, the compiler, the codecs, the
 * program's streams, the binding-call path) before ready.
 * @param {(worker: Worker) => {onFrame(payload: string | import('./core.js').RawPayload): void}} route see rehearseCalls
 */
export async function prewarm(route) {
  prepareOutput();
  const main = compileProgram('const x: number[] = [await tools.a({ n: 1 })];\nreturn { x };');
  const tools = makeTools(['a'], async (_name, args) => ({ ok: true, value: wire.snapshot(args) }));
  const result = await main(tools, ToolCallError, { log() {} });
  const tokens = wire.encode(result);
  wire.decode(parseMessage(`{"t":"x","v":${wire.spellTokens(tokens)}}`).v);
  wire.parseJson('[12345678901234567890,{"a":"\\u00e9"}]');
  new OutputLedger(64).fitsTokens(tokens);
  format('%s %o', 'warm', { up: [1] });
  renderException(new Error('warm-up'));
  try {
    compileProgram('enum E { A }');
  } catch {
    // expected
  }
  await rehearseCalls(REHEARSED_CALLS, route);
}
