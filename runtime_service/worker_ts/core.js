// What the TypeScript worker's program runner (program.js) and its plugin harness
// (plugin_harness.js) share: the channel to the runtime, the compilation of a body into an
// async function (types stripped), the rendering of what it threw, the output streams and the
// last message. The entry point (worker.js) hands a fresh worker to one of the two; both stand
// on this module and neither imports the other.
//
// Frames are a 4-byte big-endian length and compact ASCII JSON (the Python worker's
// runtime_service/worker/framing.py), or raw frames: a NUL byte, the 4-byte length of the
// message's JSON, that JSON, then the JSON text of its value unescaped (framing.py says how
// one is read: as the plain frame whose value field is that text's lone json token).

import fs from 'node:fs';
import { Writable } from 'node:stream';
import util from 'node:util';
import vm from 'node:vm';

import amaro from 'amaro';

import * as wire from './flatwire.js';
import {
  ObjectDefineProperty,
  ObjectGetOwnPropertyDescriptor,
  RegExpPrototypeExec,
  StringCtor,
  StringPrototypeSplit,
  SymbolPrototypeToString,
  ArrayPrototypeJoin,
  JSONParse,
  bareArray,
  descriptor,
  uncurry,
} from './intrinsics.js';

const CHANNEL_FD = 3;
export const PROGRAM_FILENAME = 'program.ts';
const MAX_FRAME_BYTES = 3 * (96 << 20); // framing.MAX_FRAME_BYTES
// The program is the body of this function. The head is one line of its own and the script
// starts one line early (`lineOffset: -1`), so stack traces name the program's own lines.
const WRAPPER_HEAD = '(async function (tools, ToolCallError, console) {"use strict";\n';
const WRAPPER_TAIL = '\n})';

// Captured before any program code runs (see intrinsics.js).
const writeSync = fs.writeSync;
const readSync = fs.readSync;
const closeSync = fs.closeSync;
const isNativeError = util.types.isNativeError;
const reallyExit = /** @type {any} */ (process).reallyExit.bind(process);
const nextTick = process.nextTick;
const BufferAllocUnsafe = Buffer.allocUnsafe;
const BufferByteLength = Buffer.byteLength;
const BufferFrom = Buffer.from;
const BufferConcat = Buffer.concat;
const BufferWrite = uncurry(Buffer.prototype.write);
const BufferToString = uncurry(Buffer.prototype.toString);
const BufferWriteUInt32BE = uncurry(Buffer.prototype.writeUInt32BE);
const BufferReadUInt32BE = uncurry(Buffer.prototype.readUInt32BE);
const BufferSubarray = uncurry(Buffer.prototype.subarray);
const AtomicsWait = Atomics.wait;
const setImmediateFn = setImmediate;
const sleepCell = new Int32Array(new SharedArrayBuffer(4));
const LONG_NUMBER = /[0-9]{16}/;

// -- the channel ---------------------------------------------------------------------------

/**
 * Blocking write of a whole buffer to the channel (fd 3 may be non-blocking: libuv reads it),
 * behind the frames queued in this loop turn (one write for all of them).
 */
export function writeAll(buffer) {
  if (queued.length !== 0) {
    queued[queued.length] = buffer;
    buffer = BufferConcat(queued);
    queued.length = 0;
  }
  writeChannel(buffer);
}

/**
 * The runtime stops reading a worker that leaves too many of its replies unread
 * (runtime_service/worker_process.py), so while a write cannot go on, what the runtime sent is
 * taken in (`inbox`, in this worker's memory) and handed to the reader before anything read
 * later: neither side ever waits for the other.
 * @param {Buffer} buffer
 */
function writeChannel(buffer) {
  let offset = 0;
  let took = false;
  while (offset < buffer.length) {
    try {
      offset += writeSync(CHANNEL_FD, buffer, offset, buffer.length - offset);
    } catch (error) {
      if (/** @type {any} */ (error).code !== 'EAGAIN') throw error;
      if (inboxReader !== null && takeIn()) took = true;
      else AtomicsWait(sleepCell, 0, 0, 1);
    }
  }
  if (took) setImmediateFn(drainInbox);
}

/** @type {Buffer[]} */
const inbox = bareArray();
/** @type {((data: Buffer) => void) | null} */
let inboxReader = null;
const INBOX_READ_BYTES = 1 << 16;

/** One read of what the runtime sent, into the inbox; false if there was nothing. */
function takeIn() {
  const scratch = BufferAllocUnsafe(INBOX_READ_BYTES);
  let nread;
  try {
    nread = readSync(CHANNEL_FD, scratch, 0, scratch.length, null);
  } catch (error) {
    if (/** @type {any} */ (error).code === 'EAGAIN') return false;
    throw error;
  }
  if (nread === 0) reallyExit(0); // the runtime closed the channel: the run is over
  inbox[inbox.length] = BufferSubarray(scratch, 0, nread);
  return true;
}

/**
 * Where the channel's bytes go (the entry point's frame splitter): what a write took in is
 * handed over before any later read (`drainInbox` first thing in each read callback).
 * @param {(data: Buffer) => void} reader
 */
export function readChannelWith(reader) {
  inboxReader = reader;
}

/** Hand what writes took in to the reader, in order. */
export function drainInbox() {
  if (inboxReader === null) return;
  // What the reader's own writes take in meanwhile is appended, and handed over in turn.
  for (let index = 0; index < inbox.length; index++) inboxReader(inbox[index]);
  inbox.length = 0;
}

// Binding calls of one loop turn in as few writes as possible, none delayed (the Python
// worker's framing.TurnBatch): the turn's first frame is written at once -- a call made just
// before a long synchronous computation is out while it runs -- and the frames after it in
// the same turn are held and written together when the turn ends (`setImmediate`: after this
// turn's I/O callbacks and microtasks), or ahead of a frame that leaves at once (`writeAll`),
// so frames keep the order they were made in.
const queued = bareArray();
let turnOpen = false;

/**
 * Send a frame with the other frames of this loop turn: the calls a `Promise.all` starts, or
 * those made as one read's replies settle, cost two writes however many they are.
 * @param {Buffer} buffer
 */
export function queueFrame(buffer) {
  if (turnOpen) {
    queued[queued.length] = buffer;
    return;
  }
  turnOpen = true;
  setImmediateFn(endTurn);
  writeChannel(buffer);
}

function endTurn() {
  turnOpen = false;
  if (queued.length === 0) return;
  const buffer = queued.length === 1 ? queued[0] : BufferConcat(queued);
  queued.length = 0;
  writeChannel(buffer);
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

/**
 * A raw frame: the compact JSON text of a message without its value field (ASCII), and the
 * value's JSON text, written in UTF-8 (it holds no lone surrogate: flatwire.js rawText
 * escapes them).
 * @param {string} message
 * @param {string} body
 */
export function rawFrame(message, body) {
  const length = RAW_HEAD + message.length + BufferByteLength(body, 'utf8');
  if (length > MAX_FRAME_BYTES) throw new RangeError('frame too large');
  const buffer = BufferAllocUnsafe(4 + length);
  BufferWriteUInt32BE(buffer, length, 0);
  buffer[4] = RAW;
  BufferWriteUInt32BE(buffer, message.length, 5);
  BufferWrite(buffer, message, 4 + RAW_HEAD, 'latin1');
  BufferWrite(buffer, body, 4 + RAW_HEAD + message.length, 'utf8');
  return buffer;
}

/** @param {string} text */
export function send(text) {
  writeAll(frame(text));
}

// A raw frame's first byte, the bytes before its message, and the field its body stands for
// (framing.RAW, framing.RAW_FIELDS).
const RAW = 0;
const RAW_HEAD = 5;
const RAW_FIELDS = { __proto__: null, call: 'args', done: 'value', reply: 'value' };

/** @typedef {{message: string, body: string}} RawPayload a raw frame's message and body */

/**
 * A frame's payload: its text, or a raw frame's message and body (a raw frame whose header
 * length overruns it is read as text, which is no JSON: it is dropped).
 * @param {Buffer} buffer
 * @param {number} start
 * @param {number} length
 * @returns {string | RawPayload}
 */
function payloadOf(buffer, start, length) {
  if (length >= RAW_HEAD && buffer[start] === RAW) {
    const head = BufferReadUInt32BE(buffer, start + 1);
    if (head <= length - RAW_HEAD) {
      const bodyAt = start + RAW_HEAD + head;
      return {
        message: BufferToString(buffer, 'utf8', start + RAW_HEAD, bodyAt),
        body: BufferToString(buffer, 'utf8', bodyAt, start + length),
      };
    }
  }
  return BufferToString(buffer, 'utf8', start, start + length);
}

/**
 * The message a payload holds: a raw frame's as the plain frame it stands for.
 * @param {string | RawPayload} payload
 * @returns {any}
 */
export function parseFrame(payload) {
  if (typeof payload === 'string') return parseMessage(payload);
  const message = parseMessage(payload.message);
  const kind = field(message, 't');
  const key = typeof kind === 'string' ? RAW_FIELDS[kind] : undefined;
  if (key === undefined || ObjectGetOwnPropertyDescriptor(message, key) !== undefined) {
    throw new SyntaxError('not a raw frame message');
  }
  const token = { kind: 'json', text: payload.body };
  ObjectDefineProperty(message, key, descriptor({ value: [token], writable: true, enumerable: true, configurable: true }));
  return message;
}

/** Splits the channel into frame payloads; frames over the cap are skipped unread. */
export class FrameBuffer {
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
        frames.push(payloadOf(data, at + 4, length));
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
      frames.push(payloadOf(all, 4, length));
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
 * Bytes read from the channel: every whole frame to `reader`, in order.
 * @param {FrameBuffer} frames
 * @param {{onFrame(payload: string | RawPayload): void}} reader
 * @param {Buffer} buffer
 * @param {number} nread
 */
export function receive(frames, reader, buffer, nread) {
  const payloads = frames.feed(BufferSubarray(buffer, 0, nread));
  for (let index = 0; index < payloads.length; index++) reader.onFrame(payloads[index]);
}

/**
 * A message from the runtime. JSON.parse is exact unless an integer has 16 digits or more
 * (it would round it): only then the strict parser, which reads those as BigInt.
 * @param {string} text
 * @returns {any}
 */
export function parseMessage(text) {
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


// -- compiling and rendering ---------------------------------------------------------------

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
 * `head` (one line, ending in a newline) opens the function: the plugin harness's head names
 * other parameters.
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

/** Builds the program's two streams (before ready: the program does not pay for them). */
export function prepareOutput() {
  output.streams = [logStream(output), logStream(output)];
  for (const stream of output.streams) stream.write('warm-up', () => {});
}

// -- the end -------------------------------------------------------------------------------

let finished = false;

/** Whether the last message went out: nothing the runner or the host half does is sent after it. */
export function hasFinished() {
  return finished;
}

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

