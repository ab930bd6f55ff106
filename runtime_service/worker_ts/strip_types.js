// The type stripper as a command, for the registry's define-time check of a TypeScript host
// half (registry_service/domain/cordis/syntax.py): the body on stdin, wrapped as the plugin
// host wraps it (a strict async function; its head is one line of its own), is written to
// stdout with its types stripped by amaro -- each annotation replaced by blanks, so every line
// and column stays where it was -- for `node --check` to parse. Where amaro stops, stderr gets
// `{"message", "line", "column"}` in the body's own coordinates (line 1-based, column
// 0-based) and the exit status is 1. Nothing is evaluated.

import amaro from 'amaro';

const HEAD = '(async function () {"use strict";\n';
const TAIL = '\n})\n';

let body = '';
process.stdin.setEncoding('utf8');
for await (const chunk of process.stdin) body += chunk;
try {
  process.stdout.write(amaro.transformSync(HEAD + body + TAIL, { mode: 'strip-only' }).code);
} catch (error) {
  const raw = /** @type {any} */ (error);
  const line = typeof raw?.startLine === 'number' ? Math.max(1, raw.startLine - 1) : 1;
  const column = typeof raw?.startColumn === 'number' ? raw.startColumn : 0;
  const message = typeof raw?.message === 'string' ? raw.message : String(error);
  process.stderr.write(JSON.stringify({ message, line, column }));
  process.exitCode = 1;
}
