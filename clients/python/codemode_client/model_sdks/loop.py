"""The one model loop every vendor adapter runs: ask the model, execute the tool calls it made
through the registry, hand the replies back, until it answers without a tool call.

A vendor adapter supplies a `Dialect` (how to ask its API, read its tool calls and text, and
append a response and replies to the conversation). The loop keeps nothing between runs: the
conversation it returns is the caller's, and the registry records every call in the agent's
history. Turns are bounded (`max_turns` model requests); calls of one turn run one after the
other, in the order the model made them, so that their history reads in that order.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from codemode_client.model_sdks.tools import AgentTools, ModelCall, ToolReply

Stop = Literal["answered", "concluded", "max_turns"]


class Dialect(Protocol):
    async def create(self, conversation: list[Any]) -> Any:
        """One model request over the conversation so far; the vendor's response object."""
        ...

    def calls(self, response: Any) -> list[ModelCall]: ...

    def text(self, response: Any) -> str: ...

    def add_response(self, conversation: list[Any], response: Any) -> None: ...

    def add_replies(self, conversation: list[Any], replies: Sequence[ToolReply]) -> None: ...


class VendorRequest:
    """The half of a dialect every vendor shares: one `create` method of the vendor's client,
    the keyword the conversation goes in, and the options sent with every request."""

    conversation_key: ClassVar[str]

    def __init__(
        self, create: Callable[..., Awaitable[Any] | Any], options: dict[str, Any]
    ) -> None:
        self._create = create
        self._options = options

    async def create(self, conversation: list[Any]) -> Any:
        reply = self._create(**{self.conversation_key: conversation}, **self._options)
        if not inspect.isawaitable(reply):
            raise TypeError("pass the vendor's async client (AsyncOpenAI, AsyncAnthropic)")
        return await reply


@dataclass
class LoopResult:
    text: str
    """The model's text in its last response."""
    response: Any
    """The vendor's last response object."""
    conversation: list[Any]
    """Every message (or input item) of the run, in the vendor's shape: pass it to continue."""
    turns: int
    """Model requests made."""
    stop: Stop
    """`answered`: a response without tool calls; `concluded`: a tool result asked to end the
    turn (`concludes_turn`); `max_turns`: the bound was reached with calls still coming."""
    replies: list[ToolReply] = field(default_factory=list)
    """Every tool reply, in order."""


def field_of(value: Any, name: str, default: Any = None) -> Any:
    """A field of a vendor object, whether the SDK gave a model or a dict."""
    if isinstance(value, dict):
        return value.get(name, default)
    return getattr(value, name, default)


def as_plain(value: Any) -> Any:
    """A vendor SDK's response model as the plain dict its request accepts back."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json", exclude_none=True, warnings=False) if dump is not None else value


async def run_loop(
    dialect: Dialect, tools: AgentTools, conversation: list[Any], max_turns: int
) -> LoopResult:
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    replies: list[ToolReply] = []
    response: Any = None
    for turn in range(1, max_turns + 1):
        response = await dialect.create(conversation)
        dialect.add_response(conversation, response)
        calls = dialect.calls(response)
        if not calls:
            return LoopResult(
                dialect.text(response), response, conversation, turn, "answered", replies
            )
        batch = [await tools.call(call) for call in calls]
        replies.extend(batch)
        dialect.add_replies(conversation, batch)
        if any(reply.concludes_turn for reply in batch):
            return LoopResult(
                dialect.text(response), response, conversation, turn, "concluded", replies
            )
    return LoopResult(
        dialect.text(response), response, conversation, max_turns, "max_turns", replies
    )
