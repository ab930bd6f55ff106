"""How a `ToolProvider` calls a handler: its signature checked once when the tool is declared,
its arguments parsed into the hinted type, a sync body run off the event loop, a returned model
serialized.

    async def forecast(args: City, ctx) -> Temp       # City, Temp: pydantic models,
    def forecast(args: City) -> Temp                  # dataclasses or TypedDicts; ctx optional
    async def ping() -> str                           # no arguments at all

A handler takes the arguments, then optionally the `InvocationContext` (positional parameters
beyond those need defaults; `*args` takes both). What cannot be called that way is refused at
declaration with a `TypeError` naming the tool, not at the first call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from codemode_client.errors import ToolError
from codemode_client.invocation import InvocationContext
from codemode_client.results import ToolOutput
from codemode_client.schemas import hinted_types, schema_for
from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue

INVALID_ARGS = "INVALID_ARGS"  # the registry's code for arguments its schema refuses
_SHOWN_ERRORS = 10  # validation errors named in one message; the rest are counted
# Arguments up to this size are decoded and validated on the event loop; larger ones in the
# provider's threads (they take long enough to stall every other call of the provider).
_ON_LOOP_BYTES = 64 * 1024

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class PreparedHandler:
    tool: str
    handler: Callable[..., Any]
    is_async: bool
    arity: int
    """How many of (args, ctx) it takes: 0, 1 or 2."""
    arguments: TypeAdapter[Any] | None
    """Parses the arguments into the hinted type (None: no hint, or `Any`; passed as decoded)."""
    returns: TypeAdapter[Any] | None
    """Serializes a return that is not plain JSON (None: no hint)."""
    input_schema: JsonValue
    output_schema: JsonValue

    async def call(self, arguments_json: str, ctx: Any, executor: Executor) -> Any:
        """The handler's return for these arguments. Raises `ToolError` (`INVALID_ARGS`) for
        arguments the hinted type refuses, and whatever the handler raises."""
        loop = asyncio.get_running_loop()
        if not self.is_async:
            returned = await loop.run_in_executor(executor, self._call_sync, arguments_json, ctx)
        else:
            if len(arguments_json) <= _ON_LOOP_BYTES:
                args = self.parse(arguments_json)
            else:
                args = await loop.run_in_executor(executor, self.parse, arguments_json)
            returned = await self.handler(*(args, ctx)[: self.arity])
        if inspect.isawaitable(returned):  # a sync callable that returns a coroutine
            returned = await returned
        return returned

    def _call_sync(self, arguments_json: str, ctx: Any) -> Any:
        return self.handler(*(self.parse(arguments_json), ctx)[: self.arity])

    def parse(self, arguments_json: str) -> Any:
        decoded = jsonvalue.loads(arguments_json or "{}")
        if self.arguments is None:
            return decoded
        try:
            return self.arguments.validate_python(decoded)
        except ValidationError as exc:
            raise ToolError(_invalid_args(exc), INVALID_ARGS) from None

    def serialized(self, returned: Any) -> Any:
        """`returned` with its models made JSON (through the return hint, else a model's or
        dataclass's own type); None when there is nothing to serialize it with."""
        if isinstance(returned, ToolOutput):
            if not returned.has_value:
                return None
            value = self.serialized(returned.value)
            return None if value is None else dataclasses.replace(returned, value=value)
        if self.returns is not None:
            return self.returns.dump_python(returned, mode="json", warnings="error")
        if isinstance(returned, BaseModel):
            return returned.model_dump(mode="json")
        if dataclasses.is_dataclass(returned) and not isinstance(returned, type):
            return _own_adapter(type(returned)).dump_python(returned, mode="json")
        return None


@functools.lru_cache(maxsize=64)
def _own_adapter(cls: type) -> TypeAdapter[Any]:
    """A returned dataclass's adapter (building one is costly; a handler returns one type)."""
    return TypeAdapter(cls)


def prepare(
    tool: str,
    handler: Callable[..., Any],
    input_schema: JsonValue = None,
    output_schema: JsonValue = None,
) -> PreparedHandler:
    """Checks that `handler` can serve `tool` and how to call it; raises TypeError naming the
    tool and what is wrong. Schemas not given come from the hints."""
    where = f"tool {tool!r}"
    if not callable(handler):
        raise TypeError(f"{where}: the handler {handler!r} is not callable")
    if inspect.isasyncgenfunction(handler) or inspect.isgeneratorfunction(handler):
        raise TypeError(f"{where}: the handler is a generator; a tool returns one value")
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: the handler's signature cannot be read: {exc}") from None
    arity = _arity(where, signature)
    try:
        argument_type, return_type = hinted_types(handler)
    except Exception as exc:  # an unresolvable forward reference, say
        raise TypeError(f"{where}: the handler's type hints cannot be resolved: {exc}") from None
    if arity == 0:
        argument_type = None
    elif argument_type is InvocationContext:
        raise TypeError(
            f"{where}: the handler's first parameter is hinted InvocationContext, but it gets "
            "the arguments; a handler takes (args, ctx), (args) or ()"
        )
    arguments = _adapter(where, "arguments", argument_type)
    returns = _adapter(where, "return", return_type)
    if input_schema is None and argument_type is not None:
        input_schema = schema_for(argument_type)
    if output_schema is None and returns is not None:
        output_schema = schema_for(return_type)
    return PreparedHandler(
        tool=tool,
        handler=handler,
        is_async=_is_async(handler),
        arity=arity,
        arguments=arguments,
        returns=returns,
        input_schema=input_schema,
        output_schema=output_schema,
    )


def _arity(where: str, signature: inspect.Signature) -> int:
    positional = 0
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return 2
        if parameter.kind in _POSITIONAL:
            if positional == 2 and parameter.default is inspect.Parameter.empty:
                raise TypeError(
                    f"{where}: the handler's parameter {parameter.name!r} has no default; a "
                    "handler takes (args, ctx), (args) or ()"
                )
            positional += 1
        elif (
            parameter.kind is inspect.Parameter.KEYWORD_ONLY
            and parameter.default is inspect.Parameter.empty
        ):
            raise TypeError(
                f"{where}: the handler's keyword-only parameter {parameter.name!r} has no "
                "default; a handler takes (args, ctx), (args) or ()"
            )
    return min(positional, 2)


def _is_async(handler: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    # An object with `async def __call__`.
    return inspect.iscoroutinefunction(getattr(type(handler), "__call__", None))  # noqa: B004


def _adapter(where: str, what: str, hint: Any) -> TypeAdapter[Any] | None:
    if hint is None or hint is Any:
        return None
    try:
        return TypeAdapter(hint)
    except Exception as exc:  # pydantic cannot validate or serialize the type
        raise TypeError(
            f"{where}: the {what} hint {hint!r} is not a type pydantic can use: {exc}"
        ) from None


def _invalid_args(exc: ValidationError) -> str:
    # The registry's wording for arguments its schema refuses (registry_service/domain/
    # jsonschema.py): the field's quoted path, then what is wrong; never the value itself.
    errors = exc.errors(include_url=False, include_input=False)
    shown = [f"{_path(error['loc'])}: {error['msg']}" for error in errors[:_SHOWN_ERRORS]]
    if len(errors) > _SHOWN_ERRORS:
        shown.append(f"and {len(errors) - _SHOWN_ERRORS} more")
    return "invalid arguments: " + "; ".join(shown)


def _path(loc: tuple[int | str, ...]) -> str:
    if not loc:
        return "arguments"
    text = ""
    for key in loc:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return f'"{text}"'
