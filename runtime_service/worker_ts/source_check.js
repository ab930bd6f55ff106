// A TypeScript worker's source check: parse a program, a Cordis host half or a client half,
// never run it.
//
// Asked by the runtime (runtime_service/source_check.py) with one `check` frame instead of a
// program: {"t":"check","kind":"program"|"host"|"client","source",...}; answered with
// {"t":"checked","problems":[{"line","column","message"}]} (no problems: it parses), then the
// worker waits to be killed as after a program.
//
// A program and a host half are TypeScript: wrapped as the worker and the plugin host wrap them
// (a strict async function whose head is one line of its own), their types are blanked in
// place by the pinned type stripper (amaro, strip-only: every line and column stays where it
// was), then V8 compiles the result without running it (`new vm.Script`: a compile, never
// `runInThisContext`). A client half is plain JavaScript for the browser, wrapped as
// `(async () => {\n<code>\n})()`, compiled the same way and not stripped. Lines and columns
// are the source's own (line 1-based, column 0-based).

import vm from 'node:vm';

import amaro from 'amaro';

// The heads the worker (worker.js) and the plugin host (plugin_harness.js) compile with.
const PROGRAM_HEAD = '(async function (tools, ToolCallError, console) {"use strict";\n';
const HOST_HEAD = '(async function () {"use strict";\n';
const TYPED_TAIL = '\n})';
const CLIENT_HEAD = '(async () => {\n';
const CLIENT_TAIL = '\n})()\n';
const FILENAME = 'source.ts';
const LOCATION = /^source\.ts:(\d+)\n[^\n]*\n( *)\^/;
const NON_ASCII = /[\u007f-\uffff]/g;

/**
 * The problems of `source` as a `kind` (empty: it parses).
 * @param {string} kind
 * @param {string} source
 * @returns {{line: number, column: number, message: string}[]}
 */
export function checkSource(kind, source) {
  let text;
  if (kind === 'client') {
    text = CLIENT_HEAD + source + CLIENT_TAIL;
  } else if (kind === 'program' || kind === 'host') {
    try {
      text = amaro.transformSync((kind === 'host' ? HOST_HEAD : PROGRAM_HEAD) + source + TYPED_TAIL, {
        mode: 'strip-only',
      }).code;
    } catch (error) {
      return [stripProblem(error, source)];
    }
  } else {
    throw new RangeError(`a TypeScript worker checks program, host and client, not ${kind}`);
  }
  try {
    new vm.Script(text, { filename: FILENAME, lineOffset: -1 });
  } catch (error) {
    return [compileProblem(error, source)];
  }
  return [];
}

/**
 * Where the type stripper stopped, in the source's own lines (its first line is the head's).
 * @param {unknown} error
 * @param {string} source
 */
function stripProblem(error, source) {
  const raw = /** @type {any} */ (error);
  const lines = source.split('\n').length;
  if (raw !== null && typeof raw === 'object' && typeof raw.startLine === 'number') {
    const line = Math.max(1, Math.min(raw.startLine - 1, lines));
    const column = typeof raw.startColumn === 'number' && raw.startLine - 1 <= lines ? raw.startColumn : 0;
    return { line, column, message: String(raw.message) };
  }
  return { line: 1, column: 0, message: String(raw?.message ?? error) };
}

/**
 * Where V8's compiler stopped: its stack names `source.ts:<line>`, the line, and a caret.
 * @param {unknown} error
 * @param {string} source
 */
function compileProblem(error, source) {
  const raw = /** @type {any} */ (error);
  const stack = typeof raw?.stack === 'string' ? raw.stack : '';
  const message = typeof raw?.message === 'string' ? raw.message : String(error);
  const found = LOCATION.exec(stack);
  const lines = source.split('\n').length;
  if (found === null) return { line: 1, column: 0, message };
  // A client half's wrapper adds no line before the body either: its head ends the first line.
  return { line: Math.max(1, Math.min(Number(found[1]), lines)), column: found[2].length, message };
}

/**
 * Answer one `check` frame with `finish` (the worker's: send the last message, wait to be
 * killed).
 * @param {any} start
 * @param {(message: string) => never} finish
 */
export function serveCheck(start, finish) {
  let answer;
  try {
    const kind = start?.kind;
    const source = start?.source;
    if (typeof kind !== 'string' || typeof source !== 'string') throw new TypeError('a check needs a source and a kind');
    answer = { t: 'checked', problems: checkSource(kind, source) };
  } catch (error) {
    answer = { t: 'checked', error: String(/** @type {any} */ (error)?.message ?? error) };
  }
  // The channel carries ASCII JSON only.
  const text = JSON.stringify(answer).replace(NON_ASCII, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  finish(text);
}
