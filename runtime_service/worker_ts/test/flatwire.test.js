// The shared flat-wire corpus (tests/runtime/wire_vectors.jsonl) against the JavaScript codec;
// tests/runtime/test_wire_vectors.py runs the same file against the Python one (case kinds and
// tags are described there).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import * as wire from '../flatwire.js';
import {
  LOG_LINE_OVERHEAD,
  OutputLedger,
  fitPrefix,
  jsonStringSize,
  tokensSize,
} from '../ledger.js';

const VECTORS = new URL('../../../tests/runtime/wire_vectors.jsonl', import.meta.url);
const CASES = readFileSync(VECTORS, 'utf8')
  .split('\n')
  .filter((line) => line.trim() !== '')
  .map((line) => JSON.parse(line));

/** The JavaScript value a corpus value stands for. */
function materialize(value) {
  if (Array.isArray(value)) return value.map(materialize);
  if (value !== null && typeof value === 'object') {
    const keys = Object.keys(value);
    if (keys.length === 1 && keys[0] === '$int') {
      const big = BigInt(value.$int);
      return Number.isSafeInteger(Number(big)) ? Number(big) : big;
    }
    if (keys.length === 1 && keys[0] === '$float') {
      return { nan: NaN, inf: Infinity, '-inf': -Infinity }[value.$float] ?? Number(value.$float);
    }
    if (keys.length === 1 && keys[0] === '$nested') {
      let nested = [];
      for (let i = 0; i < value.$nested; i++) nested = [nested];
      return nested;
    }
    const out = {};
    for (const key of keys) Object.defineProperty(out, key, { value: materialize(value[key]), enumerable: true, writable: true, configurable: true });
    return out;
  }
  return value;
}

function subject(testCase) {
  if ('expr' in testCase) return new Function(`return (${testCase.expr.js});`)();
  return materialize(testCase.value);
}

/** What the worker reports after "tool arguments must be lossless JSON: " (null: it sends). */
function sendError(value) {
  try {
    wire.spellTokens(wire.encode(value));
    return null;
  } catch (error) {
    assert.ok(error instanceof wire.WireError, `not a WireError: ${error}`);
    return error.message;
  }
}

for (const testCase of CASES) {
  if ((testCase.only ?? 'js') !== 'js') continue;
  test(testCase.name, () => {
    if ('deep' in testCase) {
      const { kind, depth } = testCase.deep;
      let value = kind === 'array' ? [] : {};
      for (let i = 0; i < depth; i++) value = kind === 'array' ? [value] : { k: value };
      const tokens = wire.encode(value);
      assert.equal(tokens.length, depth + 1);
      let back = wire.decode(wire.parseJson(wire.spellTokens(tokens)));
      for (let i = 0; i < depth; i++) back = kind === 'array' ? back[0] : back.k;
      assert.deepEqual(back, kind === 'array' ? [] : {});
      return;
    }
    if ('error' in testCase) {
      assert.equal(sendError(subject(testCase)), testCase.error);
      return;
    }
    if ('decode_error' in testCase || 'decode_error_prefix' in testCase) {
      let message = null;
      try {
        wire.decode(wire.parseJson(testCase.text));
      } catch (error) {
        assert.ok(error instanceof wire.WireError, `not a WireError: ${error}`);
        message = error.message;
      }
      if ('decode_error' in testCase) assert.equal(message, testCase.decode_error);
      else assert.ok(message?.startsWith(testCase.decode_error_prefix), message ?? 'decoded');
      return;
    }
    if ('decodes_to' in testCase) {
      assert.deepStrictEqual(wire.decode(wire.parseJson(testCase.text)), materialize(testCase.decodes_to));
      return;
    }
    const value = subject(testCase); // encoded once: a getter must be read once
    assert.equal(wire.spellTokens(wire.encode(value)), testCase.text);
    const back = wire.decode(wire.parseJson(testCase.text));
    if (!('expr' in testCase)) assert.deepStrictEqual(back, value);
    assert.equal(wire.spellTokens(wire.encode(back)), testCase.text);
  });
}

test('corpus has cases for JavaScript', () => {
  assert.ok(CASES.filter((c) => (c.only ?? 'js') === 'js').length > 60);
});

test('decoded containers have the intrinsic prototypes and __proto__ stays a key', () => {
  const value = wire.decode(wire.parseJson('[{"kind":"object","keys":["__proto__","a"]},{"kind":"object","keys":[]},{"kind":"array","length":0}]'));
  assert.equal(Object.getPrototypeOf(value), Object.prototype);
  assert.deepEqual(Object.keys(value), ['__proto__', 'a']);
  assert.equal(Object.getPrototypeOf(value.__proto__), Object.prototype);
  assert.equal(Object.getPrototypeOf(value.a), Array.prototype);
});

test('prototype setters and patched globals change nothing', () => {
  const hits = [];
  Object.defineProperty(Array.prototype, '0', { set(v) { hits.push(v); }, configurable: true });
  Object.defineProperty(Object.prototype, 'get', { value: () => 1, configurable: true });
  const savedStringify = JSON.stringify;
  JSON.stringify = () => '"forged"';
  try {
    const text = wire.spellTokens(wire.encode({ a: [1, 'x'] }));
    assert.equal(text, '[{"kind":"object","keys":["a"]},{"kind":"array","length":2},1,"x"]');
    const back = wire.decode(wire.parseJson(text));
    assert.equal(Object.getOwnPropertyDescriptor(back.a, '0').value, 1);
    assert.deepEqual(hits, []);
  } finally {
    JSON.stringify = savedStringify;
    delete Array.prototype[0];
    delete Object.prototype.get;
  }
});

test('integers beyond the safe range arrive as BigInt, exactly, and go back so', () => {
  const value = wire.decode(wire.parseJson('[{"kind":"array","length":3},9007199254740991,9007199254740992,-123456789012345678901234567890]'));
  assert.deepStrictEqual(value, [9007199254740991, 9007199254740992n, -123456789012345678901234567890n]);
  assert.equal(wire.spellTokens(wire.encode(value)), '[{"kind":"array","length":3},9007199254740991,9007199254740992,-123456789012345678901234567890]');
});

test('snapshots are independent copies, each property read once', () => {
  let reads = 0;
  const source = { get a() { reads += 1; return { n: reads }; } };
  const copy = wire.snapshot(source);
  assert.equal(reads, 1);
  assert.deepEqual(copy, { a: { n: 1 } });
  assert.notEqual(copy, source);
});

test('ledger sizes match the Python ledger rules', () => {
  assert.equal(jsonStringSize(''), 2);
  assert.equal(jsonStringSize('a"\\'), 7);
  assert.equal(jsonStringSize('\n\u0001'), 2 + 2 + 6);
  assert.equal(jsonStringSize('é€😀'), 2 + 2 + 3 + 4);
  assert.equal(jsonStringSize('\ud800'), 8);
  assert.equal(fitPrefix('ab😀c', 2 + 2 + 3), 'ab');
  assert.equal(fitPrefix('ab😀c', 2 + 2 + 4), 'ab😀');
  // [1.5, "x", {"k": null}] is 19 bytes of JSON: [1.5,"x",{"k":null}]
  const tokens = wire.encode([1.5, 'x', { k: null }]);
  assert.equal(tokensSize(tokens, 100), '[1.5,"x",{"k":null}]'.length);
  assert.equal(tokensSize(tokens, 10), 11);
  assert.equal(tokensSize(wire.encode(2 ** 60), 100), '1.152921504606847e+18'.length);
  const ledger = new OutputLedger(64 + LOG_LINE_OVERHEAD);
  assert.ok(ledger.admitLog('x'.repeat(60)));
  assert.ok(!ledger.fitsMessage('x'));
  // Each line pays the overhead of holding it (ledger.py's LOG_LINE_OVERHEAD, the same value).
  const tiny = new OutputLedger(1 << 16);
  let lines = 0;
  while (tiny.admitLog('x')) lines += 1;
  assert.equal(lines, Math.floor(((1 << 16) - 2 + 1) / (4 + LOG_LINE_OVERHEAD)));
  assert.throws(() => new OutputLedger(3));
});
