"""The OpenAI Responses API: an agent's tools as function tools, and a loop over `responses.create`.

    from openai import AsyncOpenAI
    from codemode_client.model_sdks import AgentTools, openai_responses

    tools = await AgentTools.load(client, "agents/coder")
    result = await openai_responses.run(AsyncOpenAI(), tools, model="gpt-5", input="Count TODOs")
    result.text

Plain dicts in the shapes of the `openai` SDK's request types: this module imports no SDK. The
full conversation is sent on every request (nothing is kept by the server: `store` is yours).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from codemode_client.model_sdks.loop import LoopResult, VendorRequest, as_plain, field_of, run_loop
from codemode_client.model_sdks.tools import (
    AgentTools,
    ModelCall,
    ToolReply,
    WireSchema,
    block_text,
    context_texts,
)
from codemode_client.results import ImageContent

JsonDict = dict[str, Any]


def tool_definitions(schemas: Sequence[WireSchema]) -> list[JsonDict]:
    """`tools=` for `responses.create`: one function tool per wire schema."""
    return [
        {
            "type": "function",
            "name": s.name,
            "description": s.description,
            "parameters": s.parameters,
            "strict": False,  # the registry validates; strict mode would rewrite the schema
        }
        for s in schemas
    ]


def calls_of(response: Any) -> list[ModelCall]:
    """The function calls of a response, in order."""
    return [
        ModelCall(
            field_of(item, "call_id", ""), field_of(item, "name", ""), field_of(item, "arguments")
        )
        for item in field_of(response, "output", None) or ()
        if field_of(item, "type") == "function_call"
    ]


def _output(reply: ToolReply) -> str | list[JsonDict]:
    if not any(isinstance(block, ImageContent) for block in reply.content):
        return reply.text
    parts: list[JsonDict] = []
    for block in reply.content:
        if isinstance(block, ImageContent):
            data = base64.b64encode(block.data).decode()
            parts.append(
                {"type": "input_image", "image_url": f"data:{block.mime_type};base64,{data}"}
            )
        else:
            parts.append({"type": "input_text", "text": block_text(block)})
    return parts


def input_items(replies: Sequence[ToolReply]) -> list[JsonDict]:
    """`function_call_output` items for the replies, then one user message per additional
    context they carry."""
    items: list[JsonDict] = [
        {"type": "function_call_output", "call_id": r.call.call_id, "output": _output(r)}
        for r in replies
    ]
    items.extend(
        {"role": "user", "content": [{"type": "input_text", "text": text}]}
        for text in context_texts(replies)
    )
    return items


class ResponsesDialect(VendorRequest):
    conversation_key = "input"

    def calls(self, response: Any) -> list[ModelCall]:
        return calls_of(response)

    def text(self, response: Any) -> str:
        return str(field_of(response, "output_text", "") or "")

    def add_response(self, conversation: list[Any], response: Any) -> None:
        conversation.extend(as_plain(item) for item in field_of(response, "output", None) or ())

    def add_replies(self, conversation: list[Any], replies: Sequence[ToolReply]) -> None:
        conversation.extend(input_items(replies))


async def run(
    openai: Any,
    tools: AgentTools,
    *,
    model: str,
    input: str | list[Any],
    max_turns: int = 10,
    **options: Any,
) -> LoopResult:
    """Runs `openai.responses.create` (an `AsyncOpenAI`) with the agent's tools until the model
    answers. `instructions` default to the agent's system prompt; other `options` are passed to
    every request."""
    conversation: list[Any] = (
        [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
    )
    if tools.instructions:
        options.setdefault("instructions", tools.instructions)
    options = {"model": model, "tools": tool_definitions(tools.schemas)} | options
    dialect = ResponsesDialect(openai.responses.create, options)
    return await run_loop(dialect, tools, conversation, max_turns)
