"""The TypeScript `tools:sdk` section: usage instructions plus typed declarations of every tool.

Schemas are walked with an explicit stack and written straight into one output list, so depth
costs neither Python stack nor quadratic string copying. The only decision that needs a finished
child is whether an array item type must be parenthesised (`(A | B)[]`); that is settled by
counting emitted chunks that contain `|` or `&` and patching a reserved slot afterwards.

Each `$defs` entry a schema references is declared once as `type Name = …` before the maps,
named after the entry (made a unique ASCII identifier); references use the name, so recursive
definitions cost nothing. `prefixItems` become tuple types: `[A, B?, ...C[]]`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from registry_service.presentation._sdk_common import (
    Kind,
    Shape,
    classify,
    collapse_whitespace,
    definition_fingerprint,
    definitions_of,
    description_of,
    escape_lone_surrogates,
    js_json_string,
    js_number,
    sdk_tools_in_order,
)
from registry_service.presentation.sdk_model import SdkTool

INSTRUCTIONS: Final = """\
## Writing code for run_code

`run_code` takes two required arguments: `code`, the body of an async TypeScript function \
(top-level `await` and `return` work), and `description`, a short summary of what the program \
does. Write erasable syntax only — no `enum`, no namespaces: the code is type-stripped before it \
runs, so the type annotations below are advisory. In the program:

- Call a tool with `await tools.name(args)`; a name that is not a plain identifier needs quoted \
access, e.g. `await tools["my-tool"](args)`. Each call resolves to that tool's canonical JSON \
value, typed as declared below. Arguments must be lossless JSON.
- A call that fails rejects with a `ToolCallError`: `toolName` says which tool failed and \
`message` explains why in plain words. Wrap calls in `try`/`catch` to handle a failure and \
carry on.
- Independent read-only calls MAY overlap under `Promise.all`: calls that are safe to overlap \
run concurrently, while a mutating call runs on its own, in the order it was submitted. Use \
`await` to sequence work that depends on an earlier result.
- Produce output with `return` and/or `console.log(...)`. Only what the program prints or \
returns is its output; tool results you do not pass on never reach the conversation, so keep \
just what you need. Images from successful tool calls are attached after the run.

The available tools:"""

JSON_VALUE_DECLARATION: Final = (
    "type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue }"
)
_ERROR_CLASS: Final = """\
declare class ToolCallError extends Error {
  readonly name: "ToolCallError";
  readonly toolName: ToolName;
}"""
_TOOLS_CONST: Final = """\
declare const tools: {
  [K in ToolName]: (args: ToolArgsMap[K]) => Promise<ToolOutputMap[K]>;
}"""

_IDENTIFIER: Final = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_BROAD_SCALAR: Final = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
}
_OPEN_SUFFIX: Final = " & Record<string, JsonValue>"
_NOT_IDENTIFIER: Final = re.compile(r"[^A-Za-z0-9_$]+")
# Names a declared definition must not take: the SDK's own, the globals it uses, and words
# TypeScript refuses as a type alias name.
_RESERVED_NAMES: Final = frozenset(
    {
        "JsonValue", "ToolArgsMap", "ToolOutputMap", "ToolName", "ToolCallError", "tools",
        "Error", "Promise", "Record", "Array", "Object", "String", "Number", "Boolean",
        "Function", "Symbol", "console", "any", "unknown", "never", "object", "string",
        "number", "boolean", "symbol", "bigint", "undefined", "null", "void", "this",
        "keyof", "typeof", "infer", "readonly", "unique", "asserts", "is", "type",
    }
)  # fmt: skip
_ESCAPED_CLOSER: Final = "*\\/"

# Stack task tags.
_NODE: Final = 0
_TEXT: Final = 1
_ARRAY_END: Final = 2
_LEAVE: Final = 3


@dataclass(slots=True)
class _Names:
    """Declared definition names of one render, and their declarations in order."""

    used: set[str] = field(default_factory=lambda: set(_RESERVED_NAMES))
    declarations: list[str] = field(default_factory=list)
    shared: dict[str, str] = field(default_factory=dict)  # definition fingerprint → name

    def allocate(self, key: str) -> str:
        base = _NOT_IDENTIFIER.sub("_", key)[:120] or "Def"
        if base[0].isdigit():
            base = "Def" + base
        name, suffix = base, 2
        while name in self.used:
            name, suffix = f"{base}{suffix}", suffix + 1
        self.used.add(name)
        return name


@dataclass(slots=True)
class _RefScope:
    """One root schema's `$defs`: the name of each referenced entry, entries still to declare."""

    defs: dict[str, Any]
    names: _Names
    named: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)

    def name_of(self, key: str) -> str | None:
        if key not in self.defs:
            return None
        name = self.named.get(key)
        if name is None:
            fingerprint = definition_fingerprint(self.defs, key)
            shared = self.names.shared
            name = shared.get(fingerprint) if fingerprint is not None else None
            if name is None:  # not declared by an earlier schema: declare it
                name = self.names.allocate(key)
                self.pending.append(key)
                if fingerprint is not None:
                    shared[fingerprint] = name
            self.named[key] = name
        return name


def render_typescript_sdk(tools: Sequence[SdkTool]) -> str:
    """The complete `tools:sdk` section for a TypeScript runtime. Byte-stable for equal input."""
    args_members: list[str] = []
    output_members: list[str] = []
    names = _Names()
    for tool in sdk_tools_in_order(tools):
        key = typescript_key(tool.name)
        doc = _doc_line(tool.description, 1)
        if doc is not None:
            args_members.append(doc)
        args_members.append(f"  {key}: {_root_type(tool.input_schema, names)};")
        output_members.append(f"  {key}: {_root_type(tool.output_schema, names)};")
    blocks = [
        JSON_VALUE_DECLARATION,
        *names.declarations,
        _interface("ToolArgsMap", args_members),
        _interface("ToolOutputMap", output_members),
        "type ToolName = keyof ToolOutputMap",
        _ERROR_CLASS,
        _TOOLS_CONST,
    ]
    code = "\n\n".join(blocks)
    return f"{INSTRUCTIONS}\n\n```ts\n{code}\n```"


def typescript_key(name: str) -> str:
    """A property key: bare when it is an ASCII identifier, otherwise a JSON string literal."""
    return name if _IDENTIFIER.fullmatch(name) else js_json_string(name)


def typescript_type(schema: object, indent: int = 0, refs: _RefScope | None = None) -> str:
    """The TypeScript type for a JSON schema; `unknown` where the schema makes no sense.

    `indent` is the nesting level (two spaces each) of the line the type starts on; object
    members are written one level deeper. Without `refs`, a `$ref` is `unknown`.
    """
    out: list[str] = []
    try:
        _emit_type(schema, indent, out, refs)
    except Exception:  # defensive: a bad schema must never break prompt assembly
        return "unknown"
    return "".join(out)


def _root_type(schema: object, names: _Names) -> str:
    """A tool-level type; declares the `$defs` entries it references (and theirs) in `names`."""
    defs = definitions_of(schema)
    if not defs:  # most schemas: no scope (a `$ref` renders `unknown` either way)
        return typescript_type(schema, 1)
    refs = _RefScope(defs, names)
    text = typescript_type(schema, 1, refs)
    done = 0
    while done < len(refs.pending):
        key = refs.pending[done]
        done += 1
        declared = typescript_type(refs.defs[key], 0, refs)
        names.declarations.append(f"type {refs.named[key]} = {declared}")
    return text


def _interface(name: str, members: list[str]) -> str:
    if not members:
        return f"interface {name} {{}}"
    body = "\n".join(members)
    return f"interface {name} {{\n{body}\n}}"


def _doc_line(description: str | None, indent: int) -> str | None:
    """A one-line JSDoc; `*/` is broken up so a description cannot close the comment early.

    A lone surrogate becomes the text `\\uXXXX` (the section must be valid UTF-8) and a
    description that collapses to nothing gets no JSDoc at all.
    """
    if description is None:
        return None
    if not description.isprintable():  # only then can it hold a lone surrogate
        description = escape_lone_surrogates(description)
    text = collapse_whitespace(description)
    if not text:
        return None
    return f"{'  ' * indent}/** {text.replace('*/', _ESCAPED_CLOSER)} */"


def _has_marks(text: str) -> int:
    return 1 if "|" in text or "&" in text else 0


def _literal(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return js_json_string(value)
    return js_number(value)


def _leaf_type(shape: Shape, refs: _RefScope | None) -> str | None:
    """The type of a node with nothing below it to walk; None for a container."""
    kind = shape.kind
    if kind is Kind.SCALAR:
        if shape.literals is None:
            return _BROAD_SCALAR[shape.scalar_type]
        return " | ".join(_literal(value) for value in shape.literals)
    if kind is Kind.ANY_JSON:
        return "JsonValue"
    if kind is Kind.UNKNOWN:
        return "unknown"
    if kind is Kind.ARRAY and not shape.children:
        return "JsonValue[]"
    if kind is Kind.OBJECT and not shape.properties:
        return "Record<string, never>" if shape.closed else "Record<string, JsonValue>"
    if kind is Kind.REF:
        name = refs.name_of(shape.ref) if refs is not None else None
        return "unknown" if name is None else name
    return None


def _emit_type(schema: object, indent: int, out: list[str], refs: _RefScope | None) -> None:
    """Append the type text for `schema` to `out`, walking with an explicit stack."""
    marks = 0  # emitted chunks containing `|` or `&`
    on_path: set[int] = set()  # ids of containers being rendered: a cycle renders `unknown`
    stack: list[tuple[Any, ...]] = [(_NODE, schema, indent, None)]
    while stack:
        task = stack.pop()
        tag = task[0]
        if tag == _TEXT:
            out.append(task[1])
            marks += task[2]
            continue
        if tag == _ARRAY_END:
            if marks > task[2]:
                out[task[1]] = "("
                out.append(")[]")
            else:
                out.append("[]")
            continue
        if tag == _LEAVE:
            on_path.discard(task[1])
            continue

        node, level = task[1], task[2]
        shape = task[3] or classify(node)
        leaf = _leaf_type(shape, refs)
        if leaf is not None:
            out.append(leaf)
            marks += _has_marks(leaf)
            continue
        if id(node) in on_path:
            out.append("unknown")
            continue
        on_path.add(id(node))
        stack.append((_LEAVE, id(node)))
        if shape.kind is Kind.ONE_OF:
            arms = shape.children
            for position in range(len(arms) - 1, -1, -1):
                stack.append((_NODE, arms[position], level, None))
                if position:
                    stack.append((_TEXT, " | ", 1))
        elif shape.kind is Kind.ARRAY:
            out.append("")  # becomes "(" if the item type turns out to hold `|` or `&`
            stack.append((_ARRAY_END, len(out) - 1, marks))
            stack.append((_NODE, shape.children[0], level, None))
        elif shape.kind is Kind.TUPLE:
            _push_tuple(shape, level, stack)
        else:
            _push_members(shape, level, stack, refs)


def _push_tuple(shape: Shape, level: int, stack: list[tuple[Any, ...]]) -> None:
    """Schedule `[A, B?, ...C[]]`: positions past `minItems` are optional, extras a rest."""
    tasks: list[tuple[Any, ...]] = [_text_task("[")]
    for position, item in enumerate(shape.children):
        if position:
            tasks.append(_text_task(", "))
        tasks.append((_NODE, item, level, None))
        if position >= shape.min_items:
            tasks.append(_text_task("?"))
    if not shape.closed:
        tasks.append(_text_task(", ..."))
        if shape.rest is True:
            tasks.append(_text_task("JsonValue[]"))
        else:
            # A fresh holder object gives the rest array its own identity for the cycle guard.
            holder = (shape.rest,)
            tasks.append((_NODE, holder, level, Shape(Kind.ARRAY, children=holder)))
    tasks.append(_text_task("]"))
    stack.extend(reversed(tasks))


def _push_members(
    shape: Shape, level: int, stack: list[tuple[Any, ...]], refs: _RefScope | None
) -> None:
    """Schedule `{ key?: T; … }`: runs of leaf members become one text chunk each."""
    tasks: list[tuple[Any, ...]] = []
    pending = ["{"]
    member_pad = "  " * (level + 1)
    required = shape.required
    for name, child in shape.properties.items():
        doc = _doc_line(description_of(child), level + 1)
        if doc is not None:
            pending += ("\n", doc)
        pending += ("\n", member_pad, typescript_key(name), "" if name in required else "?", ": ")
        child_shape = classify(child)
        leaf = _leaf_type(child_shape, refs)
        if leaf is not None:
            pending += (leaf, ";")
            continue
        tasks.append(_text_task("".join(pending)))
        tasks.append((_NODE, child, level + 1, child_shape))
        pending = [";"]
    pending += ("\n", "  " * level, "}")
    if not shape.closed:
        pending.append(_OPEN_SUFFIX)
    tasks.append(_text_task("".join(pending)))
    stack.extend(reversed(tasks))


def _text_task(text: str) -> tuple[Any, ...]:
    return (_TEXT, text, 1 if "|" in text or "&" in text else 0)
