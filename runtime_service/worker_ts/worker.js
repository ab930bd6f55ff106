// TypeScript worker: boot, report ready, hand the worker to what arrives, be killed.
//
// Started as `node worker.js [<ready report JSON>]` with an empty environment, fds 1/2 on
// pipes the runtime drains and the channel socket on fd 3. It speaks exactly the protocol of
// the Python worker (runtime_service/worker/bootstrap.py), so the runtime needs no code per
// language beyond choosing what to launch:
//
//   worker -> runtime  {"t":"ready","sandbox":{...}}         once booted and warmed up
//   runtime -> worker  {"t":"start",...}                     a program: program.js runs it
//                      | {"t":"host",...}                    a Cordis host half: plugin_harness.js
//
// Both stand on core.js (the channel, compilation, output, the last message); neither imports
// the other, and only this module knows both. Frames are a 4-byte big-endian length and compact
// ASCII JSON.

import net from 'node:net';

import * as wire from './flatwire.js';
import { ArrayIsArray, StringCtor, JSONParse } from './intrinsics.js';
import {
  FrameBuffer,
  drainInbox,
  field,
  finish,
  parseFrame,
  readChannelWith,
  receive,
  renderException,
  send,
} from './core.js';
import { Worker, prewarm } from './program.js';

const CHANNEL_FD = 3;
const RECV_BYTES = 1 << 16; // one channel read at most

// Captured before any program code runs (see intrinsics.js).
const reallyExit = /** @type {any} */ (process).reallyExit.bind(process);
const BufferAllocUnsafe = Buffer.allocUnsafe;

/** Reads the channel's frames: the first decides what the worker becomes, the rest follow it. */
class Entry {
  /** @param {Worker} worker the program runner, built before ready */
  constructor(worker) {
    this.worker = worker;
    this.started = false;
    /** @type {{onMessage(message: any): void, uncaught(error: unknown): void} | null} */
    this.host = null;
    /** @type {any[] | null} frames for a plugin host whose harness is still loading */
    this.hostFrames = null;
  }

  /** @param {string | import('./core.js').RawPayload} payload */
  onFrame(payload) {
    let message;
    try {
      message = parseFrame(payload);
    } catch {
      if (!this.started) reallyExit(0);
      return;
    }
    if (!this.started) {
      const kind = field(message, 't');
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
      this.worker.begin(message);
      return;
    }
    if (this.host !== null) this.host.onMessage(message);
    else if (this.hostFrames !== null) this.hostFrames.push(message);
    else this.worker.onMessage(message);
  }
}

/**
 * The rehearsal's frames read as a running program's are (program.js, rehearseCalls).
 * @param {Worker} worker
 */
function rehearsalRoute(worker) {
  const entry = new Entry(worker);
  entry.started = true;
  return entry;
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
  const entry = new Entry(worker);
  // An unawaited failed call is the program's business (as an unawaited asyncio task's).
  process.on('unhandledRejection', () => {});
  // An error thrown where nothing awaits it (a timer callback) ends the run as an exception.
  process.on('uncaughtException', (error) => {
    if (entry.host !== null) return entry.host.uncaught(error); // a plugin host goes on
    if (worker.sink === null) reallyExit(70);
    finish(worker.failure('exception', renderException(error)));
  });
  await prewarm(rehearsalRoute);
  const frames = new FrameBuffer();
  // `onread`: each read lands in one reused buffer and goes straight to the frame splitter,
  // not through the stream's queue and 'data' event (Readable.push, addChunk, emit: Node's
  // JavaScript run on every reply, cold in a fresh worker).
  const readBuffer = BufferAllocUnsafe(RECV_BYTES);
  readChannelWith((data) => receive(frames, entry, data, data.length));
  const options = {
    fd: CHANNEL_FD,
    readable: true,
    writable: false,
    allowHalfOpen: true,
    onread: {
      buffer: readBuffer,
      callback: (/** @type {number} */ nread) => {
        drainInbox(); // bytes a blocked write took in came first
        receive(frames, entry, readBuffer, nread);
      },
    },
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
