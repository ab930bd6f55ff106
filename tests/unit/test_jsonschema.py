"""The supported JSON Schema subset: the registration check and argument validation messages."""

from __future__ import annotations

import pytest

from codemode_wire.jsonvalue import JsonValue, loads
from registry_service.domain.jsonschema import (
    MAX_MESSAGES,
    SchemaError,
    check_schema,
    format_invalid_args,
    validate,
)


def _chain(depth: int, keyword: str, leaf: JsonValue) -> JsonValue:
    schema = leaf
    for _ in range(depth):
        schema = {keyword: [schema]}
    return schema


# ---------------------------------------------------------------------------------------------
# check_schema
# ---------------------------------------------------------------------------------------------

SUPPORTED: list[JsonValue] = [
    True,
    False,
    {},
    {"type": "string"},
    {"type": ["string", "null"]},
    {"type": "integer", "minimum": 0, "exclusiveMaximum": 10.5},
    {"type": "number", "maximum": -1, "exclusiveMinimum": -(2**80)},
    {"type": "string", "minLength": 1, "maxLength": 2.0, "pattern": "^[a-z]+$", "format": "x"},
    {"type": "array", "items": {"type": "integer"}, "minItems": 0, "maxItems": 3},
    {"type": "array", "items": False},
    {"enum": [1, "a", None, [1], {"k": 2}]},
    {"const": {"deep": [1, 2]}},
    {"oneOf": [{"type": "string"}, {"type": "null"}]},
    {"anyOf": [True, {"const": 1}]},
    {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b/c~d": {}},
        "required": ["a"],
        "additionalProperties": False,
    },
    {"type": "object", "additionalProperties": {"type": "number"}},
    {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:x",
        "$comment": "c",
        "title": "t",
        "description": "d",
        "default": {"x": 1},
        "examples": [1, 2],
        "deprecated": True,
        "readOnly": False,
        "writeOnly": False,
    },
    {"properties": {"enum": {"const": "keyword names are fine as property names"}}},
]


@pytest.mark.parametrize("schema", SUPPORTED)
def test_supported_schemas(schema: JsonValue) -> None:
    check_schema(schema)


def test_deep_schemas_are_checked_iteratively() -> None:
    check_schema(_chain(5000, "oneOf", {"type": "string"}))
    nested: JsonValue = {"type": "string"}
    for _ in range(5000):
        nested = {"type": "object", "properties": {"p": nested}}
    check_schema(nested)
    with pytest.raises(SchemaError, match=r'"not" at #(/oneOf/0){5000}$'):
        check_schema(_chain(5000, "oneOf", {"not": {}}))


REFUSED: list[tuple[JsonValue, str]] = [
    ({"$ref": "#/definitions/x"}, "$ref must be a local reference #/$defs/<name>, at #/$ref"),
    ({"allOf": [{}]}, 'unsupported JSON Schema keyword "allOf" at #'),
    ({"not": {}}, 'unsupported JSON Schema keyword "not" at #'),
    ({"if": {}, "then": {}}, 'unsupported JSON Schema keyword "if" at #'),
    ({"$defs": []}, "$defs must be an object of schemas at #/$defs"),
    (
        {"properties": {"a": {"patternProperties": {}}}},
        'unsupported JSON Schema keyword "patternProperties" at #/properties/a',
    ),
    (
        {"properties": {"a/b": {"items": {"contains": {}}}}},
        'unsupported JSON Schema keyword "contains" at #/properties/a~1b/items',
    ),
    (
        {"anyOf": [{}, {"oneOf": [{"minProperties": 1}]}]},
        'unsupported JSON Schema keyword "minProperties" at #/anyOf/1/oneOf/0',
    ),
    (
        {"additionalProperties": {"dependentRequired": {}}},
        '"dependentRequired" at #/additionalProperties',
    ),
    ("string", "a schema must be an object or a boolean, at #"),
    (None, "a schema must be an object or a boolean, at #"),
    ({"properties": {"a": "string"}}, "a schema must be an object or a boolean, at #/properties/a"),
    ({"items": [{}, {}]}, "items must be one schema (the array form is not supported) at #/items"),
    (
        {"additionalProperties": 1},
        "a schema must be an object or a boolean, at #/additionalProperties",
    ),
    ({"type": "str"}, "type must be one of array boolean integer null number object string"),
    ({"type": []}, "type must be one of"),
    ({"type": ["string", "string"]}, "type names must be unique at #/type"),
    ({"type": [1]}, "type must be one of"),
    ({"enum": []}, "enum must be a non-empty array at #/enum"),
    ({"enum": "a"}, "enum must be a non-empty array at #/enum"),
    ({"oneOf": []}, "oneOf must be a non-empty array of schemas at #/oneOf"),
    ({"anyOf": {}}, "anyOf must be a non-empty array of schemas at #/anyOf"),
    ({"properties": []}, "properties must be an object of schemas at #/properties"),
    ({"required": "a"}, "required must be an array of strings at #/required"),
    ({"required": ["a", 1]}, "required must be an array of strings at #/required"),
    ({"required": ["a", "a"]}, "required names must be unique at #/required"),
    ({"minItems": -1}, "minItems must be a non-negative integer at #/minItems"),
    ({"maxLength": 1.5}, "maxLength must be a non-negative integer at #/maxLength"),
    ({"minLength": True}, "minLength must be a non-negative integer at #/minLength"),
    ({"minimum": "1"}, "minimum must be a number at #/minimum"),
    ({"exclusiveMaximum": True}, "exclusiveMaximum must be a number at #/exclusiveMaximum"),
    ({"pattern": 5}, "pattern must be a string at #/pattern"),
    (
        {"pattern": "(unclosed"},
        "pattern does not compile with RE2 (missing ): (unclosed) at #/pattern",
    ),
    # ECMA-262 features RE2 cannot match in linear time are refused at registration.
    (
        {"properties": {"p": {"pattern": "^(?=a)"}}},
        "pattern does not compile with RE2 (invalid perl operator: (?=) at #/properties/p/pattern",
    ),
    ({"pattern": "(a)\\1"}, "pattern does not compile with RE2 (invalid escape sequence: \\1)"),
    ({"pattern": "(?<!a)b"}, "pattern does not compile with RE2 (invalid perl operator: (?<!)"),
    ({"const": float("nan")}, "schema is not lossless JSON: not lossless JSON at $.const: NaN"),
    ({"enum": [(1, 2)]}, "schema is not lossless JSON"),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("schema", "message"), REFUSED)
def test_refused_schemas_name_keyword_and_path(schema: JsonValue, message: str) -> None:
    with pytest.raises(SchemaError) as info:
        check_schema(schema)
    assert message in str(info.value)


def test_schema_error_is_a_value_error() -> None:
    assert issubclass(SchemaError, ValueError)


# ---------------------------------------------------------------------------------------------
# validate: messages
# ---------------------------------------------------------------------------------------------

CASES: list[tuple[JsonValue, JsonValue, list[str]]] = [
    # (schema, value, messages)
    ({"type": "object"}, [], ["arguments must be an object"]),
    ({"type": "object"}, {}, []),
    (True, {"anything": [1]}, []),
    (False, 1, ["arguments is not allowed"]),
    ({"properties": {"x": False}}, {"x": 1}, ['"x" is not allowed']),
    ({"properties": {"x": {"type": "string"}}}, {"x": 1}, ['"x" must be a string']),
    ({"properties": {"x": {"type": "string"}}}, {"y": 1}, []),
    ({"properties": {"x": {"type": "number"}}}, {"x": "1"}, ['"x" must be a number']),
    ({"properties": {"x": {"type": "number"}}}, {"x": True}, ['"x" must be a number']),
    ({"properties": {"x": {"type": "integer"}}}, {"x": 1.5}, ['"x" must be an integer']),
    ({"properties": {"x": {"type": "integer"}}}, {"x": False}, ['"x" must be an integer']),
    ({"properties": {"x": {"type": "integer"}}}, {"x": 2.0}, []),
    ({"properties": {"x": {"type": "integer"}}}, {"x": 10**30}, []),
    ({"properties": {"x": {"type": "boolean"}}}, {"x": 0}, ['"x" must be a boolean']),
    ({"properties": {"x": {"type": "null"}}}, {"x": 0}, ['"x" must be null']),
    ({"properties": {"x": {"type": "array"}}}, {"x": {}}, ['"x" must be an array']),
    (
        {"properties": {"x": {"type": ["string", "null"]}}},
        {"x": 1},
        ['"x" must be a string or null'],
    ),
    (
        {"properties": {"x": {"type": ["string", "integer", "array"]}}},
        {"x": 1.5},
        ['"x" must be a string, an integer or an array'],
    ),
    ({"properties": {"x": {"type": ["string", "null"]}}}, {"x": None}, []),
    ({"required": ["description"]}, {}, ['missing required property "description"']),
    (
        {"required": ["b", "a"]},
        {"c": 1},
        ['missing required property "b"', 'missing required property "a"'],
    ),
    (
        {"properties": {"config": {"required": ["name"]}}},
        {"config": {}},
        ['missing required property "config.name"'],
    ),
    ({"properties": {"x": {"enum": [1, "a"]}}}, {"x": 2}, ['"x" must be one of [1,"a"]']),
    ({"properties": {"x": {"enum": [1, "a"]}}}, {"x": 1.0}, []),  # JSON equality: 1 == 1.0
    ({"properties": {"x": {"enum": [1]}}}, {"x": True}, ['"x" must be one of [1]']),
    ({"properties": {"x": {"enum": [False]}}}, {"x": 0}, ['"x" must be one of [false]']),
    ({"enum": [{"a": 1, "b": [1, 2]}]}, {"b": [1, 2], "a": 1}, []),  # key order is irrelevant
    ({"enum": [{"a": 1}]}, {"a": 1, "b": 2}, ['arguments must be one of [{"a":1}]']),
    ({"enum": [[1, 2]]}, [2, 1], ["arguments must be one of [[1,2]]"]),
    ({"const": "abc"}, "abd", ['arguments must equal "abc"']),
    ({"const": None}, None, []),
    (
        {"additionalProperties": False},
        {"k": 1},
        ['"k" is not a declared property (additionalProperties: false)'],
    ),
    (
        {"properties": {"a": {}}, "additionalProperties": False},
        {"a": 1, "k": 2},
        ['"k" is not a declared property (additionalProperties: false)'],
    ),
    (
        {"properties": {"c": {"properties": {"a": {}}, "additionalProperties": False}}},
        {"c": {"zz": 1}},
        ['"c.zz" is not a declared property (additionalProperties: false)'],
    ),
    ({"additionalProperties": {"type": "number"}}, {"a": 1, "b": "x"}, ['"b" must be a number']),
    (
        {"properties": {"n": {"minimum": 1, "maximum": 3}}},
        {"n": 0},
        ['"n" must be >= 1'],
    ),
    ({"properties": {"n": {"maximum": 3}}}, {"n": 3.5}, ['"n" must be <= 3']),
    ({"properties": {"n": {"exclusiveMinimum": 0}}}, {"n": 0}, ['"n" must be > 0']),
    ({"properties": {"n": {"exclusiveMaximum": 2.5}}}, {"n": 2.5}, ['"n" must be < 2.5']),
    ({"properties": {"n": {"minimum": 2**53}}}, {"n": 2**53 + 1}, []),  # exact big ints
    (
        {"properties": {"n": {"maximum": 2**53}}},
        {"n": 2**53 + 1},
        ['"n" must be <= 9007199254740992'],
    ),
    ({"properties": {"n": {"minimum": 5}}}, {"n": "3"}, []),  # bounds only apply to numbers
    ({"properties": {"s": {"minLength": 2}}}, {"s": "a"}, ['"s" must have at least 2 characters']),
    ({"properties": {"s": {"minLength": 1}}}, {"s": ""}, ['"s" must have at least 1 character']),
    ({"properties": {"s": {"maxLength": 1}}}, {"s": "😀"}, []),  # code points, not UTF-16 units
    ({"properties": {"s": {"maxLength": 1}}}, {"s": "ab"}, ['"s" must have at most 1 character']),
    ({"properties": {"s": {"pattern": "b+"}}}, {"s": "abba"}, []),  # search, not full match
    # ECMA-262 semantics, as RE2 has them: `\uXXXX` escapes, ASCII `\d`, `$` only at the end.
    ({"properties": {"s": {"pattern": "^[\\u0041-\\u005A]+$"}}}, {"s": "ABC"}, []),
    ({"properties": {"s": {"pattern": "^\\uD83D\\uDE00$"}}}, {"s": "😀"}, []),
    (
        {"properties": {"s": {"pattern": "^\\d$"}}},
        {"s": "٣"},
        ['"s" must match the pattern "^\\\\d$"'],
    ),
    ({"properties": {"s": {"pattern": "^a$"}}}, {"s": "a\n"}, ['"s" must match the pattern "^a$"']),
    ({"properties": {"s": {"pattern": "x"}}}, {"s": "\ud800x"}, []),  # a lone surrogate is fine
    (
        {"properties": {"s": {"pattern": "^(a+)+$"}}},
        {"s": "a" * 40 + "!"},
        ['"s" must match the pattern "^(a+)+$"'],
    ),
    (
        {"properties": {"s": {"pattern": "^b+$"}}},
        {"s": "abba"},
        ['"s" must match the pattern "^b+$"'],
    ),
    ({"properties": {"l": {"minItems": 2}}}, {"l": [1]}, ['"l" must have at least 2 items']),
    ({"properties": {"l": {"maxItems": 1}}}, {"l": [1, 2]}, ['"l" must have at most 1 item']),
    (
        {"properties": {"l": {"items": {"type": "string"}}}},
        {"l": ["a", 1, "b", None]},
        ['"l[1]" must be a string', '"l[3]" must be a string'],
    ),
    ({"items": {"type": "integer"}}, [1, "x"], ['"[1]" must be an integer']),
    (
        {"properties": {"k": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
        {"k": 1},
        ['"k" must match exactly one schema in oneOf (matched 2)'],
    ),
    (
        {"properties": {"k": {"oneOf": [{"type": "integer"}, {"type": "string"}]}}},
        {"k": 1.5},
        ['"k" must match exactly one schema in oneOf (matched none)'],
    ),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "x", []),
    (
        {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        None,
        ["arguments must match at least one schema in anyOf"],
    ),
    ({"anyOf": [{"type": "integer"}, {"type": "number"}]}, 1, []),
    (
        {"oneOf": [{"required": ["a"]}, {"required": ["b"]}], "anyOf": [{"required": ["c"]}]},
        {},
        [
            "arguments must match exactly one schema in oneOf (matched none)",
            "arguments must match at least one schema in anyOf",
        ],
    ),
    # A type mismatch stands alone: the value's other keywords do not pile on.
    ({"type": "string", "enum": ["a"], "minLength": 3}, 5, ["arguments must be a string"]),
    ({"format": "email", "description": "ignored annotations"}, "not an email", []),
]


@pytest.mark.parametrize(("schema", "value", "messages"), CASES)
def test_validation_messages(schema: JsonValue, value: JsonValue, messages: list[str]) -> None:
    check_schema(schema)
    assert validate(schema, value) == messages


def test_nested_paths_and_document_order() -> None:
    schema = loads(
        """{
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "description": {"type": "string"},
            "config": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "items": {"type": "array", "items": {
                        "type": "object", "properties": {"name": {"type": "string"}}}}
                }
            },
            "mode": {"enum": [1, "a"]}
        },
        "required": ["code", "description"],
        "additionalProperties": false
    }"""
    )
    check_schema(schema)
    value = loads(
        '{"mode": 2, "config": {"items": [{}, {"name": "ok"}, {"name": 3}]}, "code": 1, "zz": 0}'
    )
    assert validate(schema, value) == [
        'missing required property "description"',
        '"mode" must be one of [1,"a"]',
        'missing required property "config.name"',
        '"config.items[2].name" must be a string',
        '"code" must be a string',
        '"zz" is not a declared property (additionalProperties: false)',
    ]
    assert format_invalid_args(validate(schema, value)[:2]) == (
        'invalid arguments: missing required property "description"; "mode" must be one of [1,"a"]'
    )


def test_validation_is_deterministic() -> None:
    schema: JsonValue = {"additionalProperties": {"type": "string"}}
    value: JsonValue = {f"k{i}": i for i in range(10)}
    assert validate(schema, value) == validate(schema, value)
    assert validate(schema, value)[0] == '"k0" must be a string'


def test_odd_property_names_are_quoted_in_paths() -> None:
    schema: JsonValue = {"properties": {"a.b": {"properties": {"c d": {"type": "string"}}}}}
    assert validate(schema, {"a.b": {"c d": 1}}) == ['"["a.b"]["c d"]" must be a string']


def test_messages_are_capped() -> None:
    schema: JsonValue = {"items": {"type": "string"}}
    messages = validate(schema, list(range(50)))
    assert len(messages) == MAX_MESSAGES + 1
    assert messages[0] == '"[0]" must be a string'
    assert messages[MAX_MESSAGES - 1] == '"[19]" must be a string'
    assert messages[-1] == "… and 30 more"
    assert validate(schema, list(range(3)), limit=2) == [
        '"[0]" must be a string',
        '"[1]" must be a string',
        "… and 1 more",
    ]
    assert len(validate(schema, list(range(MAX_MESSAGES)))) == MAX_MESSAGES


def test_messages_are_bounded_in_length() -> None:
    options: list[JsonValue] = [f"option-{i:03d}-" + "x" * 20 for i in range(100)]
    message = validate({"enum": options}, "nope")[0]
    assert message.startswith('arguments must be one of ["option-000-')
    assert message.endswith(",…]")
    assert len(message) < 260
    huge = "y" * 10_000
    message = validate({"const": huge}, "z")[0]
    assert message.startswith('arguments must equal "yyy') and message.endswith("…")
    assert len(message) < 260
    long_key = "k" * 500
    message = validate({"additionalProperties": False}, {long_key: 1})[0]
    assert message == f'"{"k" * 39}…" is not a declared property (additionalProperties: false)'


def test_root_name_can_be_chosen() -> None:
    assert validate({"type": "object"}, 1, root="result") == ["result must be an object"]


def test_deep_schema_and_value_validate_iteratively() -> None:
    assert validate(_chain(5000, "oneOf", {"type": "string"}), "s") == []
    assert validate(_chain(5000, "oneOf", {"type": "string"}), 1) == [
        "arguments must match exactly one schema in oneOf (matched none)"
    ]
    assert validate(_chain(5000, "anyOf", True), None) == []
    deep_value: JsonValue = "leaf"
    deep_schema: JsonValue = {"type": "integer"}
    for _ in range(5000):
        deep_value = [deep_value]
        deep_schema = {"type": "array", "items": deep_schema}
    [message] = validate(deep_schema, deep_value)
    assert message == '"[0][0][0]…[0][0][0][0][0][0]" must be an integer'


def test_deep_enum_values_compare_iteratively() -> None:
    def nest(depth: int, leaf: JsonValue) -> JsonValue:
        value = leaf
        for _ in range(depth):
            value = [value]
        return value

    schema: JsonValue = {"enum": [nest(20_000, 1)]}
    check_schema(schema)
    assert validate(schema, nest(20_000, 1.0)) == []
    [message] = validate(schema, nest(20_000, 2))
    assert message.startswith("arguments must be one of [[[[") and message.endswith("…]")


def test_format_invalid_args() -> None:
    assert (
        format_invalid_args(['"x" must be a string']) == 'invalid arguments: "x" must be a string'
    )
    assert format_invalid_args(["a", "b", "c"]) == "invalid arguments: a; b; c"
