// TypeScript worker: boot, wait for one program, run it, report, be killed.
//
// Started as `node worker.js [<ready report JSON>]` with an empty environment, fds 1/2 on
// pipes the runtime drains and the channel socket on fd 3. It speaks exactly the protocol of
// the Python worker (runtime_service/worker/bootstrap.py), so the runtime needs no code per
// language beyond choosing what to launch:
//
//   worker -> runtime  {"t":"ready","sandbox":{...}}         once booted and warmed up
//   runtime -> worker  {"t":"start","program","bindings","max_output_bytes",...}
//   worker -> runtime  {"t":"log","text"}                    each console call / stream write
//                      {"t":"call","id","name","args"}       ids 1, 2, 3, ...; args flat wire
//   runtime -> worker  {"t":"reply","id","ok":true,"value"} | {"t":"reply","id","ok":false,"message"}
//   worker -> runtime  {"t":"done"} | {"t":"done","value"} | {"t":"done","error":{"kind","message"}}
//                      | {"t":"output-limit"}                the last message; then it waits
//
// Frames are a 4-byte big-endian length and compact ASCII JSON. Everything the worker sends
// is pre-checked against the output ledger; the runtime trusts none of it anyway.

import fs from 'node:fs';
import net from 'node:net';
import { Writable } from 'node:stream';
import util from 'node:util';
import vm from 'node:vm';

import amaro from 'amaro';

import * as wire from './flatwire.js';
import {
  ArrayIsArray,
  ObjectDefineProperty,
  ObjectFreeze,
  ObjectGetOwnPropertyDescriptor,
  RegExpPrototypeExec,
  SafeMap,
  MapPrototypeGet,
  MapPrototypeSet,
  MapPrototypeDelete,
  StringCtor,
  StringPrototypeSplit,
  SymbolPrototypeToString,
  ArrayPrototypeJoin,
  JSONParse,
  bareArray,
  descriptor,
  uncurry,
} from './intrinsics.js';
import { OutputLedger, fitPrefix, jsonStringSize, validText } from './ledger.js';

const CHANNEL_FD = 3;
const RECV_BYTES = 1 << 16; // one channel read at most
const REHEARSED_CALLS = 200; // see rehearseCalls
export const PROGRAM_FILENAME = 'program.ts';
// The same texts as the Python worker's (framing.py, bootstrap.py) and the registry's bridge.
export const LOSSY_ARGUMENTS = 'tool arguments must be lossless JSON';
export const LOSSY_COMPLETION = 'program completion must be lossless JSON';
export const LOSSY_RESOLUTION = 'binding resolution must be lossless JSON';
export const NO_ARGUMENTS = `${LOSSY_ARGUMENTS} (call the tool with an arguments object, e.g. \`{}\`)`;
const MAX_FRAME_BYTES = 3 * (96 << 20); // framing.MAX_FRAME_BYTES
// The program is the body of this function. The head is one line of its own and the script
// starts one line early (`lineOffset: -1`), so stack traces name the program's own lines.
const WRAPPER_HEAD = '(async function (tools, ToolCallError, console) {"use strict";\n';
const WRAPPER_TAIL = '\n})';

// Captured before any program code runs (see intrinsics.js).
const writeSync = fs.writeSync;
const readSync = fs.readSync;
const closeSync = fs.closeSync;
const format = util.format;
const isNativeError = util.types.isNativeError;
const reallyExit = /** @type {any} */ (process).reallyExit.bind(process);
const nextTick = process.nextTick;
const BufferAllocUnsafe = Buffer.allocUnsafe;
const BufferFrom = Buffer.from;
const BufferConcat = Buffer.concat;
const BufferWrite = uncurry(Buffer.prototype.write);
const BufferToString = uncurry(Buffer.prototype.toString);
const BufferWriteUInt32BE = uncurry(Buffer.prototype.writeUInt32BE);
const BufferReadUInt32BE = uncurry(Buffer.prototype.readUInt32BE);
const BufferSubarray = uncurry(Buffer.prototype.subarray);
const AtomicsWait = Atomics.wait;
const sleepCell = new Int32Array(new SharedArrayBuffer(4));
const LONG_NUMBER = /[0-9]{16}/;

// -- the channel ---------------------------------------------------------------------------

/** Blocking write of a whole buffer to the channel (fd 3 may be non-blocking: libuv reads it). */
function writeAll(buffer) {
  let offset = 0;
  while (offset < buffer.length) {
    try {
      offset += writeSync(CHANNEL_FD, buffer, offset, buffer.length - offset);
    } catch (error) {
      if (/** @type {any} */ (error).code !== 'EAGAIN') throw error;
      AtomicsWait(sleepCell, 0, 0, 1);
    }
  }
}

/**
 * A frame for the compact JSON text of one message (ASCII by construction).
 * @param {string} text
 */
export function frame(text) {
  if (text.length > MAX_FRAME_BYTES) throw new RangeError('frame too large');
  const buffer = BufferAllocUnsafe(4 + text.length);
  BufferWriteUInt32BE(buffer, text.length, 0);
  BufferWrite(buffer, text, 4, 'latin1');
  return buffer;
}

/** @param {string} text */
export function send(text) {
  writeAll(frame(text));
}

/** Splits the channel into frame payloads; frames over the cap are skipped unread. */
class FrameBuffer {
  constructor() {
    /** @type {Buffer[]} */
    this.chunks = [];
    this.size = 0;
    this.skip = 0;
  }

  /**
   * @param {Buffer} data the bytes just read, valid during this call only (the channel reads
   *   into one reused buffer): whole frames are decoded straight from it, the rest is copied.
   */
  feed(data) {
    const frames = [];
    if (this.skip) {
      const dropped = Math.min(this.skip, data.length);
      this.skip -= dropped;
      data = BufferSubarray(data, dropped);
    }
    if (this.size === 0) {
      // Nothing held back: the usual case, one reply per read.
      let at = 0;
      while (data.length - at >= 4) {
        const length = BufferReadUInt32BE(data, at);
        if (length > MAX_FRAME_BYTES || data.length - at - 4 < length) break;
        frames.push(BufferToString(data, 'utf8', at + 4, at + 4 + length));
        at += 4 + length;
      }
      if (at === data.length) return frames;
      data = BufferSubarray(data, at);
    }
    if (data.length) {
      this.chunks.push(BufferFrom(data));
      this.size += data.length;
    }
    while (this.size >= 4) {
      let head = this.chunks[0];
      if (head.length < 4) head = this.join();
      const length = BufferReadUInt32BE(head, 0);
      if (length > MAX_FRAME_BYTES) {
        const all = this.join();
        const available = all.length - 4;
        this.skip = Math.max(length - available, 0);
        const rest = BufferSubarray(all, Math.min(4 + length, all.length));
        this.chunks = rest.length ? [rest] : [];
        this.size = rest.length;
        continue;
      }
      if (this.size < 4 + length) break;
      const all = this.join();
      frames.push(BufferToString(all, 'utf8', 4, 4 + length));
      const rest = BufferSubarray(all, 4 + length);
      this.chunks = rest.length ? [rest] : [];
      this.size = rest.length;
    }
    return frames;
  }

  join() {
    const all = this.chunks.length === 1 ? this.chunks[0] : BufferConcat(this.chunks, this.size);
    this.chunks = [all];
    return all;
  }
}

/**
 * A message from the runtime. JSON.parse is exact unless an integer has 16 digits or more
 * (it would round it): only then the strict parser, which reads those as BigInt.
 * @param {string} text
 * @returns {any}
 */
function parseMessage(text) {
  return RegExpPrototypeExec(LONG_NUMBER, text) === null ? JSONParse(text) : wire.parseJson(text);
}

/**
 * @param {any} message
 * @param {string} key
 */
export function field(message, key) {
  if (typeof message !== 'object' || message === null) return undefined;
  const desc = ObjectGetOwnPropertyDescriptor(message, key);
  return desc === undefined ? undefined : desc.value;
}

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
 * ordinary binding names) and exotic names are reached as `tools["my-tool"]`.
 * @param {string[]} names
 * @param {(name: string, args: unknown) => Promise<{ok: boolean, value?: unknown, message?: string}>} call
 */
export function makeTools(names, call) {
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

/**
 * Stack text showing only the program's own frames; other thrown values as `String()`.
 * @param {unknown} error
 */
export function renderException(error) {
  try {
    if (isNativeError(error) || error instanceof Error) {
      const stack = /** @type {any} */ (error).stack;
      if (typeof stack === 'string' && stack !== '') return programFrames(stack);
      return StringCtor(/** @type {any} */ (error).message);
    }
    return typeof error === 'symbol' ? SymbolPrototypeToString(error) : StringCtor(error);
  } catch {
    return 'program threw an unrenderable value';
  }
}

const FRAME_LINE = /^\s+at /;

/** @param {string} stack */
function programFrames(stack) {
  const lines = StringPrototypeSplit(stack, '\n');
  const kept = bareArray();
  for (const line of lines) {
    if (RegExpPrototypeExec(FRAME_LINE, line) === null || line.includes(`${PROGRAM_FILENAME}:`)) {
      kept[kept.length] = line;
    }
  }
  return ArrayPrototypeJoin(kept, '\n');
}

/**
 * The program as a script, types stripped. Strip-only replaces each erasable annotation with
 * blanks, so every line and column stays where it was in the program.
 * @param {string} program
 */
export function stripTypes(program, head = WRAPPER_HEAD) {
  return amaro.transformSync(head + program + WRAPPER_TAIL, { mode: 'strip-only' }).code;
}

/**
 * @param {string} message
 * @param {number} line
 * @param {number} column 1-based
 */
function syntaxText(message, line, column) {
  return `SyntaxError: ${message}\n    at ${PROGRAM_FILENAME}:${line}:${column}`;
}

/**
 * Where the type stripper stopped, in the program's own lines and columns.
 * @param {unknown} error
 * @param {string} program
 */
export function renderStripError(error, program) {
  const raw = /** @type {any} */ (error);
  if (raw !== null && typeof raw === 'object' && typeof raw.message === 'string' && typeof raw.startLine === 'number') {
    const lines = program.split('\n').length;
    const line = Math.max(1, Math.min(raw.startLine - 1, lines));
    const column = raw.startLine - 1 > lines ? program.split('\n')[lines - 1].length + 1 : raw.startColumn + 1;
    return syntaxText(raw.message, line, column);
  }
  return `SyntaxError: ${renderException(error)}`;
}

/**
 * A SyntaxError of V8's compiler, named by line and column ("program.ts:3", the source line,
 * carets under the place: V8's own decoration of a compile error).
 * @param {unknown} error
 */
function renderCompileError(error) {
  const raw = /** @type {any} */ (error);
  const stack = typeof raw?.stack === 'string' ? raw.stack : '';
  const head = /^program\.ts:(\d+)\n[^\n]*\n( *)\^/.exec(stack);
  if (head !== null) return syntaxText(raw.message, Number(head[1]), head[2].length + 1);
  return renderException(error);
}

/**
 * The program compiled into its async function (throws a rendered text on failure).
 * `head` (one line, ending in a newline) opens the function: a plugin host's names other
 * parameters (plugin_harness.js).
 * @param {string} program
 * @param {string} [head]
 * @returns {Function}
 */
export function compileProgram(program, head = WRAPPER_HEAD) {
  let source;
  try {
    source = stripTypes(program, head);
  } catch (error) {
    throw new ProgramError(renderStripError(error, program));
  }
  try {
    return new vm.Script(source, { filename: PROGRAM_FILENAME, lineOffset: -1 }).runInThisContext();
  } catch (error) {
    throw new ProgramError(renderCompileError(error));
  }
}

export class ProgramError extends Error {}

// -- output --------------------------------------------------------------------------------

/** Program output as log messages, pre-checked against the output ledger. */
class LogSink {
  /** @param {number} maxBytes */
  constructor(maxBytes) {
    this.ledger = new OutputLedger(maxBytes);
  }

  /** @param {string} text */
  emit(text) {
    if (finished) return;
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
 * `process.stdout` / `process.stderr` for the program: each write is one log entry, sent to
 * `output.sink` (built before ready, so the program does not pay for making streams).
 * @param {{sink: {emit(text: string): void}}} output
 */
function logStream(output) {
  const stream = new Writable({ decodeStrings: false });
  /** @param {any} chunk @param {any} [encoding] @param {any} [callback] */
  const write = (chunk, encoding, callback) => {
    if (typeof encoding === 'function') {
      callback = encoding;
      encoding = undefined;
    }
    let text;
    if (typeof chunk === 'string') {
      text = encoding === undefined || encoding === 'utf8' || encoding === 'utf-8'
        ? chunk
        : BufferToString(BufferFrom(chunk, encoding), 'utf8');
    } else if (chunk instanceof Uint8Array) {
      text = BufferToString(BufferFrom(chunk.buffer, chunk.byteOffset, chunk.byteLength), 'utf8');
    } else {
      throw new TypeError('The "chunk" argument must be of type string or an instance of Buffer or Uint8Array');
    }
    if (text) output.sink.emit(text);
    if (typeof callback === 'function') nextTick(callback, null);
    return true;
  };
  ObjectDefineProperty(stream, 'write', descriptor({ value: write, writable: true, configurable: true }));
  ObjectDefineProperty(stream, 'isTTY', descriptor({ value: false, writable: true, configurable: true }));
  return stream;
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

let finished = false;

/**
 * Send the last message, then wait to be killed. The output pipes are closed first: the
 * runtime drains them to their end before it reports the outcome. The worker does not exit by
 * itself (the runtime kills it as soon as the outcome is settled, or closes the channel,
 * which ends the wait too); no program code runs again.
 * @param {string | Buffer} message
 * @returns {never}
 */
export function finish(message) {
  if (!finished) {
    finished = true;
    for (const fd of [1, 2]) {
      try {
        closeSync(fd);
      } catch {
        // already closed by the program
      }
    }
    try {
      if (typeof message === 'string') send(message);
      else writeAll(message);
    } catch {
      reallyExit(0);
    }
  }
  const scratch = BufferAllocUnsafe(1 << 16);
  for (;;) {
    try {
      if (readSync(CHANNEL_FD, scratch, 0, scratch.length, null) === 0) reallyExit(0);
    } catch (error) {
      if (/** @type {any} */ (error).code !== 'EAGAIN') reallyExit(0);
      AtomicsWait(sleepCell, 0, 0, 20);
    }
  }
}

class Worker {
  /** @param {(frame: Buffer) => void} write where call frames go (the channel; a rehearsal's loopback) */
  constructor(write = writeAll) {
    this.write = write;
    this.program = '';
    /** @type {string[]} */
    this.names = [];
    /** @type {LogSink | null} */
    this.sink = null;
    this.nextId = 1;
    /** @type {Map<number, {resolve: (outcome: any) => void, name: string}>} */
    this.pending = new SafeMap();
    this.started = false;
    /** @type {{onMessage(message: any): void, uncaught(error: unknown): void} | null} */
    this.host = null;
    /** @type {any[] | null} frames for a plugin host whose harness is still loading */
    this.hostFrames = null;
  }

  /**
   * One binding call: snapshot the arguments (refused before an id is taken), send it, and
   * settle with the runtime's reply.
   * @param {string} name
   * @param {unknown} args
   * @returns {Promise<{ok: boolean, value?: unknown, message?: string}>}
   */
  call(name, args) {
    if (finished) return new Promise(() => {});
    const callId = this.nextId;
    let buffer;
    try {
      const tokens = wire.encode(args);
      // Framed here, before the id is taken: framing refuses what the wire cannot carry.
      buffer = frame(`{"t":"call","id":${callId},"name":${wire.spellString(name)},"args":${wire.spellTokens(tokens)}}`);
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

  /** @param {string} payload */
  onFrame(payload) {
    let message;
    try {
      message = parseMessage(payload);
    } catch {
      if (!this.started) reallyExit(0);
      return;
    }
    const kind = field(message, 't');
    if (!this.started) {
      if (kind === 'host') {
        // A Cordis plugin host instead of a program: the harness serves every later frame.
        // Loaded only now, so a program's worker never pays for it; frames that arrive
        // meanwhile wait for it.
        this.started = true;
        this.hostFrames = [];
        import('./plugin_harness.js').then(
          (harness) => {
            this.host = harness.serveHost(message);
            for (const early of /** @type {any[]} */ (this.hostFrames)) this.host.onMessage(early);
            this.hostFrames = null;
          },
          () => reallyExit(70),
        );
        return;
      }
      if (kind === 'check') {
        // A parse of a source instead of a program (source_check.js): nothing of it runs.
        this.started = true;
        import('./source_check.js').then(
          (check) => check.serveCheck(message, finish),
          () => reallyExit(70),
        );
        return;
      }
      if (kind !== 'start') reallyExit(0);
      this.started = true;
      this.begin(message);
      return;
    }
    if (this.host !== null) this.host.onMessage(message);
    else if (this.hostFrames !== null) this.hostFrames.push(message);
    else if (kind === 'reply') this.onReply(message);
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
      return frame(`{"t":"done","value":${wire.spellTokens(tokens)}}`);
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

/**
 * Route everything the program can print into the log sink: `process.stdout`,
 * `process.stderr` (and so the global console, which writes to them).
 * @param {{emit(text: string): void}} sink
 */
export function installOutput(sink) {
  output.sink = sink;
  const [out, err] = output.streams;
  ObjectDefineProperty(process, 'stdout', descriptor({ get: () => out, configurable: true, enumerable: true }));
  ObjectDefineProperty(process, 'stderr', descriptor({ get: () => err, configurable: true, enumerable: true }));
}

/** Where the program's streams write (a LogSink once the run begins). */
const output = {
  /** @type {{emit(text: string): void}} */
  sink: { emit() {} },
  /** @type {Writable[]} */
  streams: [],
};

/**
 * Bytes read from the channel: every whole frame to the worker, in order.
 * @param {FrameBuffer} frames
 * @param {Worker} worker
 * @param {Buffer} buffer
 * @param {number} nread
 */
function receive(frames, worker, buffer, nread) {
  const payloads = frames.feed(BufferSubarray(buffer, 0, nread));
  for (let index = 0; index < payloads.length; index++) worker.onFrame(payloads[index]);
}

/** Arguments the rehearsal sends: the shapes binding calls usually carry. */
const REHEARSAL_ARGS = [1, { query: 'warm-up', limit: 10 }, 'text', { ids: [1, 2, 3], deep: { ok: true } }];

/**
 * Run the binding-call path -- the `tools` wrapper, encoding and framing, the channel's frame
 * splitter, reply parsing and decoding, promise settlement -- `times` times against a loopback
 * that answers as the runtime does. A fresh worker's first calls otherwise run it cold, in
 * V8's interpreter: a hundred calls cost ~3x as much as warm ones. Repeated here, before
 * ready, V8 compiles those functions (with this warm-up's type feedback) and the program's
 * calls start on compiled code. The rehearsal's worker, ids and tools are its own.
 * @param {number} times
 */
async function rehearseCalls(times) {
  const frames = new FrameBuffer();
  const scratch = BufferAllocUnsafe(RECV_BYTES);
  const worker = new Worker((buffer) => {
    const text = BufferToString(buffer, 'latin1', 4);
    const call = JSONParse(text);
    const value = text.slice(text.indexOf('"args":') + 7, -1);
    const reply = call.name === 'fail'
      ? `{"t":"reply","id":${call.id},"ok":false,"message":"refused"}`
      : `{"t":"reply","id":${call.id},"ok":true,"value":${value}}`;
    const length = BufferWrite(scratch, reply, 4, 'latin1');
    BufferWriteUInt32BE(scratch, length, 0);
    receive(frames, worker, scratch, 4 + length);
  });
  worker.started = true;
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

/** Pay first-use costs (the type stripper's WebAssembly, the compiler, the codecs, the
 * program's streams) before ready. */
async function prewarm() {
  output.streams = [logStream(output), logStream(output)];
  for (const stream of output.streams) stream.write('warm-up', () => {});
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
  await rehearseCalls(REHEARSED_CALLS);
}

async function main() {
  let report = {};
  try {
    const raw = process.argv.length > 2 ? JSONParse(process.argv[2]) : {};
    if (typeof raw === 'object' && raw !== null && !ArrayIsArray(raw)) report = raw;
  } catch {
    report = {};
  }
  for (const key of Object.keys(process.env)) delete process.env[key];
  const worker = new Worker();
  // An unawaited failed call is the program's business (as an unawaited asyncio task's).
  process.on('unhandledRejection', () => {});
  // An error thrown where nothing awaits it (a timer callback) ends the run as an exception.
  process.on('uncaughtException', (error) => {
    if (worker.host !== null) return worker.host.uncaught(error); // a plugin host goes on
    if (worker.sink === null) reallyExit(70);
    finish(worker.failure('exception', renderException(error)));
  });
  await prewarm();
  const frames = new FrameBuffer();
  // `onread`: each read lands in one reused buffer and goes straight to the frame splitter,
  // not through the stream's queue and 'data' event (Readable.push, addChunk, emit: Node's
  // JavaScript run on every reply, cold in a fresh worker).
  const readBuffer = BufferAllocUnsafe(RECV_BYTES);
  const options = {
    fd: CHANNEL_FD,
    readable: true,
    writable: false,
    allowHalfOpen: true,
    onread: { buffer: readBuffer, callback: (/** @type {number} */ nread) => receive(frames, worker, readBuffer, nread) },
  };
  // (Node's typings list `onread` for connect() only; the constructor takes it as well.)
  const channel = new net.Socket(/** @type {net.SocketConstructorOpts} */ (options));
  channel.on('end', () => reallyExit(0)); // the runtime closed the channel: the run is over
  channel.on('error', () => reallyExit(0));
  const usage = process.cpuUsage();
  const sandbox = { ...report, 'cpu-s': StringCtor((usage.user + usage.system) / 1e6) };
  send(`{"t":"ready","sandbox":${sandboxJson(sandbox)}}`);
}

/** @param {Record<string, unknown>} report */
function sandboxJson(report) {
  const parts = [];
  for (const [key, value] of Object.entries(report)) {
    parts.push(`${wire.spellString(key)}:${wire.spellString(StringCtor(value))}`);
  }
  return `{${parts.join(',')}}`;
}

main();
