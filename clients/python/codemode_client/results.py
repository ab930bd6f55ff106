"""Rich tool results: content blocks, additional contexts and concluding the model's turn.

A provider's handler returns a plain JSON value, or a `ToolOutput` to say more:

    @provider.tool()
    async def screenshot(args: ShotArgs, ctx) -> ToolOutput[Shot]:
        png = await browser.screenshot(args["url"])
        return ToolOutput(
            value={"width": 640, "height": 480},  # what a program gets
            content=[TextContent("The page:"), ImageContent(png, "image/png")],  # the model's
            additional_contexts=[AdditionalContext([TextContent("Cookies accepted.")], "browser")],
            concludes_turn=True,
        )

How the registry reads a `ToolOutput`:

- `value` is the call's JSON value: what a `run_code` program's `await tools.x(...)` returns. It
  is checked against the tool's output schema (`ToolOutput[Shot]` derives it from `Shot`, like a
  plain `-> Shot`); a value that breaks it, or is not lossless JSON, fails the call with
  `INVALID_TOOL_OUTPUT`.
- `content` is what the model is shown. Without it the registry renders `value` as pretty JSON.
  Without a `value` the result is content only: no schema check, and a program gets `None`.
  With neither, the model sees empty content.
- A program never sees content; but when a call it makes succeeds with an image in its content,
  that whole content is forwarded to the conversation (an additional context of `run_code`).
- `additional_contexts` are messages added to the conversation after the result; `source` says
  who produced them (free text).
- `concludes_turn` asks the agent loop to end the model's turn after this result (only successes
  can; a nested call's request carries over to its `run_code` call).

Failures are not outputs: raise `ToolFailed`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.jsonvalue import JsonValue
from codemode_wire.text import has_lone_surrogate


@dataclass(frozen=True)
class TextContent:
    """Plain text for the model."""

    text: str


@dataclass(frozen=True)
class ImageContent:
    """An image: raw bytes and their IANA media type, e.g. `image/png`."""

    data: bytes
    mime_type: str


@dataclass(frozen=True)
class JsonContent:
    """A JSON document for the model (sent as lossless JSON text)."""

    value: JsonValue


ContentBlock = TextContent | ImageContent | JsonContent


@dataclass(frozen=True)
class AdditionalContext:
    """A message to add to the conversation after the tool result."""

    content: Sequence[ContentBlock]
    source: str = ""
    """Who produced the context (free text, e.g. a plugin name)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "content", tuple(self.content))  # immutable, compares by value


class _Unset(enum.Enum):
    UNSET = "UNSET"


T = TypeVar("T")


@dataclass(frozen=True)
class ToolOutput(Generic[T]):
    """What a tool handler may return instead of a plain value (see the module docstring).

    `ToolOutput(value=None)` is a JSON null value; leaving `value` out means content only."""

    value: T | Literal[_Unset.UNSET] = _Unset.UNSET
    content: Sequence[ContentBlock] = ()
    additional_contexts: Sequence[AdditionalContext] = ()
    concludes_turn: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "content", tuple(self.content))
        object.__setattr__(self, "additional_contexts", tuple(self.additional_contexts))

    @property
    def has_value(self) -> bool:
        return self.value is not _Unset.UNSET


# -- to and from the wire ----------------------------------------------------------------------


def _string(text: object, where: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{where} is {type(text).__name__}, not str")
    if has_lone_surrogate(text):
        raise ValueError(f"{where} holds a lone surrogate (not valid UTF-8)")
    return text


def block_to_proto(block: object, where: str) -> tool_pb2.ContentBlock:
    """One block as a message; ValueError/TypeError, naming `where`, for what cannot be sent."""
    if isinstance(block, TextContent):
        return tool_pb2.ContentBlock(
            text=tool_pb2.TextContent(text=_string(block.text, f"{where}.text"))
        )
    if isinstance(block, ImageContent):
        if not isinstance(block.data, bytes):
            raise TypeError(f"{where}.data is {type(block.data).__name__}, not bytes")
        mime_type = _string(block.mime_type, f"{where}.mime_type")
        return tool_pb2.ContentBlock(
            image=tool_pb2.ImageContent(mime_type=mime_type, data=block.data)
        )
    if isinstance(block, JsonContent):
        try:
            text = jsonvalue.dumps(block.value)
        except jsonvalue.JsonValueError as exc:
            raise ValueError(f"{where} is not lossless JSON: {exc}") from exc
        return tool_pb2.ContentBlock(json=tool_pb2.JsonContent(json=text))
    raise TypeError(
        f"{where} is {type(block).__name__}, not TextContent, ImageContent or JsonContent"
    )


def contexts_to_proto(contexts: Sequence[AdditionalContext]) -> list[tool_pb2.AdditionalContext]:
    messages = []
    for i, context in enumerate(contexts):
        where = f"additional_contexts[{i}]"
        if not isinstance(context, AdditionalContext):
            raise TypeError(f"{where} is {type(context).__name__}, not AdditionalContext")
        messages.append(
            tool_pb2.AdditionalContext(
                content=[
                    block_to_proto(block, f"{where}.content[{j}]")
                    for j, block in enumerate(context.content)
                ],
                source=_string(context.source, f"{where}.source"),
            )
        )
    return messages


def output_to_proto(returned: Any) -> tool_pb2.ToolResult:
    """A handler's return (a plain JSON value or a `ToolOutput`) as a successful result.

    Raises ValueError (JsonValueError among them) or TypeError, naming the offending part, for
    what cannot be sent: the registry would refuse it."""
    if not isinstance(returned, ToolOutput):
        return tool_pb2.ToolResult(value_json=_value_json(returned))
    if not isinstance(returned.concludes_turn, bool):
        raise TypeError(f"concludes_turn is {type(returned.concludes_turn).__name__}, not bool")
    message = tool_pb2.ToolResult(
        content=[block_to_proto(b, f"content[{i}]") for i, b in enumerate(returned.content)],
        additional_contexts=contexts_to_proto(returned.additional_contexts),
        concludes_turn=returned.concludes_turn,
    )
    if returned.has_value:
        message.value_json = _value_json(returned.value)
    return message


def _value_json(value: Any) -> str:
    try:
        return jsonvalue.dumps(value)
    except jsonvalue.JsonValueError as exc:
        # The registry's own wording for an in-process tool's output.
        raise ValueError(f"output is not lossless JSON: {exc}") from exc


def content_from_proto(blocks: Sequence[tool_pb2.ContentBlock]) -> tuple[ContentBlock, ...]:
    """Typed blocks; a block of a kind this client does not know is left out."""
    typed: list[ContentBlock] = []
    for block in blocks:
        kind = block.WhichOneof("block")
        if kind == "text":
            typed.append(TextContent(block.text.text))
        elif kind == "image":
            typed.append(ImageContent(block.image.data, block.image.mime_type))
        elif kind == "json":
            typed.append(JsonContent(jsonvalue.loads(block.json.json)))
    return tuple(typed)


def contexts_from_proto(
    contexts: Sequence[tool_pb2.AdditionalContext],
) -> tuple[AdditionalContext, ...]:
    return tuple(AdditionalContext(content_from_proto(c.content), c.source) for c in contexts)
