"""TypeScript SDK rendering: goldens, type rules, deep schemas, and a real `tsc --strict` check.

Regenerate goldens with `UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_sdk_typescript.py`,
then read every changed file before keeping it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from registry_service.presentation.sdk_model import SdkTool
from registry_service.presentation.sdk_typescript import (
    render_typescript_sdk,
    typescript_key,
    typescript_type,
)

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "sdk"
CASES = sorted(path.stem for path in (GOLDEN / "cases").glob("*.json"))
TYPECHECK = ROOT / "tools" / "typecheck"
TSC = TYPECHECK / "node_modules" / ".bin" / "tsc"


def _tool(name: str, description: str, input_schema: Any, output_schema: Any) -> SdkTool:
    """Builds a row from loosely typed test literals (dict literals infer narrow types)."""
    return SdkTool(name, description, input_schema, output_schema)


def load_case(name: str) -> list[SdkTool]:
    rows = json.loads((GOLDEN / "cases" / f"{name}.json").read_text(encoding="utf-8"))
    return [SdkTool(**row) for row in rows]


def code_block(section: str) -> str:
    start = section.index("```ts\n") + len("```ts\n")
    assert section.endswith("\n```")
    return section[start : -len("\n```")]


def check_golden(path: Path, text: str) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_bytes(text.encode("utf-8"))
        return
    assert path.exists(), f"missing golden {path.name}: run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_bytes().decode("utf-8"), f"{path.name} differs from the golden"


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    text = render_typescript_sdk(load_case(case))
    text.encode("utf-8")  # no lone surrogate may reach the prompt
    check_golden(GOLDEN / f"{case}.typescript.txt", text)


def test_section_layout_and_run_code_never_bound() -> None:
    """`run_code` is dropped even when passed in; fixed blocks in order."""
    tools = [
        SdkTool("run_code", "transport", {"type": "object"}, {"type": "object"}),
        SdkTool("read", "Read.", {"type": "object"}, {"type": "string"}),
    ]
    text = render_typescript_sdk(tools)
    assert text.startswith("## Writing code for run_code\n\n")
    assert "\n\nThe available tools:\n\n```ts\ntype JsonValue = " in text
    assert "declare const tools: {" in text
    assert "run_code:" not in text and '"run_code"' not in text
    assert "  read: Record<string, JsonValue>;" in text
    order = ["interface ToolArgsMap", "interface ToolOutputMap", "type ToolName", "declare class"]
    positions = [text.index(block) for block in order]
    assert positions == sorted(positions)


def test_empty_tool_set_renders_empty_interfaces() -> None:
    code = code_block(render_typescript_sdk([]))
    assert "interface ToolArgsMap {}\n\ninterface ToolOutputMap {}" in code


def test_byte_stable_and_order_independent() -> None:
    """Identical text across renders and whatever order the tools arrive in."""
    tools = load_case("names") + load_case("types")
    first = render_typescript_sdk(tools)
    assert render_typescript_sdk(tools) == first
    assert render_typescript_sdk(list(reversed(tools))) == first


def test_tools_sorted_by_utf16_code_units() -> None:
    names = ["b", "\uff41", "\U0001f525", "B", "a"]
    code = code_block(render_typescript_sdk([SdkTool(name, "", {}, {}) for name in names]))
    output_map = code[code.index("interface ToolOutputMap") :]
    listed = re.findall(r"^  (\S+): JsonValue;$", output_map, flags=re.MULTILINE)
    # U+1F525 is D83D DD25 in UTF-16, so it sorts before U+FF41 (unlike code point order).
    assert listed == ["B", "a", "b", '"\U0001f525"', '"\uff41"']


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("read", "read"),
        ("_x$1", "_x$1"),
        ("class", "class"),
        ("my-tool", '"my-tool"'),
        ("données", '"données"'),
        ("with space", '"with space"'),
        ("", '""'),
        ("9a", '"9a"'),
        ('q"\\\n\x00\ud800', '"q\\"\\\\\\n\\u0000\\ud800"'),
    ],
)
def test_key_quoting(name: str, key: str) -> None:
    assert typescript_key(name) == key


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, "string"),
        ({"type": "integer"}, "number"),
        ({"type": "null"}, "null"),
        ({}, "JsonValue"),
        ({"description": "annotation only"}, "JsonValue"),
        ({"type": "array"}, "JsonValue[]"),
        ({"type": "object"}, "Record<string, JsonValue>"),
        ({"type": "object", "additionalProperties": False}, "Record<string, never>"),
        ({"type": "string", "const": "a\nb"}, '"a\\nb"'),
        ({"type": "number", "enum": [1.0, 0.5, 1e21, 1e-7, -0.0]}, "1 | 0.5 | 1e+21 | 1e-7 | 0"),
        ({"type": "integer", "enum": [2**53 + 1]}, "9007199254740993"),
        ({"type": "boolean", "enum": [True, False]}, "true | false"),
        ({"oneOf": [{"type": "string"}, {"type": "null"}]}, "string | null"),
        (
            {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "null"}]}},
            "(string | null)[]",
        ),
        ({"type": "array", "items": {"type": "string", "enum": ["a&b"]}}, '("a&b")[]'),
        ({"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}, "number[][]"),
        ({"type": 7}, "unknown"),
        ([], "unknown"),
        ("x", "unknown"),
        (None, "unknown"),
        ({"type": ["string", "null"]}, "unknown"),
        ({"type": "string", "oneOf": [{"type": "string"}]}, "unknown"),
        ({"type": "integer", "enum": [True]}, "unknown"),
        ({"type": "integer", "enum": [float("nan")]}, "unknown"),
        ({"type": "string", "format": "uri", "minLength": 2}, "string"),
    ],
)
def test_type_rules(schema: Any, expected: str) -> None:
    assert typescript_type(schema) == expected


def test_object_members_docs_and_open_suffix() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "description": "  two\n lines */ here "},
            "my-key": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
        "required": ["a"],
    }
    assert typescript_type(schema, 1) == (
        "{\n"
        "    /** two lines *\\/ here */\n"
        "    a: string;\n"
        '    "my-key"?: {\n'
        "      x?: number;\n"
        "    } & Record<string, JsonValue>;\n"
        "  } & Record<string, JsonValue>"
    )


def test_cyclic_schema_renders_unknown_instead_of_looping() -> None:
    node: dict[str, Any] = {"type": "object", "properties": {}}
    node["properties"]["self"] = node
    assert typescript_type(node) == "{\n  self?: unknown;\n} & Record<string, JsonValue>"


def test_internal_failure_degrades_to_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    from registry_service.presentation._sdk_common import classify as real

    def failing(node: object) -> Any:
        if isinstance(node, dict) and "boom" in node:
            raise RuntimeError("simulated bug")
        return real(node)

    monkeypatch.setattr("registry_service.presentation.sdk_typescript.classify", failing)
    schema = {"type": "object", "properties": {"ok": {"type": "string"}, "bad": {"boom": 1}}}
    text = render_typescript_sdk([_tool("t", "", schema, {"type": "string"})])
    assert "  t: unknown;\n}\n\ninterface ToolOutputMap {\n  t: string;\n}" in text


def _nest(depth: int, wrap: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = wrap(node)
    return node


def test_deep_one_of_output_schema() -> None:
    """A 5 000-deep `oneOf` chain renders without recursion."""
    deep = _nest(5000, lambda inner: {"oneOf": [{"type": "integer"}, inner]})
    text = render_typescript_sdk([SdkTool("deep", "", {"type": "object"}, deep)])
    assert "  deep: " + "number | " * 5000 + "string;" in text


def test_deep_array_and_object_schemas() -> None:
    arrays = _nest(5000, lambda inner: {"type": "array", "items": inner})
    objects = _nest(
        5000, lambda inner: {"type": "object", "properties": {"c": inner}, "required": ["c"]}
    )
    text = render_typescript_sdk([SdkTool("deep", "", objects, arrays)])
    assert "  deep: string" + "[]" * 5000 + ";" in text
    assert text.count("c: {") == 4999
    # Indentation grows two spaces per level, so the text is quadratic in depth by design.
    assert "\n" + "  " * 5001 + "c: string;\n" in text


@pytest.mark.skipif(not TSC.exists(), reason="tsc missing: run `npm ci --prefix tools/typecheck`")
def test_generated_sdks_type_check_with_tsc(tmp_path: Path) -> None:
    """Every golden SDK compiles under `tsc --strict`; samples use the bindings; bad ones fail."""
    files: dict[str, str] = {}
    for case in CASES:
        sample = SAMPLES.get(case, "")
        files[f"sdk_{case}.ts"] = _program(render_typescript_sdk(load_case(case)), sample)
    for name, body in NEGATIVE_SAMPLES.items():
        files[f"bad_{name}.ts"] = _program(render_typescript_sdk(load_case("basics")), body)
    for name, body in NEGATIVE_TYPED.items():
        files[f"bad_{name}.ts"] = _program(render_typescript_sdk(load_case("typed")), body)
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    config = {"extends": str(TYPECHECK / "tsconfig.base.json"), "files": sorted(files)}
    (tmp_path / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")

    result = subprocess.run(
        [str(TSC), "-p", str(tmp_path / "tsconfig.json"), "--pretty", "false"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    errors: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r"^(\S+?\.ts)\(\d+,\d+\): error (TS\d+)", line)
        if match:
            errors.setdefault(Path(match.group(1)).name, []).append(line)
    clean = {name: lines for name, lines in errors.items() if not name.startswith("bad_")}
    assert not clean, "\n".join(line for lines in clean.values() for line in lines)
    for name in [*NEGATIVE_SAMPLES, *NEGATIVE_TYPED]:
        assert f"bad_{name}.ts" in errors, f"tsc accepted the ill-typed sample {name!r}"
    assert result.returncode != 0


def _program(section: str, body: str) -> str:
    """The SDK, a `console` stand-in (the runtime injects one), and the sample as a module."""
    return (
        code_block(section)
        + "\n\ndeclare const console: { log(...data: unknown[]): void };\n\n"
        + "export async function program(): Promise<unknown> {\n"
        + body
        + "\n  return null;\n}\n"
    )


SAMPLES = {
    "basics": """\
  const file = await tools.read({ path: "README.md", limit: 10 });
  const lines: number = file.lines;
  const found = await tools.search({ query: "TODO", options: { scope: { limits: { files: 3 } } } });
  for (const match of found.matches) console.log(match.path, match.line, match.text);
  await tools.write({ path: "out.txt", content: file.content, mode: "append" });
  const shell = await tools.bash({ command: "ls", extraKeyAllowed: true });
  const code: number | null = shell.exitCode;
  const [a, b] = await Promise.all([tools.ping({}), tools["my-tool"]({ target: "x" })]);
  const ok: true = a.ok;
  const changed: number = b.changed;
  try {
    await tools.ping({});
  } catch (error) {
    if (error instanceof ToolCallError) {
      const failed: ToolName = error.toolName;
      console.log(failed, error.message);
    }
  }
  console.log(lines, code, ok, changed);""",
    "names": """\
  await tools["my-tool"]({});
  await tools.class({});
  await tools.__proto__({});
  await tools.constructor({});
  await tools.$dollar({});
  await tools["données"]({});
  await tools["bad\\ud800name"]({});
  const text: string = await tools._({ any: ["json", 1, null] });
  console.log(text);""",
    "types": """\
  const status: "ok" | "error" = await tools.enums({ words: "a|b", unsafeInts: 9007199254740993 });
  const union = await tools.unions({ scalar: null, objects: { kind: "a", a: 1 } });
  if ("ok" in union) console.log(union.ok); else console.log(union.error);
  const grid: string[][] = await tools.arrays({ grid: [[[1, 2]]], literalWithBar: ["x|y"] });
  await tools.objects({ closedEmpty: {}, any: { nested: [true] } });
  console.log(status, grid);""",
    "fields": """\
  // A literal without `constructor` would inherit Object's (a Function): TypeScript's own quirk.
  await tools.fields_exotic({ "with space": "a", "": "c", "0": "d", $ref: "e", constructor: "f" });
  await tools.fields_ok({ match: "m", "名前": "n", camel_case_field: { x: "y" } });""",
}

SAMPLES["typed"] = """\
  const tree = await tools.place({
    where: { x: 1, y: 2 }, tags: ["a"], pair: [1, "x"], opt: null,
    tree: { name: "r", children: [{ name: "c", children: [] }] },
  });
  const child: string = tree.children[0].name;
  const t = await tools.tuples({ closed: [1, "a"], optional: [1], open: [true, "s", null] });
  const n: number = t[0][0];
  const e = await tools.names({ e: { code: 1, rest: [] }, t: "x", weird: [[], [[]]] });
  console.log(child, n, e.msg);"""

NEGATIVE_TYPED = {
    "wrong_nested_field": "  await tools.place("
    '{ where: { x: "1", y: 2 }, tags: [], pair: [1, "x"] });',
    "wrong_tuple_order": '  await tools.place({ where: { x: 1, y: 2 }, tags: [], pair: ["x", 1] })',
    "tuple_too_long": '  await tools.tuples({ closed: [1, "a", 2] });',
    "wrong_recursive_field": "  const n: number = (await tools.place({ where: { x: 1, y: 2 }, "
    'tags: [], pair: [1, "x"] })).children[0].name;',
}

NEGATIVE_SAMPLES = {
    "wrong_field_type": "  await tools.read({ path: 42 });",
    "bad_enum_member": '  await tools.write({ path: "a", content: "b", mode: "truncate" });',
    "missing_required": "  await tools.search({});",
    "closed_object_extra_key": '  await tools.read({ path: "a", nope: 1 });',
    "unknown_tool": "  await tools.nope({});",
}
