/**
 * The shared corpus of shown results (tests/clients/pretty_vectors.jsonl, written from Python's
 * `render_pretty`) against `renderPrettyJson`; tests/clients/test_pretty_vectors.py runs the
 * same file against the Python renderer. A result that travelled once (`sharedResult`) is shown
 * again from its `valueJson`, and must be the registry's text byte for byte.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import { JsonError, renderPrettyJson } from "../src/index";
import { memberJson } from "../src/json";
import { REPO_ROOT } from "./services";

interface Case {
  name: string;
  json: string;
  pretty?: string;
  error?: string;
}

const CASES: Case[] = readFileSync(resolve(REPO_ROOT, "tests", "clients", "pretty_vectors.jsonl"), "utf8")
  .split("\n")
  .filter((line) => line.trim() !== "")
  .map((line) => JSON.parse(line) as Case);

describe("renderPrettyJson: the shared corpus", () => {
  it("holds the cases it promises", () => {
    const names = new Set(CASES.map((c) => c.name));
    for (const name of ["deep nesting", "big ints", "floats as Python spells them", "negative zero", "strings needing escapes"]) {
      assert.ok(names.has(name), name);
    }
  });
  for (const c of CASES) {
    it(c.name, () => {
      if (c.error !== undefined) {
        assert.throws(() => renderPrettyJson(c.json), (e: unknown) => e instanceof JsonError && new RegExp(c.error!).test(e.message));
        return;
      }
      assert.equal(renderPrettyJson(c.json), c.pretty);
    });
  }
});

describe("renderPrettyJson beyond the corpus", () => {
  it("re-indents a text with whitespace between its tokens the same way", () => {
    for (const c of CASES.filter((c) => c.pretty !== undefined && !c.json.startsWith('"'))) {
      // The pretty text is the value's text too, with whitespace between its tokens.
      assert.equal(renderPrettyJson(c.pretty!), c.pretty, c.name);
    }
  });

  it("finds a member's text as the object spells it", () => {
    const text = '{"logs":["a","}"],"x\\"":{"result":1},"result":{"n":1.0,"b":[1e+16]}}';
    assert.equal(memberJson(text, "result"), '{"n":1.0,"b":[1e+16]}');
    assert.equal(memberJson(text, 'x"'), '{"result":1}');
    assert.equal(memberJson(text, "missing"), undefined);
    assert.equal(memberJson("{}", "result"), undefined);
    assert.equal(memberJson('{"result":"s"}', "result"), '"s"');
  });
});
