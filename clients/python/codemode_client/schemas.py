"""JSON Schemas for tools derived from Python type hints, with pydantic.

class ReadArgs(TypedDict):
    path: str
    limit: NotRequired[int]

input_schema_for(ReadArgs)   # {"type": "object", "properties": {...}, "required": ["path"]}
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_args, get_origin

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
    is absent (or a bare `ToolOutput`, or an output hinted `Any`)."""
    argument, output = hinted_types(handler)
    input_schema = schema_for(argument) if argument is not None else None
    output_schema = schema_for(output) if output is not None and output is not Any else None
    return input_schema, output_schema


def hinted_types(handler: Callable[..., Any]) -> tuple[Any, Any]:
    """(the first parameter's hint, the return hint or `ToolOutput[X]`'s X); None when absent."""
    # The signature's annotations, evaluated: also for a callable object or a partial.
    signature = inspect.signature(handler, eval_str=True)
    params = list(signature.parameters.values())
    empty = inspect.Parameter.empty
    argument = params[0].annotation if params and params[0].annotation is not empty else None
    output = signature.return_annotation
    output = None if output is empty else type(None) if output is None else output
    if output is ToolOutput:
        output = None
    elif get_origin(output) is ToolOutput:
        output = get_args(output)[0]
    return argument, output
