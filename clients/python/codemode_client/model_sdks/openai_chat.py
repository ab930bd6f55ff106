"""The OpenAI Chat Completions API: an agent's tools as function tools, and a loop over
`chat.completions.create`.

    result = await openai_chat.run(AsyncOpenAI(), tools, model="gpt-5", messages="Count the TODOs")

Plain dicts in the shapes of the `openai` SDK's request types: this module imports no SDK. A
tool message carries text only, so an image in a result reaches the model as a placeholder
naming its type and size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from codemode_client.model_sdks.loop import LoopResult, VendorRequest, as_plain, field_of, run_loop
from codemode_client.model_sdks.tools import (
    AgentTools,
    ModelCall,
    ToolReply,
    WireSchema,
    context_texts,
)

JsonDict = dict[str, Any]


def tool_definitions(schemas: Sequence[WireSchema]) -> list[JsonDict]:
    """`tools=` for `chat.completions.create`: one function tool per wire schema."""
    return [
        {
            "type": "function",
            "function": {"name": s.name, "description": s.description, "parameters": s.parameters},
        }
        for s in schemas
    ]


def _message(response: Any) -> Any:
    choices = field_of(response, "choices", None) or ()
    return field_of(choices[0], "message") if choices else None


def calls_of(response: Any) -> list[ModelCall]:
    """The tool calls of a completion's first choice, in order."""
    message = _message(response)
    calls = []
    for call in field_of(message, "tool_calls", None) or ():
        function = field_of(call, "function")
        calls.append(
            ModelCall(
                field_of(call, "id", ""),
                field_of(function, "name", ""),
                field_of(function, "arguments"),
            )
        )
    return calls


def tool_messages(replies: Sequence[ToolReply]) -> list[JsonDict]:
    """One `tool` message per reply, then one user message per additional context."""
    messages: list[JsonDict] = [
        {"role": "tool", "tool_call_id": r.call.call_id, "content": r.text} for r in replies
    ]
    messages.extend({"role": "user", "content": text} for text in context_texts(replies))
    return messages


class ChatDialect(VendorRequest):
    conversation_key = "messages"

    def calls(self, response: Any) -> list[ModelCall]:
        return calls_of(response)

    def text(self, response: Any) -> str:
        return str(field_of(_message(response), "content", "") or "")

    def add_response(self, conversation: list[Any], response: Any) -> None:
        message = _message(response)
        if message is not None:
            conversation.append(as_plain(message))

    def add_replies(self, conversation: list[Any], replies: Sequence[ToolReply]) -> None:
        conversation.extend(tool_messages(replies))


async def run(
    openai: Any,
    tools: AgentTools,
    *,
    model: str,
    messages: str | list[Any],
    max_turns: int = 10,
    system: str | None = None,
    **options: Any,
) -> LoopResult:
    """Runs `openai.chat.completions.create` (an `AsyncOpenAI`) with the agent's tools until the
    model answers. A string `messages` is one user message after a system message holding
    `system` (default: the agent's system prompt); other `options` go to every request."""
    if isinstance(messages, str):
        prompt = tools.instructions if system is None else system
        conversation: list[Any] = [{"role": "system", "content": prompt}] if prompt else []
        conversation.append({"role": "user", "content": messages})
    else:
        conversation = list(messages)
    options = {"model": model, "tools": tool_definitions(tools.schemas)} | options
    dialect = ChatDialect(openai.chat.completions.create, options)
    return await run_loop(dialect, tools, conversation, max_turns)
