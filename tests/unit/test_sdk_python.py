"""Python SDK rendering: goldens, naming and type rules, deep schemas, and `mypy --strict`.

Regenerate goldens with `UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_sdk_python.py`,
then read every changed file before keeping it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from registry_service.presentation.sdk_model import SdkTool
from registry_service.presentation.sdk_python import (
    MAX_LIST_NESTING,
    camel_case,
    describe,
    is_bare_tool_name,
    is_typeddict_field,
    python_type,
    render_python_sdk,
)

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "sdk"
CASES = sorted(path.stem for path in (GOLDEN / "cases").glob("*.json"))


def _tool(name: str, description: str, input_schema: Any, output_schema: Any) -> SdkTool:
    """Builds a row from loosely typed test literals (dict literals infer narrow types)."""
    return SdkTool(name, description, input_schema, output_schema)


def load_case(name: str) -> list[SdkTool]:
    rows = json.loads((GOLDEN / "cases" / f"{name}.json").read_text(encoding="utf-8"))
    return [SdkTool(**row) for row in rows]


def code_block(section: str) -> str:
    start = section.index("```python\n") + len("```python\n")
    assert section.endswith("\n```")
    return section[start : -len("\n```")]


def check_golden(path: Path, text: str) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_bytes(text.encode("utf-8"))
        return
    assert path.exists(), f"missing golden {path.name}: run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_bytes().decode("utf-8"), f"{path.name} differs from the golden"


@pytest.mark.parametrize("case", CASES)
def test_golden_and_parses(case: str) -> None:
    text = render_python_sdk(load_case(case))
    text.encode("utf-8")  # no lone surrogate may reach the prompt
    ast.parse(code_block(text))
    check_golden(GOLDEN / f"{case}.python.txt", text)


def test_section_layout_and_run_code_never_bound() -> None:
    """`run_code` is never a binding and the fixed blocks come in order, Python flavour."""
    tools = [
        SdkTool("run_code", "transport", {"type": "object"}, {"type": "object"}),
        SdkTool("read", "", {"type": "object", "properties": {"p": {"type": "string"}}}, {}),
    ]
    text = render_python_sdk(tools)
    assert text.startswith("## Writing code for run_code\n\n")
    assert "\n\nThe available tools:\n\n```python\nfrom typing import " in text
    assert "run_code" not in code_block(text)
    assert "    async def read(self, args: ReadArgs) -> Any: ...\n\ntools: Tools" in text


def test_empty_tool_set() -> None:
    assert code_block(render_python_sdk([])) == (
        "from typing import Protocol\n\n"
        "class ToolCallError(Exception):\n    toolName: str\n\n"
        "class Tools(Protocol):\n    pass\n\n"
        "tools: Tools"
    )


def test_only_subscript_members_still_get_pass() -> None:
    code = code_block(render_python_sdk([SdkTool("my-tool", "Hi.", {}, {})]))
    assert 'class Tools(Protocol):\n    pass\n    # tools["my-tool"](args: Any) -> Any\n' in code
    assert "    #   Hi.\n" in code


def test_typing_imports_only_what_is_used_in_fixed_order() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "const": "x"}, "b": {}},
        "required": ["a"],
    }
    code = code_block(render_python_sdk([_tool("t", "", schema, {"type": "string"})]))
    assert code.startswith("from typing import Any, Literal, NotRequired, Protocol, TypedDict\n")
    plain = code_block(render_python_sdk([SdkTool("t", "", {"type": "string"}, {"type": "null"})]))
    assert plain.startswith("from typing import Protocol\n")


def test_byte_stable_and_order_independent() -> None:
    """Identical text across renders and whatever order the tools arrive in."""
    tools = load_case("collisions") + load_case("names") + load_case("types")
    first = render_python_sdk(tools)
    assert render_python_sdk(tools) == first
    assert render_python_sdk(list(reversed(tools))) == first


@pytest.mark.parametrize(
    ("name", "bare"),
    [
        ("read", True),
        ("match", True),
        ("type", True),
        ("case", True),
        ("données", True),
        ("名前", True),
        ("_", False),
        ("_private", False),
        ("__init__", False),
        ("class", False),
        ("None", False),
        ("await", False),
        ("my-tool", False),
        ("2fa", False),
        ("ｆｕｌｌ", False),  # identifier, but NFKC turns it into "full"
        ("ﬁle", False),
        ("", False),
    ],
)
def test_bare_tool_names(name: str, bare: bool) -> None:
    assert is_bare_tool_name(name) is bare


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("path", True),
        ("_", True),
        ("_single", True),
        ("__dunder__", True),
        ("match", True),
        ("__private", False),  # would be mangled to _Class__private
        ("__debug__", False),
        ("from", False),
        ("my-field", False),
        ("ｆｕｌｌ", False),
    ],
)
def test_typeddict_field_names(name: str, ok: bool) -> None:
    assert is_typeddict_field(name) is ok


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("read_file", "ReadFile"),
        ("readFile", "ReadFile"),
        ("read-file", "ReadFile"),
        ("__init__", "Init"),
        ("2fa", "Tool2fa"),
        ("-", "Tool"),
        ("données", "Données"),
        ("ｆｕｌｌ", "Full"),  # NFKC after upper-casing
        ("a b\u00b7c", "AB\u00b7c"),  # U+00B7 is XID_Continue, so it stays inside the word
        ("\U0001f525fire", "Fire"),
    ],
)
def test_camel_case(raw: str, expected: str) -> None:
    assert camel_case(raw) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  a\t\nb  ", "a b"),
        ("x\u2028y\u00a0z\ufeff", "x y z"),
        ("nul\x00 us\x1f del\x7f nel\x85 c1\x9f", "nul\\x00 us\\x1f del\\x7f nel\\x85 c1\\x9f"),
        ("lone \ud800 pair \ud83d\ude00", "lone \\ud800 pair \U0001f600"),
        (" \n ", None),
        ("", None),
        (None, None),
    ],
)
def test_describe(text: str | None, expected: str | None) -> None:
    assert describe(text) == expected


def test_docstring_escaping() -> None:
    tool = SdkTool("t", 'ends with quote" and backslash\\', {}, {})
    code = code_block(render_python_sdk([tool]))
    assert '        """ends with quote\\" and backslash\\\\"""\n' in code
    assert ast.literal_eval(code.split("\n        ", 1)[1].split("\n")[0]) == (
        'ends with quote" and backslash\\'
    )


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, "str"),
        ({"type": "number"}, "float"),
        ({"type": "integer"}, "int"),
        ({"type": "boolean"}, "bool"),
        ({"type": "null"}, "None"),
        ({}, "Any"),
        ({"type": "array"}, "list[Any]"),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, "dict[str, Any]"),
        ({"type": "string", "enum": ["a", 'b"']}, 'Literal["a", "b\\""]'),
        (
            {"type": "integer", "enum": [2**53 + 1, -(2**60), 3.0]},
            "Literal[9007199254740993, -1152921504606846976, 3]",
        ),
        ({"type": "number", "const": 1e-7}, "Literal[1e-7]"),
        ({"type": "boolean", "enum": [True, False]}, "Literal[True, False]"),
        (
            {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]},
            "str | list[int]",
        ),
        ({"type": 7}, "Any"),
        ([], "Any"),
        ({"type": "string", "enum": []}, "Any"),
    ],
)
def test_python_type_context_free(schema: Any, expected: str) -> None:
    assert python_type(schema) == expected


def test_nested_classes_precede_parents_and_one_of_arms_are_numbered() -> None:
    schema = {
        "type": "object",
        "properties": {
            "outer": {
                "type": "object",
                "properties": {
                    "inner": {
                        "type": "object",
                        "properties": {"x": {"type": "integer"}},
                        "additionalProperties": False,
                    }
                },
                "additionalProperties": False,
            },
            "pick": {
                "oneOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}},
                    {"type": "null"},
                ]
            },
        },
        "required": ["outer"],
        "additionalProperties": False,
    }
    code = code_block(render_python_sdk([_tool("do_it", "", schema, {})]))
    names = re.findall(r"^class (\w+)\(TypedDict\):", code, flags=re.MULTILINE)
    assert names == ["DoItArgsOuterInner", "DoItArgsOuter", "DoItArgsPick1", "DoItArgs"]
    assert "    outer: DoItArgsOuter\n    pick: NotRequired[DoItArgsPick1 | None]\n" in code


def test_class_names_capped_and_deduplicated() -> None:
    long_name = "a" * 130
    tools = [
        SdkTool(
            long_name,
            "",
            {"type": "object", "properties": {"x": {"type": "string"}}},
            {"type": "object", "properties": {"y": {"type": "string"}}},
        )
    ]
    names = re.findall(r"^class (\w+)\(", code_block(render_python_sdk(tools)), flags=re.MULTILINE)
    base = "A" + "a" * 119
    assert names == ["ToolCallError", base, base + "2", "Tools"]


def test_cap_drops_a_split_astral_character() -> None:
    name = "x" * 119 + "\U00020000_a"
    tools = [SdkTool(name, "", {"type": "object", "properties": {"x": {"type": "string"}}}, {})]
    code = code_block(render_python_sdk(tools))
    assert f"class X{'x' * 118}(TypedDict):" in code


def test_list_nesting_capped_below_cpythons_bracket_limit() -> None:
    deep = _nest(MAX_LIST_NESTING + 20, lambda inner: {"type": "array", "items": inner})
    assert python_type(deep) == "list[" * MAX_LIST_NESTING + "Any" + "]" * MAX_LIST_NESTING
    field = {"type": "object", "properties": {"f": deep}}
    code = code_block(render_python_sdk([_tool("t", "", field, deep)]))
    inside_field = MAX_LIST_NESTING - 1  # `NotRequired[` holds one of the brackets
    assert "    f: NotRequired[" + "list[" * inside_field + "Any" + "]" * (inside_field + 1) in code
    ast.parse(code)


def test_cyclic_schema_renders_any_instead_of_looping() -> None:
    node: dict[str, Any] = {"type": "object", "properties": {}}
    node["properties"]["again"] = node
    code = code_block(render_python_sdk([SdkTool("t", "", node, {})]))
    assert "class TArgs(TypedDict):\n    again: NotRequired[Any]\n" in code


def test_internal_failure_degrades_to_any_and_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from registry_service.presentation._sdk_common import classify as real

    def failing(node: object) -> Any:
        if isinstance(node, dict) and "boom" in node:
            raise RuntimeError("simulated bug")
        return real(node)

    monkeypatch.setattr("registry_service.presentation.sdk_python.classify", failing)
    nested = {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"x": {"type": "string"}}},
            "bad": {"type": "array", "items": {"boom": 1}},
        },
    }
    output = {"type": "object", "properties": {"y": {"type": "string"}}}
    code = code_block(render_python_sdk([_tool("t", "", nested, output)]))
    assert "TArgs" not in code  # nothing half-rendered survives
    assert "class TOutput(TypedDict):" in code
    assert "    async def t(self, args: Any) -> TOutput: ...\n" in code
    assert code.startswith("from typing import Any, NotRequired, Protocol, TypedDict\n")


def _nest(depth: int, wrap: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = wrap(node)
    return node


def test_deep_one_of_output_schema() -> None:
    """A 5 000-deep `oneOf` chain renders without recursion (unions are uncapped)."""
    deep = _nest(5000, lambda inner: {"oneOf": [{"type": "integer"}, inner]})
    text = render_python_sdk([SdkTool("deep", "", {"type": "object"}, deep)])
    assert "-> " + "int | " * 5000 + "str: ..." in text
    # CPython builds its AST recursively, so only a shallower chain can be parsed back here.
    ast.parse(code_block(render_python_sdk([SdkTool("d", "", {}, _nest(500, _one_of_object))])))


def _one_of_object(inner: Any) -> dict[str, Any]:
    return {"oneOf": [{"type": "object", "properties": {"v": {"type": "integer"}}}, inner]}


def test_deep_object_and_array_schemas_stay_linear_and_parse() -> None:
    objects = _nest(5000, lambda inner: {"type": "object", "properties": {"c": inner}})
    arrays = _nest(5000, lambda inner: {"type": "array", "items": inner})
    code = code_block(render_python_sdk([SdkTool("objects", "", objects, arrays)]))
    assert code.count("(TypedDict):") == 5000
    assert len(code) < 5000 * 600  # class names are capped, so no quadratic growth
    ast.parse(code)


def test_deep_one_of_objects_stay_linear() -> None:
    code = code_block(render_python_sdk([SdkTool("u", "", _nest(5000, _one_of_object), {})]))
    assert code.count("(TypedDict):") == 5000
    assert len(code) < 5000 * 600


def test_generated_stubs_type_check_with_mypy(tmp_path: Path) -> None:
    """Every golden stub and the samples pass `mypy --strict`; ill-typed samples fail."""
    for case in CASES:
        stub = code_block(render_python_sdk(load_case(case)))
        (tmp_path / f"sdk_{case}.py").write_text(stub + "\n", encoding="utf-8")
    for name, body in {**SAMPLES, **{f"bad_{key}": value for key, value in BAD.items()}}.items():
        (tmp_path / f"{name}.py").write_text(body, encoding="utf-8")
    (tmp_path / "mypy.ini").write_text("[mypy]\n", encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            "mypy.ini",
            "--cache-dir",
            str(tmp_path / ".cache"),
            ".",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    errors: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r"^(\w+)\.py:(\d+): error: ", line)
        if match:
            errors.setdefault(match.group(1), []).append(line)
    # Documented deviations, not bugs: float literals (kept to show the exact value) and
    # integers past 64 bits (exact digits) are valid Python but beyond what mypy accepts.
    type_errors = errors.pop("sdk_types", [])
    # split("\n"), not splitlines(): a U+2028 inside a string literal is not a line break.
    stub_lines = (tmp_path / "sdk_types.py").read_text(encoding="utf-8").split("\n")
    flagged = {
        stub_lines[int(line.split(":")[1]) - 1].split(":")[0].strip() for line in type_errors
    }
    assert flagged == {"unsafeInts", "numbers", "constNum"}, type_errors
    clean = {name: lines for name, lines in errors.items() if not name.startswith("bad_")}
    assert not clean, "\n".join(line for lines in clean.values() for line in lines)
    for name in BAD:
        assert f"bad_{name}" in errors, f"mypy accepted the ill-typed sample {name!r}"


SAMPLES = {
    "sample_basics": """\
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from sdk_basics import ToolCallError, tools

if TYPE_CHECKING:  # the classes exist only in the stub, never at run time
    from sdk_basics import MyToolArgs, MyToolOutput


async def program() -> object:
    file = await tools.read({"path": "README.md", "limit": 10})
    lines: int = file["lines"]
    found = await tools.search({"query": "TODO", "options": {"scope": {"limits": {"files": 3}}}})
    for match in found["matches"]:
        print(match["path"], match["line"], match["text"])
    await tools.write({"path": "out.txt", "content": file["content"], "mode": "append"})
    shell, pong = await asyncio.gather(tools.bash({"command": "ls"}), tools.ping({}))
    code: int | None = shell["exitCode"]
    args: MyToolArgs = {"target": "x", "dryRun": True}
    changed: MyToolOutput = await cast(Any, tools)["my-tool"](args)
    try:
        await tools.ping({})
    except ToolCallError as error:
        print(error.toolName, str(error))
    return [lines, code, pong["ok"], changed["changed"]]
""",
    "sample_names": """\
from __future__ import annotations

from typing import Any, cast

from sdk_names import tools


async def program() -> list[str]:
    bound = [
        await tools.match({}),
        await tools.type({"any": [1, "x", None]}),
        await tools.données({}),
        await tools.名前({}),
        await tools.constructor({}),
        await tools.ToolCallError({}),
    ]
    exotic: str = await cast(Any, tools)["my-tool"]({})
    return [*bound, exotic]
""",
    "sample_types": """\
from __future__ import annotations

from sdk_types import tools


async def program() -> object:
    status = await tools.enums({"words": "a|b", "flags": True, "nothing": None})
    picked = await tools.unions({"objects": {"kind": "a", "a": 1}, "scalar": None})
    grid = await tools.arrays({"grid": [[[1, 2]]], "rows": [{"id": 1}]})
    await tools.objects({"closedEmpty": {}, "any": {"nested": [True]}})
    return [status, picked, grid[0][0]]
""",
}

SAMPLES["sample_typed"] = """\
from __future__ import annotations

from sdk_typed import tools


async def program() -> object:
    tree = await tools.place(
        {"where": {"x": 1, "y": 2}, "tags": ["a"], "pair": [1, "x"], "opt": None,
         "tree": {"name": "r", "children": [{"name": "c", "children": []}]}}
    )
    child: str = tree["children"][0]["name"]
    pair = await tools.tuples({"closed": [1, "a"], "unique": [1, 2], "open": [True, "s"]})
    first: list[int] | str = pair[0]
    failed = await tools.names({"e": {"code": 1, "rest": ["x"]}, "t": "x", "weird": [[], [[]]]})
    return [child, first, failed["msg"]]
"""

BAD = {
    "wrong_nested_field": "from sdk_typed import tools\n\n\nasync def f() -> None:\n"
    '    await tools.place({"where": {"x": "1", "y": 2}, "tags": [], "pair": [1, "x"]})\n',
    "wrong_tuple_item": "from sdk_typed import tools\n\n\nasync def f() -> None:\n"
    '    await tools.place({"where": {"x": 1, "y": 2}, "tags": [], "pair": [1.5, "x"]})\n',
    "wrong_recursive_field": "from sdk_typed import tools\n\n\nasync def f() -> int:\n"
    '    return (await tools.place({"where": {"x": 1, "y": 2}, "tags": [], "pair": [1, "x"]}))'
    '["children"][0]["name"]\n',
    "wrong_field_type": "from sdk_basics import tools\n\n\nasync def f() -> None:\n"
    '    await tools.read({"path": 42})\n',
    "bad_enum_member": "from sdk_basics import tools\n\n\nasync def f() -> None:\n"
    '    await tools.write({"path": "a", "content": "b", "mode": "truncate"})\n',
    "missing_required": "from sdk_basics import tools\n\n\nasync def f() -> None:\n"
    "    await tools.search({})\n",
    "wrong_result_use": "from sdk_basics import tools\n\n\nasync def f() -> str:\n"
    '    return (await tools.read({"path": "a"}))["lines"]\n',
    "unknown_tool": "from sdk_basics import tools\n\n\nasync def f() -> None:\n"
    "    await tools.nope({})\n",
}
