"""JSON Schemas for tools derived from Python type hints, with pydantic.

class ReadArgs(TypedDict):
    path: str
    limit: NotRequired[int]

input_schema_for(ReadArgs)   # {"type": "object", "properties": {...}, "required": ["path"]}
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_args, get_origin, get_type_hints

from pydantic import TypeAdapter

from codemode_client.results import ToolOutput
from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue


def schema_for(annotation: Any) -> JsonValue:
    """The JSON Schema of a type (TypedDict, pydantic model, dataclass, builtin...)."""
    # Nested types come out as root `$defs` with local `$ref`s, which the registry accepts.
    schema = TypeAdapter(annotation).json_schema()
    schema.pop("title", None)
    return jsonvalue.snapshot(schema)


def hinted_schemas(handler: Callable[..., Any]) -> tuple[JsonValue, JsonValue]:
    """(input, output) schemas from the hints of `async def tool(args: Args, ctx) -> Result`.

    `-> ToolOutput[Result]` types the output's value as `Result`. Either is None when the hint
    is absent (or a bare `ToolOutput`)."""
    hints = get_type_hints(handler)
    params = list(inspect.signature(handler).parameters)
    input_schema = schema_for(hints[params[0]]) if params and params[0] in hints else None
    output = hints.get("return")
    if output is ToolOutput:
        output = None
    elif get_origin(output) is ToolOutput:
        output = get_args(output)[0]
    output_schema = schema_for(output) if output is not None and output is not Any else None
    return input_schema, output_schema
