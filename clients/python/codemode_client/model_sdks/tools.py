"""An agent's tools as a model sees them, and the way back from a model's tool call.

Vendor-neutral: the adapters beside this module (`openai_responses`, `openai_chat`,
`anthropic_messages`, `pydantic_ai_toolset`) only reshape what this module produces.

    tools = await AgentTools.load(client, "agents/coder")
    tools.schemas        # GetWireSchemas: under `code` only run_code
    tools.instructions   # GetSystemPrompt: the agent's assembled prompt (tools:sdk included)
    reply = await tools.call(ModelCall(call_id, name, arguments))   # ExecuteToolCall

A model's bad output is the model's to correct, never the caller's crash: a tool the agent does
not have comes back as the registry's `UNKNOWN_TOOL` result, arguments that are not JSON (or not
an object) as the registry's `INVALID_ARGUMENT` refusal turned into a failed reply that keeps
its reason (`INVALID_JSON`, ...). Other RPC errors (an outage, a missing permission) are the
deployment's, not the model's, and are raised as `CodemodeError`s.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from codemode_client.client import RegistryClient, ToolCallResult
from codemode_client.errors import InvalidArgument
from codemode_client.results import AdditionalContext, ContentBlock, JsonContent, TextContent
from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue

_MAX_CALL_ID_BYTES = 512  # the registry's limit on a call id


@dataclass(frozen=True)
class WireSchema:
    """One tool as the model is shown it: name, description, JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, JsonValue]


@dataclass(frozen=True)
class ModelCall:
    """One tool call a model asked for. `arguments` as the model sent it: JSON text (OpenAI) or
    a decoded object (Anthropic, pydantic-ai)."""

    call_id: str
    name: str
    arguments: str | Mapping[str, JsonValue] | None


@dataclass(frozen=True)
class ToolReply:
    """What goes back to the model for one call."""

    call: ModelCall
    call_id: str
    """The registry's call id (the model's, unless it was empty or too long)."""
    is_error: bool
    code: str
    """The Codemode error code of a failure (`UNKNOWN_TOOL`, `INVALID_JSON`, ...); else ""."""
    content: tuple[ContentBlock, ...]
    """What the model is shown; for a failure, one text block that names the code."""
    additional_contexts: tuple[AdditionalContext, ...] = ()
    concludes_turn: bool = False
    result: ToolCallResult | None = None
    """The registry's result (None when the registry refused the request itself)."""

    @property
    def text(self) -> str:
        """The content as one text (JSON blocks as JSON, images as a placeholder)."""
        return "\n".join(block_text(block) for block in self.content)


def block_text(block: ContentBlock) -> str:
    """A content block as text, for formats whose tool results carry text only."""
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, JsonContent):
        return jsonvalue.dumps(block.value)
    return f"[image {block.mime_type}, {len(block.data)} bytes]"


def context_texts(replies: Sequence[ToolReply]) -> list[str]:
    """The additional contexts of the replies, in order, each as one text (for formats that
    add them to the conversation as user text)."""
    return [
        "\n".join(block_text(block) for block in context.content)
        for reply in replies
        for context in reply.additional_contexts
    ]


def failure_text(code: str, message: str) -> str:
    """How a failure reads to a model: the code first, so that it can act on it."""
    return f"Error [{code}]: {message}" if code else f"Error: {message}"


def _wire_schema(schema: Mapping[str, JsonValue]) -> WireSchema:
    parameters = schema["parameters"]
    return WireSchema(
        name=str(schema["name"]),
        description=str(schema["description"]),
        parameters=dict(parameters) if isinstance(parameters, dict) else {"type": "object"},
    )


class AgentTools:
    """An agent's wire schemas and prompt, and its tool calls through one `RegistryClient`.

    Holds nothing of a conversation: the registry records every call in the agent's history."""

    def __init__(
        self,
        client: RegistryClient,
        agent: str,
        schemas: Sequence[WireSchema],
        instructions: str = "",
    ) -> None:
        self.client = client
        self.agent = agent
        self.schemas = tuple(schemas)
        self.instructions = instructions

    @classmethod
    async def load(cls, client: RegistryClient, agent: str, *, language: str = "") -> AgentTools:
        """The agent's wire schemas and system prompt, as the registry presents them now."""
        schemas = await client.wire_schemas(agent, language)
        prompt = await client.system_prompt(agent, language)
        return cls(client, agent, [_wire_schema(s) for s in schemas], prompt)

    async def call(self, call: ModelCall) -> ToolReply:
        """Executes one model tool call as the agent (ExecuteToolCall, the model's call id)."""
        call_id = call.call_id
        if not call_id or len(call_id.encode()) > _MAX_CALL_ID_BYTES:
            call_id = f"call-{uuid.uuid4().hex[:12]}"
        if call.arguments is None or isinstance(call.arguments, str):
            arguments_json = call.arguments or "{}"
        else:
            try:
                arguments_json = jsonvalue.dumps(dict(call.arguments))
            except jsonvalue.JsonValueError as exc:
                return _refused(call, call_id, "INVALID_JSON", f"arguments: {exc}")
        try:
            result = await self.client.call(
                call.name,
                agent=self.agent,
                call_id=call_id,
                progress="none",
                arguments_json=arguments_json,
            )
        except InvalidArgument as exc:
            # The request itself was refused (arguments not JSON, too large, too deep...):
            # nothing ran, and the model may correct it.
            return _refused(call, call_id, exc.reason or "INVALID_ARGUMENT", exc.message)
        return reply_of(call, call_id, result)


def reply_of(call: ModelCall, call_id: str, result: ToolCallResult) -> ToolReply:
    if result.is_error:
        text = failure_text(result.error_code, result.error_message or result.text)
        return ToolReply(
            call, call_id, True, result.error_code, (TextContent(text),),
            result.additional_contexts, False, result,
        )  # fmt: skip
    content = result.content
    if not content and result.has_value:
        content = (TextContent(jsonvalue.dumps(result.value)),)
    return ToolReply(
        call, call_id, False, "", content, result.additional_contexts, result.concludes_turn,
        result,
    )  # fmt: skip


def _refused(call: ModelCall, call_id: str, code: str, message: str) -> ToolReply:
    return ToolReply(call, call_id, True, code, (TextContent(failure_text(code, message)),))
