"""Tool results: content blocks, canonical error results and the aborted results."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Final, Literal, cast

from codemode_wire import jsonvalue
from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue

ABORTED = "ABORTED"
ABORTED_BEFORE_DISPATCH = "ABORTED_BEFORE_DISPATCH"
UNKNOWN_TOOL = "UNKNOWN_TOOL"
INVALID_ARGS = "INVALID_ARGS"
INVALID_TOOL_OUTPUT = "INVALID_TOOL_OUTPUT"
TOOL_FAILED = "TOOL_FAILED"
"""The code of a failure whose source named none (a tool body's plain exception, a provider's or
plugin's error without a code): every failure carries a code, so a caller can always branch on
one and history never holds an error without one."""


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str
    type: Literal["text"] = "text"


class PrettyTextBlock(TextBlock):
    """The text block of a result that brought only a value: the value as `render_pretty`
    spells it, rendered when something first reads `text`. A nested call's result goes to the
    program as `value_json`, and unless a hook or a history record reads its content nobody
    ever does: rendering a 1 MB value costs a quarter of the registry's time for the call.

    It renders the pipeline's own snapshot (`ToolResult.value_json` vouches that nothing
    outside holds it), or the canonical text of the result (`of_text`), so the text is the one
    an eager render would have given. Equal to a `TextBlock` with the same text."""

    __slots__ = ("_json", "_rendered", "_value")
    _json: str
    _rendered: str | None
    _value: JsonValue

    def __init__(self, value: JsonValue) -> None:  # no super().__init__: `text` is derived
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_json", "")
        object.__setattr__(self, "_rendered", None)
        object.__setattr__(self, "type", "text")

    @classmethod
    def of_text(cls, value_json: str) -> PrettyTextBlock:
        """The block of the value `value_json` spells (decoded only if the text is read)."""
        block = cls(None)
        object.__setattr__(block, "_json", value_json)
        return block

    @property
    def text(self) -> str:
        rendered: str | None = self._rendered
        if rendered is None:
            value = jsonvalue.loads(self._json) if self._json else self._value
            rendered = jsonvalue.render_pretty(value)
            object.__setattr__(self, "_rendered", rendered)
            object.__setattr__(self, "_value", None)  # the text is all that is needed now
            object.__setattr__(self, "_json", "")
        return rendered

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TextBlock):
            return NotImplemented
        return self.text == other.text

    def __hash__(self) -> int:
        return hash((self.text, self.type))

    def __repr__(self) -> str:
        return f"PrettyTextBlock(text={self.text!r})"

    def __reduce__(self) -> tuple[type[TextBlock], tuple[str]]:
        return TextBlock, (self.text,)  # a copy is the plain block it reads as


@dataclass(frozen=True, slots=True)
class ImageBlock:
    mime_type: str
    data: bytes
    type: Literal["image"] = "image"


@dataclass(frozen=True, slots=True)
class JsonBlock:
    """A JSON document kept as canonical JSON text (immutable by construction)."""

    json: str
    type: Literal["json"] = "json"


ContentBlock = TextBlock | ImageBlock | JsonBlock


@dataclass(frozen=True, slots=True)
class AdditionalContext:
    content: tuple[ContentBlock, ...]
    source: str = ""


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    message: str
    code: str = TOOL_FAILED
    name: str = ""

    def __post_init__(self) -> None:
        if not self.code:  # no failure without a code (see TOOL_FAILED)
            object.__setattr__(self, "code", TOOL_FAILED)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one call. `value` is execution-local: it is never persisted.

    `value_json`, when set, is `dumps(value)` and vouches that `value` is referenced by nothing
    outside the pipeline (a value just decoded from the wire, or the pipeline's own snapshot):
    the value is then neither copied nor encoded again.
    """

    content: tuple[ContentBlock, ...]
    is_error: bool = False
    value: JsonValue = None
    has_value: bool = False
    error: ErrorInfo | None = None
    additional_contexts: tuple[AdditionalContext, ...] = field(default=())
    concludes_turn: bool = False
    value_json: str = ""
    presentation_meta: JsonValue = None
    """Presentation metadata for a UI card of the call (a JSON object), never shown to the
    model; None: the tool gave none (`cordis_define`/`cordis_run` name their
    ids; a dynamic tool's `presentation_meta` function)."""
    rpc_error: CodemodeError | None = None
    """Set (only by the registry itself) when the failure is the service's, not the tool's: the
    code runtime was unavailable. The result is recorded as usual, then the call's RPC ends
    with this error instead of carrying the result. Results from providers never set it."""

    def __post_init__(self) -> None:
        if self.is_error and self.error is None:  # a result built as failed without its info
            message = text_of(self.content).removeprefix("Error: ") or "tool failed"
            object.__setattr__(self, "error", ErrorInfo(message))

    def with_contexts(self, contexts: tuple[AdditionalContext, ...]) -> ToolResult:
        return replace(self, additional_contexts=contexts)


_VALUE_SLOT = ToolResult.__dict__["value"]  # the slot `TextValuedResult` keeps the value in
_UNREAD: Final = object()
_COMPARED = tuple(f for f in fields(ToolResult) if f.compare)


class TextValuedResult(ToolResult):
    """A successful result whose value is its canonical text, decoded when first read.

    What a body hands back is the body's: it may still hold and change it. The pipeline keeps
    the text it wrote from it (`value_json`, which the program, the caller and the records
    get), and whatever reads `value` afterwards (a post-execute hook, an observer) gets that
    text's value, never the body's object. A nested call's result nobody reads as a value is
    then written once and never decoded in the registry."""

    __slots__ = ()

    @classmethod
    def of_text(cls, value_json: str) -> TextValuedResult:
        content = (PrettyTextBlock.of_text(value_json),)
        unread = cast(JsonValue, _UNREAD)
        return cls(content, value=unread, has_value=True, value_json=value_json)

    @property
    def value(self) -> JsonValue:
        value = _VALUE_SLOT.__get__(self, ToolResult)
        if value is _UNREAD:
            value = jsonvalue.loads(self.value_json)  # text the pipeline wrote: lossless
            _VALUE_SLOT.__set__(self, value)
        return cast(JsonValue, value)

    @value.setter
    def value(self, value: JsonValue) -> None:  # only the dataclass's own __init__ sets it
        _VALUE_SLOT.__set__(self, value)

    def __eq__(self, other: object) -> bool:
        """Equal to any result with the same fields, whichever class holds them."""
        if not isinstance(other, ToolResult):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in _COMPARED)

    __hash__ = ToolResult.__hash__


def success(
    value: JsonValue, content: tuple[ContentBlock, ...], *, has_value: bool = True
) -> ToolResult:
    return ToolResult(content=content, value=value, has_value=has_value)


def error_result(message: str, code: str = TOOL_FAILED, name: str = "") -> ToolResult:
    """The canonical error result: content `Error: <message>`."""
    return ToolResult(
        content=(TextBlock(f"Error: {message}"),),
        is_error=True,
        error=ErrorInfo(message=message, code=code, name=name),
    )


def aborted(*, before_dispatch: bool) -> ToolResult:
    if before_dispatch:
        return error_result(
            "tool call aborted before dispatch", ABORTED_BEFORE_DISPATCH, "AbortError"
        )
    return error_result("tool call aborted", ABORTED, "AbortError")


def text_of(blocks: tuple[ContentBlock, ...]) -> str:
    """Text blocks joined by newlines; other blocks as `[<type> content]`."""
    return "\n".join(b.text if isinstance(b, TextBlock) else f"[{b.type} content]" for b in blocks)
