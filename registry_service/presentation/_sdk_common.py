"""Helpers shared by the TypeScript and Python SDK renderers.

Schema nodes are read one level at a time through `classify`, so both renderers agree on what is
malformed and neither has to re-validate. Text helpers reproduce JavaScript's behaviour
(`JSON.stringify` quoting, `Number#toString`, `\\s`, UTF-16 ordering), so the SDK text spells
values as JavaScript would.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from decimal import Decimal
from itertools import repeat
from typing import Any, Final

from codemode_wire.jsonvalue import dumps
from registry_service.domain.jsonschema import ref_name
from registry_service.domain.tools import RUN_CODE
from registry_service.presentation.sdk_model import SdkTool

SCALAR_TYPES: Final = frozenset({"string", "number", "integer", "boolean", "null"})

# ECMAScript `\s` (WhiteSpace + LineTerminator). Python's own `\s` differs (it also matches
# U+001C..U+001F and U+0085 but not U+FEFF), which would change what gets collapsed vs escaped.
_JS_WHITESPACE_RUN: Final = re.compile(
    "[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+"
)
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_JSON_ESCAPED: Final = re.compile('["\\\\\x00-\x1f\ud800-\udfff]')
_JSON_SHORT_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def sdk_tools_in_order(tools: Sequence[SdkTool]) -> list[SdkTool]:
    """The tools a program may call, sorted like JavaScript sorts strings (UTF-16 code units).

    `run_code` is dropped even if a caller passes it: programs must never reach the transport.
    """
    callable_tools = [tool for tool in tools if tool.name != RUN_CODE]
    callable_tools.sort(key=lambda tool: utf16_sort_key(tool.name))
    return callable_tools


def utf16_sort_key(text: str) -> bytes:
    """Big-endian UTF-16 bytes compare exactly like the code-unit sequence does."""
    return text.encode("utf-16-be", "surrogatepass")


def cap_utf16(text: str, limit: int) -> str:
    """Keep at most `limit` UTF-16 units; a character that would be split in half is dropped.

    JavaScript's `slice` would leave a lone high surrogate there; it is dropped instead.
    """
    if text.isascii():
        return text[:limit]
    if len(text) <= limit // 2:
        return text
    units = 0
    for index, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > limit:
            return text[:index]
    return text


def join_surrogate_pairs(text: str) -> str:
    """Merge adjacent high+low surrogate code points into the character they encode.

    A JavaScript string holding such a pair is simply that character; a Python `str` keeps them
    as two code points that cannot be encoded as UTF-8. Unpaired ones stay as they are.
    """
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def escape_lone_surrogates(text: str) -> str:
    """Replace every unpaired surrogate with the six characters `\\uXXXX` (lower-case hex)."""
    text = join_surrogate_pairs(text)
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def collapse_whitespace(text: str) -> str:
    """Collapse every run of JavaScript whitespace to one space and trim the ends."""
    # Fast path: `isprintable` is False for every JS whitespace character except " ".
    if text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " ":
        return text
    return _JS_WHITESPACE_RUN.sub(" ", text).strip(" ")


def js_json_string(text: str) -> str:
    """`JSON.stringify(text)` as modern JavaScript prints it.

    Non-ASCII stays literal; `"`, `\\`, C0 controls and lone surrogates are escaped, so the result
    is a valid string literal in JSON, TypeScript and Python alike, and valid UTF-8.
    """
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'  # common case: nothing to escape (controls and surrogates are Cc/Cs)
    text = join_surrogate_pairs(text)
    return '"' + _JSON_ESCAPED.sub(_json_escape, text) + '"'


def _json_escape(match: re.Match[str]) -> str:
    char = match.group()
    return _JSON_SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"


def js_number(value: int | float) -> str:
    """`String(value)` for a finite JSON number, following ECMAScript `Number::toString`.

    Integers are printed with their exact digits: the schema holds the exact value, and a
    TypeScript parser reads the literal back to the same double JavaScript would have held.
    """
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"
    sign, digit_tuple, exponent = Decimal(repr(value)).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    assert isinstance(exponent, int)  # finite by contract
    # value = 0.digits × 10**point (ECMAScript's n); k = len(digits)
    point = len(digit_tuple) + exponent
    k = len(digits)
    prefix = "-" if sign else ""
    if k <= point <= 21:
        return prefix + digits + "0" * (point - k)
    if 0 < point <= 21:
        return prefix + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return prefix + "0." + "0" * -point + digits
    shown = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{prefix}{shown}e{'+' if point - 1 >= 0 else '-'}{abs(point - 1)}"


def python_number(value: int | float) -> str:
    """A Python literal for a finite JSON number; integral values print their exact digits."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer():
        return str(int(value))
    return js_number(value)  # JavaScript's spelling; always a valid Python literal


def description_of(node: object) -> str | None:
    """The node's `description` when it is a string; anything else documents nothing."""
    if isinstance(node, dict):
        description = node.get("description")
        if isinstance(description, str):
            return description
    return None


class Kind(enum.Enum):
    """What a schema node renders as."""

    UNKNOWN = "unknown"  # malformed or unsupported: `unknown` / `Any`
    ANY_JSON = "any"  # no `type` and no `oneOf`: any JSON value
    ONE_OF = "oneOf"  # also `anyOf`: either way the value has one of the arms' types
    SCALAR = "scalar"
    ARRAY = "array"
    TUPLE = "tuple"  # `prefixItems`: one type per position
    OBJECT = "object"
    REF = "ref"  # `$ref` to `#/$defs/<name>`: rendered as that definition's declared name


Scalar = str | int | float | bool | None


_NO_PROPERTIES: Final[dict[str, Any]] = {}


class Shape:
    """One schema node, read and checked but with its children left unread. Read-only."""

    __slots__ = ("children", "closed", "kind", "literals", "properties", "required", "scalar_type")

    # Only `$ref` and tuple nodes have these (`_RefOrTupleShape`): keeping them out of every
    # other node's slots keeps the common node as cheap to build as it was before they existed
    # (a shape is built for most nodes of every SDK render).
    ref: str  # for REF: the `$defs` key
    rest: Any  # for an open TUPLE: the schema of the items after the prefix
    min_items: int  # for TUPLE: how many leading positions are required

    def __init__(
        self,
        kind: Kind,
        *,
        scalar_type: str = "",
        literals: tuple[Scalar, ...] | None = None,
        children: tuple[Any, ...] = (),
        properties: dict[str, Any] = _NO_PROPERTIES,
        required: frozenset[str] = frozenset(),
        closed: bool = False,
    ) -> None:
        self.kind = kind
        self.scalar_type = scalar_type  # for SCALAR: one of SCALAR_TYPES
        self.literals = literals  # from `const`/`enum`; None = unconstrained
        self.children = children  # `oneOf` arms, the single `items` schema, tuple positions
        self.properties = properties  # the schema's own dict: never mutated
        self.required = required
        self.closed = closed  # objects: additionalProperties false; tuples: no extra items


class _RefOrTupleShape(Shape):
    __slots__ = ("min_items", "ref", "rest")

    def __init__(
        self,
        kind: Kind,
        *,
        children: tuple[Any, ...] = (),
        closed: bool = False,
        ref: str = "",
        rest: Any = None,
        min_items: int = 0,
    ) -> None:
        super().__init__(kind, children=children, closed=closed)
        self.ref = ref
        self.rest = rest
        self.min_items = min_items


UNKNOWN_SHAPE: Final = Shape(Kind.UNKNOWN)
ANY_JSON_SHAPE: Final = Shape(Kind.ANY_JSON)
ARRAY_ANY_ITEMS_SHAPE: Final = Shape(Kind.ARRAY)
_ABSENT: Final = object()
_COMPOSITE_KEYS: Final = frozenset({"$ref", "oneOf", "anyOf"})
_LITERAL_KEYS: Final = frozenset({"const", "enum"})
_BROAD_SCALAR_SHAPES: Final = {name: Shape(Kind.SCALAR, scalar_type=name) for name in SCALAR_TYPES}


def classify(node: object) -> Shape:
    """Read one schema node. Never raises; anything it cannot make sense of is UNKNOWN.

    Supported subset: one scalar `type`, `const`/`enum` of matching scalars,
    `array` + `items`, `object` + `properties`/`required`/`additionalProperties`, `oneOf`, and
    annotation-only nodes (any JSON). Keywords outside the subset (`format`, `minimum`, …) only
    narrow a value, so they are ignored and the rendered type stays a faithful superset.
    A malformed node degrades on its own (`unknown` / `Any`); its siblings keep their types.
    """
    if not isinstance(node, dict):
        return UNKNOWN_SHAPE
    schema_type = node.get("type", _ABSENT)
    # This runs for every node of every SDK render: one C-level test keeps the rare keywords
    # (and the literal ones below) off the common path, a tenth of a 500-tool render.
    if not _COMPOSITE_KEYS.isdisjoint(node):
        return _classify_composite(node, schema_type)
    if schema_type is _ABSENT:
        return ANY_JSON_SHAPE
    if not isinstance(schema_type, str):
        return UNKNOWN_SHAPE
    broad = _BROAD_SCALAR_SHAPES.get(schema_type)
    if broad is not None:
        if not _LITERAL_KEYS.isdisjoint(node):
            return _classify_literals(node, schema_type)
        return broad
    if schema_type == "object":
        return _classify_object(node)
    if schema_type == "array":
        if "prefixItems" in node:
            return _classify_tuple(node)
        if "items" not in node:
            return ARRAY_ANY_ITEMS_SHAPE
        return Shape(Kind.ARRAY, children=(node["items"],))
    return UNKNOWN_SHAPE


def _classify_composite(node: dict[Any, Any], schema_type: object) -> Shape:
    """A node with `$ref`, `oneOf` or `anyOf` (in that precedence)."""
    if "$ref" in node:  # siblings only annotate or narrow the target
        name = ref_name(node["$ref"])
        return UNKNOWN_SHAPE if name is None else _RefOrTupleShape(Kind.REF, ref=name)
    arms = node["oneOf"] if "oneOf" in node else node["anyOf"]
    if schema_type is not _ABSENT or not isinstance(arms, list) or not arms:
        return UNKNOWN_SHAPE
    return Shape(Kind.ONE_OF, children=tuple(arms))


def _classify_tuple(node: dict[Any, Any]) -> Shape:
    prefix = node["prefixItems"]
    if not isinstance(prefix, list) or not prefix:
        return UNKNOWN_SHAPE
    rest = node.get("items", True)
    most = _count_of(node.get("maxItems"))
    least = _count_of(node.get("minItems")) or 0
    closed = rest is False or (most is not None and most <= len(prefix))
    required = min(least, len(prefix))
    return _RefOrTupleShape(
        Kind.TUPLE, children=tuple(prefix), closed=closed, rest=rest, min_items=required
    )


def _count_of(value: object) -> int | None:
    """A malformed bound counts as absent: the rendered type stays a superset."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return None
    return int(value) if math.isfinite(value) else None


MAX_FINGERPRINT_NODES: Final = 5000


def definition_fingerprint(defs: dict[str, Any], key: str) -> str | None:
    """A text equal for two `$defs` entries that declare the same type, so two schemas sharing
    a definition (pydantic repeats `Point` in every tool that uses it) declare it once: the
    key and every entry it reaches through `$ref`, as JSON. None when that is not JSON or is
    too large to compare cheaply (the entry is then declared on its own)."""
    reached = {key}
    nodes: list[Any] = [defs[key]]
    visited = 0
    while nodes:
        node = nodes.pop()
        visited += 1
        if visited > MAX_FINGERPRINT_NODES:
            return None
        if isinstance(node, dict):
            name = ref_name(node.get("$ref"))
            if name is not None and name in defs and name not in reached:
                reached.add(name)
                nodes.append(defs[name])
            nodes.extend(node.values())
        elif isinstance(node, list):
            nodes.extend(node)
    try:
        return dumps([key, {name: defs[name] for name in sorted(reached)}])
    except Exception:  # not lossless JSON: never shared
        return None


def definitions_of(root: object) -> dict[str, Any]:
    """The root's `$defs` when it is an object, else none."""
    if isinstance(root, dict):
        defs = root.get("$defs")
        if isinstance(defs, dict):
            return defs
    return {}


def _classify_object(node: dict[Any, Any]) -> Shape:
    properties = node.get("properties", _NO_PROPERTIES)
    if not isinstance(properties, dict) or not all(map(isinstance, properties, repeat(str))):
        return UNKNOWN_SHAPE
    required = node.get("required")
    # A malformed `required` makes nothing required: still a superset of the intended type.
    if not isinstance(required, list):
        names: frozenset[str] = frozenset()
    elif all(map(isinstance, required, repeat(str))):
        names = frozenset(required)
    else:
        names = frozenset(name for name in required if isinstance(name, str))
    return Shape(
        Kind.OBJECT,
        properties=properties,
        required=names,
        closed=node.get("additionalProperties") is False,
    )


def _classify_literals(node: dict[Any, Any], schema_type: str) -> Shape:
    if "const" in node:
        value = node["const"]
        if not scalar_matches(schema_type, value):
            return UNKNOWN_SHAPE
        return Shape(Kind.SCALAR, scalar_type=schema_type, literals=(value,))
    values = node["enum"]
    if not isinstance(values, list) or not values or not _all_match(schema_type, values):
        return UNKNOWN_SHAPE
    return Shape(Kind.SCALAR, scalar_type=schema_type, literals=tuple(values))


def _all_match(schema_type: str, values: list[Any]) -> bool:
    if schema_type == "string":  # the common case, checked without a Python-level loop
        return all(map(isinstance, values, repeat(str)))
    return all(scalar_matches(schema_type, value) for value in values)


def scalar_matches(schema_type: str, value: object) -> bool:
    """Whether `value` is a lossless JSON scalar of `schema_type` (bools are not numbers)."""
    if schema_type == "string":
        return isinstance(value, str)
    if schema_type == "boolean":
        return isinstance(value, bool)
    if schema_type == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float) and math.isfinite(value):
        return schema_type == "number" or value.is_integer()
    return False
