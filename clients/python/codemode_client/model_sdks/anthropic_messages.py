"""The Anthropic Messages API: an agent's tools as client tools, and a loop over
`messages.create`.

    from anthropic import AsyncAnthropic
    result = await anthropic_messages.run(
        AsyncAnthropic(), tools, model="claude-sonnet-4-5", messages="Count the TODOs")

Plain dicts in the shapes of the `anthropic` SDK's request types: this module imports no SDK.
A failure is a `tool_result` with `is_error: true` whose text names the Codemode code.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from codemode_client.model_sdks.loop import LoopResult, VendorRequest, as_plain, field_of, run_loop
from codemode_client.model_sdks.tools import (
    AgentTools,
    ModelCall,
    ToolReply,
    WireSchema,
    block_text,
)
from codemode_client.results import ContentBlock, ImageContent

JsonDict = dict[str, Any]


def tool_definitions(schemas: Sequence[WireSchema]) -> list[JsonDict]:
    """`tools=` for `messages.create`: one client tool per wire schema."""
    return [
        {"name": s.name, "description": s.description, "input_schema": s.parameters}
        for s in schemas
    ]


def calls_of(response: Any) -> list[ModelCall]:
    """The `tool_use` blocks of a message, in order."""
    calls = []
    for block in field_of(response, "content", None) or ():
        if field_of(block, "type") == "tool_use":
            arguments = field_of(block, "input")
            if not (isinstance(arguments, Mapping | str) or arguments is None):
                # Not an object (a list, a number): sent as JSON for the registry to refuse.
                arguments = json.dumps(arguments, default=str)
            calls.append(
                ModelCall(field_of(block, "id", ""), field_of(block, "name", ""), arguments)
            )
    return calls


def _block(block: ContentBlock) -> JsonDict:
    if isinstance(block, ImageContent):
        data = base64.b64encode(block.data).decode()
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": block.mime_type, "data": data},
        }
    return {"type": "text", "text": block_text(block)}


def tool_results(replies: Sequence[ToolReply]) -> JsonDict:
    """The user message answering a turn's tool calls: one `tool_result` per reply, then the
    replies' additional contexts as text blocks."""
    content: list[JsonDict] = [
        {
            "type": "tool_result",
            "tool_use_id": r.call.call_id,
            "content": [_block(b) for b in r.content] or [{"type": "text", "text": ""}],
            "is_error": r.is_error,
        }
        for r in replies
    ]
    for reply in replies:
        for context in reply.additional_contexts:
            content.extend(_block(b) for b in context.content)
    return {"role": "user", "content": content}


class MessagesDialect(VendorRequest):
    conversation_key = "messages"

    def calls(self, response: Any) -> list[ModelCall]:
        return calls_of(response)

    def text(self, response: Any) -> str:
        blocks = field_of(response, "content", None) or ()
        return "".join(field_of(b, "text", "") for b in blocks if field_of(b, "type") == "text")

    def add_response(self, conversation: list[Any], response: Any) -> None:
        blocks = [as_plain(b) for b in field_of(response, "content", None) or ()]
        conversation.append({"role": "assistant", "content": blocks})

    def add_replies(self, conversation: list[Any], replies: Sequence[ToolReply]) -> None:
        conversation.append(tool_results(replies))


async def run(
    anthropic: Any,
    tools: AgentTools,
    *,
    model: str,
    messages: str | list[Any],
    max_tokens: int = 4096,
    max_turns: int = 10,
    **options: Any,
) -> LoopResult:
    """Runs `anthropic.messages.create` (an `AsyncAnthropic`) with the agent's tools until the
    model answers. `system` defaults to the agent's system prompt; other `options` go to every
    request."""
    conversation: list[Any] = (
        [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
    )
    if tools.instructions:
        options.setdefault("system", tools.instructions)
    options = {
        "model": model,
        "max_tokens": max_tokens,
        "tools": tool_definitions(tools.schemas),
    } | options
    dialect = MessagesDialect(anthropic.messages.create, options)
    return await run_loop(dialect, tools, conversation, max_turns)
