"""The JSON Schema subset that tools may declare: the registration check and argument validation.

Supported keywords (everything else is refused at registration, so a constraint a provider
declared is never silently left unenforced):

- `type` (a name or a non-empty array of unique names: string number integer boolean null
  array object), `enum` (non-empty array), `const`, `oneOf`, `anyOf` (non-empty arrays of schemas);
- objects: `properties`, `required` (unique strings), `additionalProperties` (bool or schema);
- arrays: `items` (one schema; the draft-04 array form is refused), `prefixItems` (an array of
  schemas, one per position; `items` then applies only to the items after them, so
  `items: false` forbids extras), `minItems`, `maxItems`, `uniqueItems` (no two items equal
  by JSON equality);
- references: `$defs` (at the root only: an object of schemas) and `$ref`, which must be a
  local `#/$defs/<name>` naming an existing entry. A `$ref` applies its target next to its
  sibling keywords. A cycle of references that never descends into the value (`A` is
  `{"$ref": "#/$defs/A"}`, or reaches itself only through `oneOf`/`anyOf`/`$ref`) is refused:
  it could never finish. Recursion through `properties`/`items`/… is fine: it ends with the
  value. Validation also caps reference expansions per call (`MAX_REF_EXPANSIONS`), since
  references can fan a small schema out exponentially over a deep value;
- strings: `minLength`, `maxLength` (counted in code points), `pattern` (ECMA-262 as RE2 reads
  it, in linear time, searched anywhere in the string as JSON Schema specifies: see
  `registry_service.domain.patterns` for what RE2 refuses at registration);
- numbers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (numbers, not the
  draft-04 booleans);
- annotations, accepted and ignored: description title default examples format $schema $comment
  $id deprecated readOnly writeOnly, and OpenAPI's `discriminator` (pydantic emits it next to
  the `oneOf` of a tagged union; the `oneOf` alone already enforces the same rule).

Type rules: bool is never a number. `integer` accepts an int and also a float with an integral
value (JSON Schema defines `1.0` as an integer); length bounds likewise accept `2.0`. Equality
for `enum`/`const` is JSON equality: `1 == 1.0`, but `true != 1`, and object key order is
ignored.

A schema is an object or a boolean (`true` accepts anything, `false` nothing). Both functions
use explicit stacks, so schema and value depth are bounded by memory only.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

from codemode_wire.jsonvalue import JsonValue, JsonValueError, dumps
from registry_service.domain.patterns import PatternError, compile_pattern, pattern_matches

__all__ = [
    "MAX_MESSAGES",
    "MAX_REF_EXPANSIONS",
    "SchemaError",
    "check_schema",
    "format_invalid_args",
    "ref_name",
    "validate",
]

MAX_MESSAGES = 20
# Reference expansions one validation may make: a legitimate value needs about one per node of
# a recursive type (a 20 000-node tree), while a schema whose references fan out over a deep
# value is cut off after a fraction of a second of CPU instead of running exponentially.
MAX_REF_EXPANSIONS = 20_000
_REF_PREFIX = "#/$defs/"
_MAX_LISTING = 200  # characters of an enum listing or a const value kept in a message


class SchemaError(ValueError):
    """A schema outside the supported subset (the message names the keyword and its path)."""


# ---------------------------------------------------------------------------------------------
# check_schema
# ---------------------------------------------------------------------------------------------

_TYPE_NAMES = frozenset({"string", "number", "integer", "boolean", "null", "array", "object"})
_ANNOTATIONS = frozenset(
    {
        "description",
        "title",
        "default",
        "examples",
        "format",
        "$schema",
        "$comment",
        "$id",
        "deprecated",
        "readOnly",
        "writeOnly",
        "discriminator",
    }
)
_COUNTS = frozenset({"minItems", "maxItems", "minLength", "maxLength"})
_BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


def _pointer(parent: str, *tokens: str) -> str:
    """Extend a JSON Pointer fragment such as `#/properties/a`."""
    return parent + "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def _is_number(value: object) -> bool:
    return type(value) is int or type(value) is float


def _count(value: object) -> int | None:
    """A non-negative integer bound (`2` or `2.0`), else None."""
    if type(value) is int and value >= 0:
        return value
    if type(value) is float and value >= 0 and value.is_integer():
        return int(value)
    return None


def _check_keyword(
    key: str,
    arg: JsonValue,
    ptr: str,
    todo: list[tuple[JsonValue, str]],
    defs: dict[str, JsonValue],
) -> None:
    """Check one keyword's argument; queue the subschemas it holds."""
    where = _pointer(ptr, key)
    if key == "type":
        names = arg if type(arg) is list else [arg]
        if not names or any(type(n) is not str or n not in _TYPE_NAMES for n in names):
            raise SchemaError(
                f"type must be one of {' '.join(sorted(_TYPE_NAMES))}, "
                f"or a non-empty array of them, at {where}"
            )
        if len(set(map(str, names))) != len(names):
            raise SchemaError(f"type names must be unique at {where}")
    elif key == "enum":
        if type(arg) is not list or not arg:
            raise SchemaError(f"enum must be a non-empty array at {where}")
    elif key in ("oneOf", "anyOf"):
        if type(arg) is not list or not arg:
            raise SchemaError(f"{key} must be a non-empty array of schemas at {where}")
        todo.extend((sub, _pointer(where, str(i))) for i, sub in enumerate(arg))
    elif key == "properties":
        if type(arg) is not dict:
            raise SchemaError(f"properties must be an object of schemas at {where}")
        todo.extend((sub, _pointer(where, name)) for name, sub in arg.items())
    elif key == "required":
        if type(arg) is not list or any(type(n) is not str for n in arg):
            raise SchemaError(f"required must be an array of strings at {where}")
        if len(set(map(str, arg))) != len(arg):
            raise SchemaError(f"required names must be unique at {where}")
    elif key == "items" and type(arg) is list:
        raise SchemaError(f"items must be one schema (the array form is not supported) at {where}")
    elif key in ("additionalProperties", "items"):
        todo.append((arg, where))
    elif key == "prefixItems":
        if type(arg) is not list:
            raise SchemaError(f"prefixItems must be an array of schemas at {where}")
        todo.extend((sub, _pointer(where, str(i))) for i, sub in enumerate(arg))
    elif key == "uniqueItems":
        if type(arg) is not bool:
            raise SchemaError(f"uniqueItems must be a boolean at {where}")
    elif key == "$ref":
        _ref_target(arg, defs, where)
    elif key == "$defs":
        if ptr != "#":
            raise SchemaError(f"$defs is only supported at the root of a schema, at {where}")
        # Entries are queued by check_schema itself.
    elif key in _COUNTS:
        if _count(arg) is None:
            raise SchemaError(f"{key} must be a non-negative integer at {where}")
    elif key in _BOUNDS:
        if not _is_number(arg):
            raise SchemaError(f"{key} must be a number at {where}")
    elif key == "pattern":
        if type(arg) is not str:
            raise SchemaError(f"pattern must be a string at {where}")
        try:
            compile_pattern(arg)  # also fills the cache validation reads
        except PatternError as exc:
            raise SchemaError(f"pattern does not compile with RE2 ({exc}) at {where}") from None
    elif key != "const" and key not in _ANNOTATIONS:  # these two take any JSON value
        raise SchemaError(f'unsupported JSON Schema keyword "{key}" at {ptr}')


def check_schema(schema: JsonValue) -> None:
    """Raise SchemaError unless `schema` uses only the supported subset (see the module doc)."""
    try:
        dumps(schema)  # enum/const/default values must be lossless JSON too
    except JsonValueError as exc:
        raise SchemaError(f"schema is not lossless JSON: {exc}") from None
    defs: dict[str, JsonValue] = {}
    todo: list[tuple[JsonValue, str]] = [(schema, "#")]
    if type(schema) is dict and "$defs" in schema:
        entries = schema["$defs"]
        if type(entries) is not dict:
            raise SchemaError("$defs must be an object of schemas at #/$defs")
        defs = entries
        todo.extend((sub, _pointer("#/$defs", name)) for name, sub in entries.items())
    while todo:
        node, ptr = todo.pop()
        if type(node) is bool:
            continue
        if type(node) is not dict:
            raise SchemaError(f"a schema must be an object or a boolean, at {ptr}")
        for key, arg in node.items():
            _check_keyword(key, arg, ptr, todo, defs)
    _refuse_in_place_cycles(defs)


def _ref_target(ref: JsonValue, defs: dict[str, JsonValue], where: str) -> str:
    """The `$defs` entry a `$ref` names; refuses anything but an existing local entry."""
    name = ref_name(ref)
    if name is None:
        raise SchemaError(f"$ref must be a local reference #/$defs/<name>, at {where}")
    if name not in defs:
        raise SchemaError(f'$ref target "{ref}" is not defined in #/$defs, at {where}')
    return name


def ref_name(ref: JsonValue) -> str | None:
    """The `$defs` key of a well-formed local `$ref`, else None (used by the SDK renderers)."""
    if type(ref) is not str or not ref.startswith(_REF_PREFIX) or "/" in ref[len(_REF_PREFIX) :]:
        return None
    return ref[len(_REF_PREFIX) :].replace("~1", "/").replace("~0", "~")


def _refuse_in_place_cycles(defs: dict[str, JsonValue]) -> None:
    """Refuse a `$ref` cycle that applies to the same value forever (never descends into it).

    A definition refers to another "in place" through its own `$ref` and those of its
    `oneOf`/`anyOf` arms (recursively): those apply to the same value. Iterative DFS.
    """
    edges: dict[str, list[str]] = {}
    for name, node in defs.items():
        targets: list[str] = []
        nodes = [node]
        while nodes:
            current = nodes.pop()
            if type(current) is not dict:
                continue
            target = ref_name(current.get("$ref"))
            if target is not None:
                targets.append(target)
            for keyword in ("oneOf", "anyOf"):
                arms = current.get(keyword)
                if type(arms) is list:
                    nodes.extend(arms)
        edges[name] = targets
    done: set[str] = set()
    for start in defs:
        if start in done:
            continue
        on_path: set[str] = {start}
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(edges[start]))]
        while stack:
            name, pending = stack[-1]
            target = next(pending, None)
            if target is None:
                stack.pop()
                on_path.discard(name)
                done.add(name)
            elif target in on_path:
                where = _pointer("#/$defs", target)
                raise SchemaError(
                    f"$ref cycle at {where} never descends into the value (it would not end)"
                )
            elif target not in done:
                on_path.add(target)
                stack.append((target, iter(edges[target])))


# ---------------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------------

_ARTICLES = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
}
_SIMPLE_KEY = re.compile(r"[^.\[\]\"\\\s]+")
_PATH_HEAD, _PATH_TAIL = 3, 6  # segments of a deep path kept in a message
_MAX_KEY = 40  # characters of one property name kept in a message

# A value's location: (parent, key) links up to the root (None). Built per member in O(1);
# rendered only for a message that is kept.
_Path: TypeAlias = "tuple[_Path, str | int] | None"


def _is_type(value: JsonValue, name: str) -> bool:
    kind = type(value)
    if name == "string":
        return kind is str
    if name == "number":
        return kind is int or kind is float
    if name == "integer":
        return kind is int or (isinstance(value, float) and value.is_integer())
    if name == "boolean":
        return kind is bool
    if name == "null":
        return value is None
    if name == "array":
        return kind is list
    return kind is dict


def _json_equal(a: JsonValue, b: JsonValue) -> bool:
    """JSON equality (numbers by value, bool distinct from numbers), iterative."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        kx, ky = type(x), type(y)
        if kx in (int, float) and ky in (int, float):
            if x != y:
                return False
        elif kx is not ky:
            return False
        elif kx is list:
            assert isinstance(x, list) and isinstance(y, list)
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif kx is dict:
            assert isinstance(x, dict) and isinstance(y, dict)
            if x.keys() != y.keys():
                return False
            pending.extend((x[k], y[k]) for k in x)
        elif x != y:
            return False
    return True


def _shown(value: JsonValue, budget: int = _MAX_LISTING) -> str:
    text = dumps(value)
    return text if len(text) <= budget else text[: budget - 1] + "…"


def _listing(values: list[JsonValue]) -> str:
    parts: list[str] = []
    used = 2
    for value in values:
        text = _shown(value, 60)
        if used + len(text) + 1 > _MAX_LISTING:
            parts.append("…")
            break
        parts.append(text)
        used += len(text) + 1
    return "[" + ",".join(parts) + "]"


def _segment(key: str | int, first: bool) -> str:
    if isinstance(key, int):
        return f"[{key}]"
    if len(key) > _MAX_KEY:
        key = key[: _MAX_KEY - 1] + "…"
    if _SIMPLE_KEY.fullmatch(key):
        return key if first else "." + key
    return f"[{dumps(key)}]"


class _Later:
    """A message part computed only if the message is kept (formatting calls __str__)."""

    __slots__ = ("args", "func")

    def __init__(self, func: Callable[..., str], *args: object) -> None:
        self.func, self.args = func, args

    def __str__(self) -> str:
        return self.func(*self.args)


@dataclass(slots=True)
class _Sink:
    """Collects messages: formats and keeps the first `keep`, counts all."""

    keep: int
    root: str  # how messages name the root value
    messages: list[str] = field(default_factory=list)
    count: int = 0

    def add(self, path: _Path, template: str, *parts: object) -> None:
        """Report a violation at `path`; `{name}` in the template becomes the value's name."""
        self.count += 1
        if len(self.messages) < self.keep:
            self.messages.append(template.format(*parts, name=self.name(path)))

    def name(self, path: _Path) -> str:
        """`arguments` for the root, else the quoted path: `"config.items[2].name"`."""
        if path is None:
            return self.root
        keys: list[str | int] = []
        while path is not None:
            path, key = path
            keys.append(key)
        keys.reverse()
        parts = [_segment(key, i == 0) for i, key in enumerate(keys)]
        if len(parts) > _PATH_HEAD + _PATH_TAIL:
            parts[_PATH_HEAD:-_PATH_TAIL] = ["…"]
        return '"' + "".join(parts) + '"'


@dataclass(slots=True)
class _Check:
    schema: JsonValue
    value: JsonValue
    path: _Path
    sink: _Sink


@dataclass(slots=True)
class _Note:
    """A message that must come out at this point of the document order."""

    path: _Path
    template: str
    sink: _Sink


@dataclass(slots=True)
class _Combine:
    """Runs after the arms of a oneOf/anyOf have been checked into their own sinks."""

    keyword: str
    arms: list[_Sink]
    path: _Path
    sink: _Sink


@dataclass(slots=True)
class _Each:
    """The checks of a container's members, made one at a time as the walk reaches them: a
    million-item array costs one task, not a million objects alive at once (which also kept
    the garbage collector busy in full collections)."""

    members: Iterator[_Check | _Note]


_Task = _Check | _Note | _Combine | _Each


def validate(
    schema: JsonValue, value: JsonValue, *, root: str = "arguments", limit: int = MAX_MESSAGES
) -> list[str]:
    """Violations of `schema` (already accepted by `check_schema`) by `value`; [] when valid.

    Messages come in document order: for each value its own problems (type; else enum, const,
    length and number bounds, pattern, missing required properties in `required` order, then
    oneOf and anyOf), then its members in instance order (an undeclared property under
    `additionalProperties: false`, or the member's own violations) or its items. A type
    mismatch suppresses the other checks of that value. `root` names the value itself
    (`arguments must be an object`); members are named by their path, long paths and names
    shortened with `…`. After `limit` messages one more says how many were left out.
    """
    sink = _Sink(limit, root)
    defs = schema.get("$defs") if type(schema) is dict else None
    refs = _Refs(defs if type(defs) is dict else {})
    tasks: list[_Task] = [_Check(schema, value, None, sink)]
    while tasks:
        task = tasks.pop()
        if isinstance(task, _Each):
            member = next(task.members, None)
            if member is not None:
                tasks.append(task)  # the next member comes after this one and its own checks
                tasks.append(member)
        elif isinstance(task, _Note):
            task.sink.add(task.path, task.template)
        elif isinstance(task, _Combine):
            matched = sum(arm.count == 0 for arm in task.arms)
            if task.keyword == "oneOf" and matched != 1:
                how = "none" if matched == 0 else matched
                template = "{name} must match exactly one schema in oneOf (matched {0})"
                task.sink.add(task.path, template, how)
            elif task.keyword == "anyOf" and matched == 0:
                task.sink.add(task.path, "{name} must match at least one schema in anyOf")
        else:
            # Children run in document order: push them in reverse.
            tasks.extend(reversed(_check(task, refs)))
            if refs.expansions > MAX_REF_EXPANSIONS:
                sink.add(
                    None,
                    "validating {name} needs more than {0} $ref expansions "
                    "(the schema's references fan out too much)",
                    MAX_REF_EXPANSIONS,
                )
                break
    if sink.count > len(sink.messages):
        sink.messages.append(f"… and {sink.count - len(sink.messages)} more")
    return sink.messages


@dataclass(slots=True)
class _Refs:
    """The root's `$defs` and how many references this validation has followed."""

    defs: dict[str, JsonValue]
    expansions: int = 0


def _check(task: _Check, refs: _Refs) -> list[_Task]:
    """Apply one schema to one value: report its own problems, return the follow-up tasks."""
    schema, value, path, sink = task.schema, task.value, task.path, task.sink
    if schema is True or type(schema) is not dict:
        if schema is False:
            sink.add(path, "{name} is not allowed")
        return []
    follow: list[_Task] = []
    if "$ref" in schema:
        # The target applies in place, before this node's own keywords (document order).
        name = ref_name(schema["$ref"])
        if name is not None and name in refs.defs:
            refs.expansions += 1
            follow.append(_Check(refs.defs[name], value, path, sink))
    declared = schema.get("type")
    if declared is not None:
        names = declared if type(declared) is list else [declared]
        if not any(_is_type(value, str(n)) for n in names):
            words = [_ARTICLES.get(str(n), str(n)) for n in names]
            wanted = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
            sink.add(path, "{name} must be {0}", wanted)
            return []
    options = schema.get("enum")
    if type(options) is list and not any(_json_equal(value, o) for o in options):
        sink.add(path, "{name} must be one of {0}", _Later(_listing, options))
    if "const" in schema and not _json_equal(value, schema["const"]):
        sink.add(path, "{name} must equal {0}", _Later(_shown, schema["const"]))
    for keyword in ("oneOf", "anyOf"):
        arms = schema.get(keyword)
        if type(arms) is list:
            # Each arm reports into its own sink (counting only); the combine task runs after
            # all of them and before the member checks appended below.
            sinks = [_Sink(0, sink.root) for _ in arms]
            follow.extend(_Check(arm, value, path, s) for arm, s in zip(arms, sinks, strict=True))
            follow.append(_Combine(keyword, sinks, path, sink))
    if isinstance(value, str):
        _check_length(schema, len(value), "characters", path, sink)
        pattern = schema.get("pattern")
        if type(pattern) is str and not pattern_matches(pattern, value):
            sink.add(path, "{name} must match the pattern {0}", _Later(_shown, pattern))
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int | float):
        for keyword, holds, symbol in _COMPARISONS:
            bound = schema.get(keyword)
            if (
                isinstance(bound, int | float)
                and type(bound) is not bool
                and not holds(value, bound)
            ):
                sink.add(path, "{name} must be {0} {1}", symbol, _Later(_shown, bound))
    elif isinstance(value, list):
        _check_length(schema, len(value), "items", path, sink)
        if schema.get("uniqueItems") is True:
            _check_unique(value, path, sink)
        prefix = schema.get("prefixItems")
        prefix = prefix if type(prefix) is list else []
        items = schema.get("items", True)
        if value and (prefix or items is not True):
            follow.append(_Each(_array_members(value, prefix, items, path, sink)))
    elif isinstance(value, dict):
        follow.extend(_check_object(schema, value, path, sink))
    return follow


_COMPARISONS: tuple[tuple[str, Callable[[float, float], bool], str], ...] = (
    ("minimum", operator.ge, ">="),
    ("exclusiveMinimum", operator.gt, ">"),
    ("maximum", operator.le, "<="),
    ("exclusiveMaximum", operator.lt, "<"),
)
_LENGTH_KEYWORDS = {"items": ("minItems", "maxItems"), "characters": ("minLength", "maxLength")}


def _plural(count: int, unit: str) -> str:
    return unit[:-1] if count == 1 else unit


def _check_length(
    schema: dict[str, JsonValue], size: int, unit: str, path: _Path, sink: _Sink
) -> None:
    low, high = _LENGTH_KEYWORDS[unit]
    least, most = _count(schema.get(low)), _count(schema.get(high))
    if least is not None and size < least:
        sink.add(path, "{name} must have at least {0} {1}", least, _plural(least, unit))
    if most is not None and size > most:
        sink.add(path, "{name} must have at most {0} {1}", most, _plural(most, unit))


def _array_members(
    value: list[JsonValue], prefix: list[JsonValue], items: JsonValue, path: _Path, sink: _Sink
) -> Iterator[_Check]:
    """Position `i` is checked by `prefixItems[i]`; the items after the prefix by `items`."""
    for index, member in enumerate(value):
        schema = prefix[index] if index < len(prefix) else items
        if schema is not True:
            yield _Check(schema, member, (path, index), sink)


def _check_unique(value: list[JsonValue], path: _Path, sink: _Sink) -> None:
    """Report the first pair of equal items (JSON equality, via a canonical text per item)."""
    seen: dict[str, int] = {}
    for index, member in enumerate(value):
        first = seen.setdefault(_canonical(member), index)
        if first != index:
            template = "{name} must not contain duplicate items (items {0} and {1} are equal)"
            sink.add(path, template, first, index)
            return


def _canonical(value: JsonValue) -> str:
    """A text equal for JSON-equal values: numbers by value (`1` is `1.0`), keys sorted."""
    out: list[str] = []
    pending: list[JsonValue | _Text] = [value]
    while pending:
        node = pending.pop()
        if isinstance(node, _Text):
            out.append(node.text)
        elif type(node) is bool or node is None or type(node) is str:
            out.append(dumps(node))
        elif type(node) is int:
            out.append(str(node))
        elif type(node) is float:
            out.append(str(int(node)) if node.is_integer() else repr(node))
        elif type(node) is list:
            out.append("[")
            pending.append(_Text("]"))
            for index in range(len(node) - 1, -1, -1):
                pending.append(node[index])
                if index:
                    pending.append(_Text(","))
        elif type(node) is dict:
            out.append("{")
            pending.append(_Text("}"))
            keys = sorted(node)
            for index in range(len(keys) - 1, -1, -1):
                pending.extend((node[keys[index]], _Text(dumps(keys[index]) + ":")))
                if index:
                    pending.append(_Text(","))
    return "".join(out)


@dataclass(frozen=True, slots=True)
class _Text:
    """Literal text in `_canonical`'s work list (distinct from a JSON string value)."""

    text: str


def _check_object(
    schema: dict[str, JsonValue], value: dict[str, JsonValue], path: _Path, sink: _Sink
) -> list[_Task]:
    required = schema.get("required")
    if type(required) is list:
        for key in required:
            if type(key) is str and key not in value:
                sink.add((path, key), "missing required property {name}")
    properties = schema.get("properties")
    declared = properties if type(properties) is dict else {}
    extra = schema.get("additionalProperties", True)
    if not value or (extra is True and not declared):
        return []
    return [_Each(_members(value, declared, extra, path, sink))]


def _members(
    value: dict[str, JsonValue],
    declared: dict[str, JsonValue],
    extra: JsonValue,
    path: _Path,
    sink: _Sink,
) -> Iterator[_Check | _Note]:
    for key, member in value.items():
        where = (path, key)
        if key in declared:
            yield _Check(declared[key], member, where, sink)
        elif extra is False:
            template = "{name} is not a declared property (additionalProperties: false)"
            yield _Note(where, template, sink)
        elif extra is not True:
            yield _Check(extra, member, where, sink)


def format_invalid_args(messages: list[str]) -> str:
    """The registry's INVALID_ARGS error text."""
    return "invalid arguments: " + "; ".join(messages)
