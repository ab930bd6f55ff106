import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { JsonError, parseJson, stringifyJson, type JsonValue } from "../src/json";

describe("lossless JSON", () => {
  it("keeps safe integers as numbers and the rest as bigint", () => {
    assert.deepEqual(parseJson("[0, 1, -5, 9007199254740991, -9007199254740991]"), [0, 1, -5, 9007199254740991, -9007199254740991]);
    assert.deepEqual(parseJson("[9007199254740992, -9007199254740993, 123456789012345678901234567890]"), [
      9007199254740992n,
      -9007199254740993n,
      123456789012345678901234567890n,
    ]);
    assert.equal(parseJson("1.5e3"), 1500);
    assert.equal(parseJson("1.0"), 1);
    assert.equal(parseJson("1e-400"), 0);
  });

  it("writes bigint digits exactly and round-trips", () => {
    const big = 2n ** 53n + 1n;
    const text = stringifyJson({ big, neg: -big, huge: 10n ** 40n, small: 3, f: 0.1 });
    assert.equal(text, '{"big":9007199254740993,"neg":-9007199254740993,"huge":10000000000000000000000000000000000000000,"small":3,"f":0.1}');
    assert.deepEqual(parseJson(text), { big, neg: -big, huge: 10n ** 40n, small: 3, f: 0.1 });
  });

  it("parses strings, escapes and literals like JSON.parse", () => {
    const samples = [
      '"a\\"b\\\\c\\/d\\b\\f\\n\\r\\t"',
      '"\\u00e9\\ud83d\\ude00 raw é 😀"',
      '"\\ud800"',
      '{"a":[true,false,null,{"b":""}],"c":{}}',
      ' [ ] ',
    ];
    for (const s of samples) assert.deepEqual(parseJson(s), JSON.parse(s));
    assert.equal(stringifyJson("\ud800x"), '"\\ud800x"');
  });

  it("refuses what cannot round-trip", () => {
    for (const bad of ["-0", "-0.0", "-1e-400", "1e400", "NaN", "Infinity", "-Infinity", '{"a":1,"a":2}', "01", "1.", "[1,]", '{"a"}', "[1] 2", '"\u0001"', "", "tru", '"\\x"']) {
      assert.throws(() => parseJson(bad), JsonError, bad);
    }
    for (const bad of [NaN, Infinity, -Infinity, -0, undefined, () => 1, Symbol("s"), new Map(), [undefined]]) {
      assert.throws(() => stringifyJson(bad), JsonError);
    }
    const cyclic: JsonValue[] = [];
    cyclic.push(cyclic);
    assert.throws(() => stringifyJson(cyclic), /cycle/);
    const shared = { x: 1 };
    assert.equal(stringifyJson([shared, shared]), '[{"x":1},{"x":1}]');
  });

  it("keeps __proto__ as an own key and omits undefined properties", () => {
    const value = parseJson('{"__proto__":{"polluted":1}}') as Record<string, JsonValue>;
    assert.equal(Object.getPrototypeOf(value), Object.prototype);
    assert.deepEqual(Object.keys(value), ["__proto__"]);
    assert.equal(stringifyJson(value), '{"__proto__":{"polluted":1}}');
    assert.equal(stringifyJson({ a: undefined, b: 1, d: new Date(0) }), '{"b":1,"d":"1970-01-01T00:00:00.000Z"}');
  });

  it("handles 100,000-deep nesting without recursion", () => {
    const depth = 100_000;
    const text = "[".repeat(depth) + "]".repeat(depth);
    let value = parseJson(text);
    assert.equal(stringifyJson(value), text);
    for (let i = 0; i < depth - 1; i++) value = (value as JsonValue[])[0]!;
    assert.deepEqual(value, []);
    const objects = '{"a":'.repeat(depth) + "1" + "}".repeat(depth);
    assert.equal(stringifyJson(parseJson(objects)), objects);
  });
});
