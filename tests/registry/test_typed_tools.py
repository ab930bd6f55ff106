"""Typed tools end to end: pydantic schemas with `$defs`/`$ref`, sets and tuples.

A `ToolProvider` tool typed by a TypedDict holding a nested TypedDict, a `set[str]`, a
`tuple[int, str]` and a recursive TypedDict registers over real gRPC; its arguments are
validated model-direct and from a run_code program (real worker processes); GetSdk renders the
referenced definitions as named types. The validator's own rules (refusals, cycles, bounds,
JSON equality for `uniqueItems`) are checked directly below.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired

import pytest
from pydantic import Field, TypeAdapter
from typing_extensions import TypedDict  # pydantic needs it below Python 3.12

from codemode_client import InvocationContext, ProviderError, ToolProvider
from codemode_client.schemas import hinted_schemas
from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.jsonschema import (
    MAX_REF_EXPANSIONS,
    SchemaError,
    check_schema,
    validate,
)
from registry_service.domain.scopes import Mode
from registry_service.presentation.sdk_model import SdkTool
from registry_service.presentation.sdk_python import render_python_sdk
from registry_service.presentation.sdk_typescript import render_typescript_sdk
from tests.codemode.conftest import Stack, make_stack, value_of

__all__ = ["make_stack"]  # the fixture, used by name

LANGUAGES = ["python", "typescript"]
TYPECHECK = Path(__file__).resolve().parents[2] / "tools" / "typecheck"
TSC = TYPECHECK / "node_modules" / ".bin" / "tsc"


class Point(TypedDict):
    x: int
    y: int


class Tree(TypedDict):
    name: str
    children: list[Tree]


class PlaceArgs(TypedDict):
    where: Point
    tags: set[str]
    pair: tuple[int, str]
    tree: NotRequired[Tree]


async def place(args: PlaceArgs, ctx: InvocationContext) -> Tree:
    """Echoes what it was given, so the test sees the arguments the provider received."""
    tree = args.get("tree")
    return {"name": f"{args['where']['x']},{args['pair'][1]}", "children": [tree] if tree else []}


VALID: dict[str, Any] = {
    "where": {"x": 1, "y": 2},
    "tags": ["a", "b"],
    "pair": [7, "seven"],
    "tree": {"name": "root", "children": [{"name": "leaf", "children": []}]},
}


def test_pydantic_emits_the_keywords_under_test() -> None:
    """Guards the premise: the hinted schema really uses $defs/$ref, uniqueItems, prefixItems."""
    schema, output = hinted_schemas(place)
    assert isinstance(schema, dict) and isinstance(output, dict)
    text = json.dumps(schema)
    assert set(schema["$defs"]) == {"Point", "Tree"}  # type: ignore[arg-type]
    assert '"$ref": "#/$defs/Tree"' in text and '"uniqueItems": true' in text
    assert '"prefixItems"' in text
    check_schema(schema)
    check_schema(output)


async def test_typed_tool_registered_called_and_rendered(make_stack: Any, tmp_path: Path) -> None:
    async with make_stack(runtime_languages=LANGUAGES, default_mode=Mode.BOTH) as stack:
        python, typescript = await _typed_tool_end_to_end(stack)
    # The SDK text the registry served type-checks, and so does a program using it as typed;
    # a program passing a wrong nested field type does not.
    good = '{"where": {"x": 1, "y": 2}, "tags": ["a"], "pair": [1, "x"]}'
    bad = '{"where": {"x": "1", "y": 2}, "tags": ["a"], "pair": [1, "x"]}'
    use = "async def program() -> str:\n    tree = await tools.place_tool({args})\n"
    use += '    return tree["children"][0]["name"]\n'
    files = {
        "sdk.py": _code_block(python, "python") + "\n",
        "good.py": "from sdk import tools\n\n\n" + use.format(args=good),
        "bad.py": "from sdk import tools\n\n\n" + use.format(args=bad),
    }
    assert set(_mypy_errors(tmp_path / "py", files)) == {"bad.py"}
    if not TSC.exists():
        pytest.skip("tsc missing: run `npm ci --prefix tools/typecheck`")
    program = (
        "{sdk}\n\nexport async function program(): Promise<string> {{\n"
        "  const tree = await tools.place_tool({args});\n  return tree.children[0].name;\n}}\n"
    )
    sdk = _code_block(typescript, "ts")
    ts_files = {
        "good.ts": program.format(sdk=sdk, args=good),
        "bad.ts": program.format(sdk=sdk, args=bad),
    }
    assert set(_tsc_errors(tmp_path / "ts", ts_files)) == {"bad.ts"}


def _code_block(section: str, fence: str) -> str:
    start = section.index(f"```{fence}\n") + len(f"```{fence}\n")
    assert section.endswith("\n```")
    return section[start : -len("\n```")]


def _mypy_errors(folder: Path, files: dict[str, str]) -> dict[str, list[str]]:
    """`mypy --strict` over the files: the error lines per file name."""
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    (folder / "mypy.ini").write_text("[mypy]\n", encoding="utf-8")
    command = [sys.executable, "-m", "mypy", "--strict", "--config-file", "mypy.ini"]
    command += ["--cache-dir", str(folder / ".cache"), *files]
    result = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, timeout=300, check=False
    )
    errors: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        if ": error: " in line:
            errors.setdefault(line.split(":")[0], []).append(line)
    return errors


def _tsc_errors(folder: Path, files: dict[str, str]) -> dict[str, list[str]]:
    """`tsc --strict` (the SDK check's settings) over the files: error lines per file name."""
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    config = {"extends": str(TYPECHECK / "tsconfig.base.json"), "files": sorted(files)}
    (folder / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")
    result = subprocess.run(
        [str(TSC), "-p", str(folder / "tsconfig.json"), "--pretty", "false"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    errors: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r"^(\S+?\.ts)\(\d+,\d+\): error ", line)
        if match:
            errors.setdefault(Path(match.group(1)).name, []).append(line)
    return errors


async def _typed_tool_end_to_end(stack: Stack) -> tuple[str, str]:
    provider = ToolProvider(stack.channel, "typed")
    seen: list[Any] = []

    @provider.tool(description="Place a point.")
    async def place_tool(args: PlaceArgs, ctx: InvocationContext) -> Tree:
        seen.append(args)
        return await place(args, ctx)

    async with provider:
        # Model-direct: valid arguments reach the provider parsed into the hinted types.
        _, result = await stack.execute("place_tool", VALID, call_id="m1")
        assert value_of(result)["name"] == "1,seven"
        assert seen == [{**VALID, "tags": {"a", "b"}, "pair": (7, "seven")}]
        # Invalid ones are refused by the registry with path-qualified messages.
        bad = {
            "where": {"x": 1, "y": "2"},
            "tags": ["a", "a"],
            "pair": [7, "seven", 8],
            "tree": {"name": "r", "children": [{"name": 3, "children": []}]},
        }
        _, refused = await stack.execute("place_tool", bad, call_id="m2")
        assert refused.error.code == "INVALID_ARGS"
        assert refused.error.message == (
            'invalid arguments: "where.y" must be an integer; '
            '"tags" must not contain duplicate items (items 0 and 1 are equal); '
            '"pair" must have at most 2 items; '
            '"tree.children[0].name" must be a string'
        )
        _, swapped = await stack.execute("place_tool", {**VALID, "pair": ["seven", 7]})
        assert swapped.error.message == (
            'invalid arguments: "pair[0]" must be an integer; "pair[1]" must be a string'
        )
        assert len(seen) == 1  # refused calls never reached the provider

        # From a run_code program: the same rules, seen as a ToolCallError in the program.
        agent = await stack.code_agent()
        program = (
            f"ok = await tools.place_tool({VALID!r})\n"
            "try:\n"
            "    await tools.place_tool({'where': {'x': 1, 'y': 2}, 'tags': ['x', 'x'],"
            " 'pair': [1, 'one']})\n"
            "except ToolCallError as error:\n"
            "    print('refused:', error)\n"
            "await tools.place_tool({'where': {'x': 5, 'y': 2}, 'tags': [], 'pair': [1, 'one']})\n"
            "return ok['name']"
        )
        _, ran = await stack.run_code(program, agent=agent, call_id="c1")
        out = value_of(ran)
        assert out["result"] == "1,seven"
        assert len(out["logs"]) == 1 and out["logs"][0].startswith("refused:")
        assert '"tags" must not contain duplicate items (items 0 and 1 are equal)' in out["logs"][0]
        # The program passes the tuple as a list, as the SDK types it.
        assert seen[-1] == {"where": {"x": 5, "y": 2}, "tags": set(), "pair": (1, "one")}
        assert len(seen) == 3

        # GetSdk renders each definition once as a named type, recursion by name.
        python = (await stack.stub.GetSdk(ppb.GetSdkRequest(language="python"))).text
        for line in (
            "class PlaceToolArgs(TypedDict):",
            "    where: Point",
            "    tags: list[str]",
            "    pair: list[int | str]",
            "    tree: NotRequired[Tree]",
            "class Point(TypedDict):",
            "    children: list[Tree]",
            "    async def place_tool(self, args: PlaceToolArgs) -> Tree:",
        ):
            assert line in python.split("\n"), line
        assert python.count("class Tree(TypedDict):") == 1
        typescript = (await stack.stub.GetSdk(ppb.GetSdkRequest(language="typescript"))).text
        for line in (
            "type Point = {",
            "type Tree = {",
            "  children: Tree[];",
            "    where: Point;",
            "    tags: string[];",
            "    pair: [number, string];",
            "    tree?: Tree;",
            "  place_tool: Tree;",
        ):
            assert line in typescript.split("\n"), line
    return python, typescript


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"$ref": "https://example.com/s"}, "$ref must be a local reference #/$defs/<name>"),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/definitions/A"}}},
            "$ref must be a local reference #/$defs/<name>, at #/properties/a/$ref",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}, "$defs": {}},
            '$ref target "#/$defs/Nope" is not defined in #/$defs, at #/properties/a/$ref',
        ),
        (
            {"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"},
            "$ref cycle at #/$defs/A never descends into the value",
        ),
        (
            {
                "$defs": {
                    "A": {"anyOf": [{"$ref": "#/$defs/B"}]},
                    "B": {"oneOf": [{"$ref": "#/$defs/A"}]},
                }
            },
            "$ref cycle at #/$defs/",
        ),
        (
            {"properties": {"a": {"$defs": {}}}},
            "$defs is only supported at the root of a schema, at #/properties/a/$defs",
        ),
        ({"$defs": {"A": {"minimum": "x"}}}, "minimum must be a number at #/$defs/A/minimum"),
        ({"uniqueItems": "yes"}, "uniqueItems must be a boolean at #/uniqueItems"),
        ({"prefixItems": {}}, "prefixItems must be an array of schemas at #/prefixItems"),
        (
            {"prefixItems": [{"nope": 1}]},
            'unsupported JSON Schema keyword "nope" at #/prefixItems/0',
        ),
    ],
)
def test_refused_schemas(schema: JsonValue, message: str) -> None:
    with pytest.raises(SchemaError) as info:
        check_schema(schema)
    assert message in str(info.value)


async def test_bad_ref_refused_at_registration_naming_the_path(make_stack: Any) -> None:
    async with make_stack() as stack:
        provider = ToolProvider(stack.channel, "p")

        @provider.tool(
            input_schema={"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}
        )
        async def broken(args: Any, ctx: Any) -> Any:
            return 1

        with pytest.raises(ProviderError) as caught:
            await provider.start()
        assert caught.value.reason == "INVALID_SCHEMA"
        assert "#/properties/a/$ref" in str(caught.value)
        await provider.close()


def test_recursive_schema_validates_deep_values_iteratively() -> None:
    schema, _ = hinted_schemas(place)
    tree: dict[str, Any] = {"name": "leaf", "children": []}
    for _ in range(5000):  # far deeper than Python's recursion limit
        tree = {"name": "n", "children": [tree]}
    args: dict[str, JsonValue] = {"where": {"x": 1, "y": 2}, "tags": [], "pair": [1, "a"]}
    args["tree"] = tree
    assert validate(schema, args) == []
    tree["children"].append({"name": 1, "children": []})
    assert validate(schema, args) == ['"tree.children[1].name" must be a string']


def test_fanning_references_are_cut_off() -> None:
    """Each level has two arms referring to the next: 2**depth checks without a bound."""
    defs: dict[str, JsonValue] = {
        f"D{i}": {"anyOf": [{"type": "array", "items": {"$ref": f"#/$defs/D{i + 1}"}}] * 2}
        for i in range(40)
    }
    defs["D40"] = {}
    schema: JsonValue = {"$defs": defs, "$ref": "#/$defs/D0"}
    check_schema(schema)
    value: JsonValue = []
    for _ in range(39):
        value = [value]
    messages = validate(schema, value)
    assert messages == [
        f"validating arguments needs more than {MAX_REF_EXPANSIONS} $ref expansions "
        "(the schema's references fan out too much)"
    ]


@pytest.mark.parametrize(
    ("items", "duplicate"),
    [
        ([1, 1.0], True),  # numbers are equal by value
        ([{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}], True),  # key order does not matter
        ([1, True], False),  # a boolean is not a number
        ([0, False, None, "", [], {}], False),
        ([[1, 2], [2, 1]], False),  # array order matters
        (["a", "b", "a"], True),
    ],
)
def test_unique_items_uses_json_equality(items: list[JsonValue], duplicate: bool) -> None:
    messages = validate({"type": "array", "uniqueItems": True}, items)
    assert bool(messages) is duplicate
    if duplicate:
        assert messages[0].startswith("arguments must not contain duplicate items (items ")


def test_prefix_items_positions_and_extras() -> None:
    closed: JsonValue = {"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}
    assert validate(closed, [1, "a"]) == []
    assert validate(closed, [1]) == []  # prefixItems alone does not require positions
    assert validate(closed, [1, "a", 2, 3]) == ['"[2]" is not allowed', '"[3]" is not allowed']
    open_rest: JsonValue = {"prefixItems": [{"type": "integer"}], "items": {"type": "string"}}
    assert validate(open_rest, [1, "a", "b"]) == []
    assert validate(open_rest, ["x", "a", 2]) == [
        '"[0]" must be an integer',
        '"[2]" must be a string',
    ]
    anything: JsonValue = {"prefixItems": [{"type": "integer"}]}
    assert validate(anything, [1, None, {}]) == []


async def test_a_root_ref_to_a_non_object_is_refused_as_input(make_stack: Any) -> None:
    async with make_stack() as stack:
        provider = ToolProvider(stack.channel, "p")

        @provider.tool(input_schema={"$defs": {"S": {"type": "string"}}, "$ref": "#/$defs/S"})
        async def stringly(args: Any, ctx: Any) -> Any:
            return 1

        with pytest.raises(ProviderError) as caught:
            await provider.start()
        assert caught.value.reason == "INVALID_SCHEMA"
        assert "input schema must describe an object" in str(caught.value)
        await provider.close()


class Circle(TypedDict):
    kind: Literal["circle"]
    radius: float


class Square(TypedDict):
    kind: Literal["square"]
    side: float


class ShapeArgs(TypedDict):
    shape: Annotated[Circle | Square, Field(discriminator="kind")]


def test_pydantic_tagged_union_is_accepted_and_enforced_by_one_of() -> None:
    schema = TypeAdapter(ShapeArgs).json_schema()
    assert "discriminator" in json.dumps(schema)  # the annotation pydantic adds
    check_schema(schema)
    assert validate(schema, {"shape": {"kind": "circle", "radius": 1.5}}) == []
    assert validate(schema, {"shape": {"kind": "square", "radius": 1.5}}) == [
        '"shape" must match exactly one schema in oneOf (matched none)'
    ]


def test_a_definition_shared_by_tools_is_declared_once() -> None:
    """Same key and same closure: one declaration; same key, other shape: a second name."""
    point = hinted_schemas(place)[0]
    other: JsonValue = {
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/Point"}},
        "$defs": {"Point": {"type": "string"}},
    }
    tools = [
        SdkTool("a", "", point, {}),
        SdkTool("b", "", point, hinted_schemas(place)[1]),
        SdkTool("c", "", other, {}),
    ]
    python = render_python_sdk(tools)
    assert python.count("class Point(TypedDict):") == 1
    assert python.count("class Tree(TypedDict):") == 1
    assert "Point2: TypeAlias = str" in python
    assert "async def b(self, args: BArgs) -> Tree: ..." in python
    typescript = render_typescript_sdk(tools)
    assert typescript.count("type Point = {") == 1 and typescript.count("type Tree = {") == 1
    assert "type Point2 = string" in typescript and "  b: Tree;" in typescript
