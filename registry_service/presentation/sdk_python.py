"""The Python `tools:sdk` section: usage instructions plus a typed stub of every tool.

Object schemas become named `TypedDict` classes (nested classes first), tools become members
of a `Tools` protocol. Each `$defs` entry a schema references is declared once, after the
classes of that schema: a `TypedDict` named after the entry, or a `TypeAlias` for any other
type; references (recursive ones included) use that name, so cycles cost nothing.

`prefixItems` tuples become `list[A | B]`, not `tuple[A, B]`: a program must pass JSON values,
and the bridge refuses a Python tuple, so the stub must not ask for one (results arrive as
lists too).

Schemas are walked with an explicit stack; each class body is collected in its own buffer and
published when its last field is done, which puts nested classes before their parents without
recursion.

Identifier rules use `str.isidentifier()` (Unicode XID_Start/XID_Continue as known to this
Python's Unicode database) where JavaScript would use `\\p{XID_…}`; the two Unicode
versions may differ for recently assigned characters, which only moves such a name between
attribute access and subscript access.
"""

from __future__ import annotations

import keyword
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from registry_service.presentation._sdk_common import (
    Kind,
    Shape,
    cap_utf16,
    classify,
    collapse_whitespace,
    definition_fingerprint,
    definitions_of,
    description_of,
    join_surrogate_pairs,
    js_json_string,
    python_number,
    sdk_tools_in_order,
)
from registry_service.presentation.sdk_model import SdkTool

INSTRUCTIONS: Final = """\
## Writing code for run_code

`run_code` takes two required arguments: `code`, the body of an async Python function \
(top-level `await` and `return` work), and `description`, a short summary of what the program \
does. When the program runs, exactly two of the names declared below exist: `tools` and \
`ToolCallError`. Everything else is a static stub that only describes shapes; in particular \
the `TypedDict` classes do NOT exist at run time, so build arguments as plain `dict`/`list` \
JSON values — `await tools.name({"field": 1})` — and never `FooArgs(field=1)`, which raises \
`NameError`. In the program:

- Call a tool with `await tools.name(args)`; a name that is exotic, reserved or starts with an \
underscore needs subscript access, e.g. `await tools["my-tool"](args)`. Each call resolves to \
that tool's canonical JSON value, typed by the method's return annotation below. Arguments \
must be lossless JSON.
- A call that fails raises `ToolCallError`: `toolName` says which tool failed and the message \
explains why in plain words. Wrap calls in `try`/`except` to handle a failure and carry on.
- Independent read-only calls MAY overlap under `asyncio.gather`: calls that are safe to \
overlap run concurrently, while a mutating call runs on its own, in the order it was \
submitted. Use `await` to sequence work that depends on an earlier result.
- Produce output with `print(...)` and/or a top-level `return <value>`; the returned value must \
be lossless JSON. Only what the program prints or returns is its output; tool results you do \
not pass on never reach the conversation, so keep just what you need. Images from successful \
tool calls are attached after the run.

The available tools:"""

MAX_CLASS_NAME_BASE: Final = 120  # UTF-16 units: keeps names (and total text) linear in depth
MAX_LIST_NESTING: Final = 180  # CPython's tokenizer refuses more than 200 open brackets

_TYPING_ORDER: Final = ("Any", "Literal", "NotRequired", "Protocol", "TypeAlias", "TypedDict")
_HARD_KEYWORDS: Final = frozenset(keyword.kwlist) | {"__debug__"}  # soft keywords stay usable
_FIXED_NAMES: Final = frozenset({"ToolCallError", "Tools", "tools", *_TYPING_ORDER})
_BROAD_SCALAR: Final = {"string": "str", "number": "float", "integer": "int", "boolean": "bool"}
_ASCII_WORD_BREAK: Final = re.compile(r"[^A-Za-z0-9]+")
_UNPRINTABLE: Final = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_OPEN_NOTE: Final = "\n    # Additional keys beyond those declared are allowed."
_ERROR_CLASS: Final = "class ToolCallError(Exception):\n    toolName: str"

# Stack task tags.
_NODE: Final = 0
_TEXT: Final = 1
_CLASS_END: Final = 2
_LEAVE: Final = 3


def render_python_sdk(
    tools: Sequence[SdkTool], *, instructions: str = INSTRUCTIONS, error_class: str = _ERROR_CLASS
) -> str:
    """The complete `tools:sdk` section for a Python runtime. Byte-stable for equal input.

    `instructions` and `error_class`: the text before the stub and the stub's declaration of
    `ToolCallError`, for a Python dialect that shares the stub (`sdk_monty.py`)."""
    state = _RenderState()
    state.typing.add("Protocol")
    members: list[str] = []
    methods = 0
    for tool in sdk_tools_in_order(tools):
        base = camel_case(tool.name)
        args = _render_root(tool.input_schema, f"{base}Args", state)
        output = _render_root(tool.output_schema, f"{base}Output", state)
        if is_bare_tool_name(tool.name):
            members.extend(_method(tool, args, output))
            methods += 1
        else:
            members.append(f"    # tools[{js_json_string(tool.name)}](args: {args}) -> {output}")
            description = describe(tool.description)
            if description:
                members.append(f"    #   {description}")
    if not methods:
        members.insert(0, "    pass")  # comments alone are not a class body
    imports = ", ".join(symbol for symbol in _TYPING_ORDER if symbol in state.typing)
    blocks = [f"from typing import {imports}", error_class, *state.classes]
    blocks.append("class Tools(Protocol):\n" + "\n".join(members))
    blocks.append("tools: Tools")
    code = "\n\n".join(blocks)
    return f"{instructions}\n\n```python\n{code}\n```"


def python_type(schema: object) -> str:
    """A context-free Python type for a JSON schema (objects degrade to `dict[str, Any]`)."""
    return _render_root(schema, "", _RenderState(), named=False)


def is_bare_tool_name(name: str) -> bool:
    """Whether `tools.<name>` works: a normalized identifier, no hard keyword, no leading `_`."""
    return (
        name.isidentifier()
        and not name.startswith("_")
        and name not in _HARD_KEYWORDS
        and (name.isascii() or unicodedata.is_normalized("NFKC", name))
    )


def is_typeddict_field(name: str) -> bool:
    """Whether `name` can be a class-syntax `TypedDict` field naming exactly that JSON key.

    A `__private` name would be mangled to `_Class__private`, so it is refused like a keyword.
    """
    return (
        name.isidentifier()
        and name not in _HARD_KEYWORDS
        and not (name.startswith("__") and not name.endswith("__"))
        and (name.isascii() or unicodedata.is_normalized("NFKC", name))
    )


def camel_case(raw: str) -> str:
    """`read_file` → `ReadFile`; words split on underscores and non-identifier characters.

    The result is NFKC-normalized (as Python normalizes identifiers) and gets a `Tool` prefix
    when it would not start with an identifier-start character.
    """
    words = _ASCII_WORD_BREAK.split(raw) if raw.isascii() else _unicode_words(raw)
    joined = "".join(word[0].upper() + word[1:] for word in words if word)
    if not joined.isascii():
        joined = unicodedata.normalize("NFKC", joined)
    if not joined or joined[0] == "_" or not joined[0].isidentifier():
        return f"Tool{joined}"
    return joined


def describe(description: str | None) -> str | None:
    """One printable line: whitespace collapsed, controls as `\\xNN`, lone surrogates `\\uNNNN`."""
    if description is None:
        return None
    if description.isprintable():  # nothing to escape; at most spaces to collapse
        return collapse_whitespace(description) or None
    text = collapse_whitespace(join_surrogate_pairs(description))
    return _UNPRINTABLE.sub(_escape_unprintable, text) or None


def _escape_unprintable(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}"


def _unicode_words(raw: str) -> list[str]:
    words: list[str] = []
    start = 0
    for index, char in enumerate(raw):
        if char == "_" or not ("a" + char).isidentifier():
            words.append(raw[start:index])
            start = index + 1
    words.append(raw[start:])
    return words


def _method(tool: SdkTool, args: str, output: str) -> list[str]:
    signature = f"    async def {tool.name}(self, args: {args}) -> {output}:"
    description = describe(tool.description)
    if not description:
        return [f"{signature} ..."]
    # The docstring must be the method's first statement, so it goes below the signature.
    escaped = description.replace("\\", "\\\\").replace('"', '\\"')
    return [signature, f'        """{escaped}"""']


@dataclass(slots=True)
class _RenderState:
    """Everything one SDK render accumulates across tools."""

    classes: list[str] = field(default_factory=list)
    used_names: set[str] = field(default_factory=lambda: set(_FIXED_NAMES))
    next_suffix: dict[str, int] = field(default_factory=dict)
    typing: set[str] = field(default_factory=set)
    field_names_ok: dict[str, bool] = field(default_factory=dict)  # field names repeat a lot
    refs: _RefScope | None = None  # the `$defs` of the schema being rendered
    shared: dict[str, str] = field(default_factory=dict)  # definition fingerprint → name

    def allocate(self, base: str) -> str:
        """A class name unique in this render: the capped base, else base2, base3, …"""
        capped = _cap(base)
        name = capped
        if name in self.used_names:
            suffix = self.next_suffix.get(capped, 2)
            while f"{capped}{suffix}" in self.used_names:
                suffix += 1
            name = f"{capped}{suffix}"
            self.next_suffix[capped] = suffix + 1
        self.used_names.add(name)
        return name


@dataclass(slots=True)
class _RefScope:
    """One root schema's `$defs`: the name given to each referenced entry, and which entries
    still need their declaration."""

    defs: dict[str, Any]
    names: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    allocated: list[str] = field(default_factory=list)  # names this scope introduced
    shared: list[str] = field(default_factory=list)  # fingerprints this scope introduced


def _ref_type(key: str, state: _RenderState) -> str | None:
    """The declared name of `$defs[key]`, allocated on first use; None for a missing entry."""
    refs = state.refs
    if refs is None or key not in refs.defs:
        return None
    name = refs.names.get(key)
    if name is None:
        fingerprint = definition_fingerprint(refs.defs, key)
        name = state.shared.get(fingerprint) if fingerprint is not None else None
        if name is None:  # not declared by an earlier schema: declare it after this one
            name = state.allocate(camel_case(key))
            refs.allocated.append(name)
            refs.pending.append(key)
            if fingerprint is not None:
                state.shared[fingerprint] = name
                refs.shared.append(fingerprint)
        refs.names[key] = name
    return name


def _cap(base: str) -> str:
    if not base.isascii() and not unicodedata.is_normalized("NFKC", base):
        base = unicodedata.normalize("NFKC", base)
    return cap_utf16(base, MAX_CLASS_NAME_BASE)


def _render_root(schema: object, base: str, state: _RenderState, *, named: bool = True) -> str:
    """Render one tool-level schema; on any internal failure, roll back and answer `Any`."""
    classes_before = len(state.classes)
    allocated: list[str] = []
    typing_before = set(state.typing)
    out: list[str] = []
    # Most schemas have no `$defs`: no scope then (a `$ref` renders `Any` either way).
    defs = definitions_of(schema) if named else None
    state.refs = _RefScope(defs) if defs else None
    try:
        _emit_type(schema, base, state, out, named=named, allocated=allocated)
        _declare_definitions(state, allocated)
    except Exception:  # defensive: a bad schema must never break prompt assembly
        del state.classes[classes_before:]
        state.used_names.difference_update(allocated)
        if state.refs is not None:
            state.used_names.difference_update(state.refs.allocated)
            for fingerprint in state.refs.shared:
                del state.shared[fingerprint]
        state.typing = typing_before | {"Any"}
        return "Any"
    finally:
        state.refs = None
    return "".join(out)


def _declare_definitions(state: _RenderState, allocated: list[str]) -> None:
    """Declare every referenced `$defs` entry once (declaring one may reference more)."""
    refs = state.refs
    if refs is None:  # a context-free render declares nothing
        return
    done = 0
    while done < len(refs.pending):
        key = refs.pending[done]
        done += 1
        name = refs.names[key]
        node = refs.defs[key]
        shape = classify(node)
        if shape.kind is Kind.OBJECT and _is_declarable(shape, state.field_names_ok):
            _emit_type(node, name, state, [], named=True, allocated=allocated, declare=name)
        else:
            out: list[str] = []
            _emit_type(node, name, state, out, named=True, allocated=allocated)
            state.typing.add("TypeAlias")
            state.classes.append(f"{name}: TypeAlias = {''.join(out)}")


def _emit_type(
    schema: object,
    base: str,
    state: _RenderState,
    out: list[str],
    *,
    named: bool,
    allocated: list[str],
    declare: str | None = None,
) -> None:
    """Append the type expression for `schema` to `out`; publish classes into `state`.

    With `declare`, `schema` is a declarable object published as the class of that name.
    """
    on_path: set[int] = set()  # ids of containers being rendered: a cycle renders `Any`
    stack: list[tuple[Any, ...]] = []
    if declare is None:
        stack.append((_NODE, schema, base, 0, out, None))
    else:
        _push_class(classify(schema), declare, state, stack)
    while stack:
        task = stack.pop()
        tag = task[0]
        if tag == _TEXT:
            task[1].append(task[2])
            continue
        if tag == _CLASS_END:
            state.classes.append("".join(task[1]))
            continue
        if tag == _LEAVE:
            on_path.discard(task[1])
            continue

        _, node, class_base, depth, buf, shape = task
        if shape is None:
            shape = classify(node)
        leaf = _leaf_type(shape, depth, named, state)
        if leaf is not None:
            buf.append(leaf)
            continue
        if id(node) in on_path:
            state.typing.add("Any")
            buf.append("Any")
            continue
        on_path.add(id(node))
        stack.append((_LEAVE, id(node)))
        if shape.kind is Kind.ONE_OF:
            arms = shape.children
            union_base = _resolve(class_base)
            for position in range(len(arms) - 1, -1, -1):
                arm_base = _cap(f"{union_base}{position + 1}")
                stack.append((_NODE, arms[position], arm_base, depth, buf, None))
                if position:
                    stack.append((_TEXT, buf, " | "))
        elif shape.kind is Kind.TUPLE:
            buf.append("list[")
            stack.append((_TEXT, buf, "]"))
            items = shape.children
            for position in range(len(items) - 1, -1, -1):
                item_base = _cap(f"{_resolve(class_base)}{position + 1}")
                stack.append((_NODE, items[position], item_base, depth + 1, buf, None))
                if position:
                    stack.append((_TEXT, buf, " | "))
        elif shape.kind is Kind.ARRAY:
            # Items are named after the array itself (`ParentField`, not `ParentFieldItem`).
            buf.append("list[")
            stack.append((_TEXT, buf, "]"))
            stack.append((_NODE, shape.children[0], class_base, depth + 1, buf, None))
        else:
            name = state.allocate(_resolve(class_base))
            allocated.append(name)
            state.typing.add("TypedDict")
            buf.append(name)
            _push_class(shape, name, state, stack)


def _resolve(class_base: str | tuple[str, str]) -> str:
    """A class-name base; a field's is kept as (parent, field) until a class actually needs it."""
    if isinstance(class_base, str):
        return class_base
    parent, field_name = class_base
    return _cap(f"{parent}{camel_case(field_name)}")


def _leaf_type(shape: Shape, depth: int, named: bool, state: _RenderState) -> str | None:
    """The whole type when it needs no walk below this node; None for a container to walk."""
    kind = shape.kind
    if kind is Kind.SCALAR:
        if shape.scalar_type == "null":
            return "None"
        if shape.literals is None:
            return _BROAD_SCALAR[shape.scalar_type]
        state.typing.add("Literal")
        return f"Literal[{', '.join(_literal(value) for value in shape.literals)}]"
    if kind is Kind.ONE_OF:
        return None
    if kind is Kind.ARRAY:
        if shape.children and depth < MAX_LIST_NESTING:
            return None
        state.typing.add("Any")
        return "list[Any]" if not shape.children else "Any"
    if kind is Kind.OBJECT and named and _is_declarable(shape, state.field_names_ok):
        return None
    if kind is Kind.REF:
        name = _ref_type(shape.ref, state) if named else None
        if name is not None:
            return name
        state.typing.add("Any")
        return "Any"
    if kind is Kind.TUPLE:
        # A closed tuple is a list of its position types; with extras allowed, any list.
        if shape.closed and depth < MAX_LIST_NESTING:
            return None
        state.typing.add("Any")
        return "list[Any]"
    state.typing.add("Any")
    return "dict[str, Any]" if kind is Kind.OBJECT else "Any"


def _is_declarable(shape: Shape, known: dict[str, bool]) -> bool:
    """Whether an object can be a TypedDict (else it degrades to `dict[str, Any]`)."""
    if not shape.properties:
        return shape.closed  # an open empty object is just any dict
    for name in shape.properties:
        ok = known.get(name)
        if ok is None:
            ok = known[name] = is_typeddict_field(name)
        if not ok:
            return False
    return True


def _push_class(shape: Shape, name: str, state: _RenderState, stack: list[tuple[Any, ...]]) -> None:
    """Schedule class `name`: runs of leaf fields become one text chunk, containers are walked.

    The class text is published (after any classes its fields declared) by the last task.
    """
    body: list[str] = []
    tasks: list[tuple[Any, ...]] = []
    pending = [f"class {name}(TypedDict):"]
    required = shape.required
    for field_name, child in shape.properties.items():
        description = describe(description_of(child))
        if description:
            pending += ("\n    # ", description)
        pending += ("\n    ", field_name, ": ")
        optional = field_name not in required
        if optional:
            state.typing.add("NotRequired")
            pending.append("NotRequired[")
        # A field annotation starts a fresh line; depth 1 reserves the `NotRequired[` bracket.
        child_shape = classify(child)
        leaf = _leaf_type(child_shape, 1, True, state)
        if leaf is not None:
            pending += (leaf, "]") if optional else (leaf,)
            continue
        tasks.append((_TEXT, body, "".join(pending)))
        tasks.append((_NODE, child, (name, field_name), 1, body, child_shape))
        pending = ["]"] if optional else []
    if not shape.closed:
        pending.append(_OPEN_NOTE)
    elif not shape.properties:
        pending.append("\n    pass")
    tasks.append((_TEXT, body, "".join(pending)))
    tasks.append((_CLASS_END, body))
    stack.extend(reversed(tasks))


def _literal(value: Any) -> str:
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, str):
        return js_json_string(value)
    return python_number(value)
