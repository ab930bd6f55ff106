"""A pydantic-ai toolset of an agent's tools (`pip install 'codemode-client[pydantic-ai]'`).

    from pydantic_ai import Agent
    from codemode_client.model_sdks import AgentTools
    from codemode_client.model_sdks.pydantic_ai_toolset import CodemodeToolset

    toolset = CodemodeToolset(await AgentTools.load(client, "agents/coder"))
    agent = Agent("openai:gpt-5", toolsets=[toolset])
    await agent.run("Count the TODOs")

Each call goes to the registry as the agent (ExecuteToolCall, pydantic-ai's tool call id as the
call id); the agent's system prompt comes in as the toolset's instructions. The registry
validates arguments, so the toolset accepts any object and a failure comes back to the model
as pydantic-ai's `ToolFailed` with the Codemode code in its text. Only this module imports
pydantic-ai.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import BinaryContent
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from codemode_client.model_sdks.tools import AgentTools, ModelCall, block_text
from codemode_client.results import ImageContent

_ANY_OBJECT = SchemaValidator(
    core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema())
)


class CodemodeToolset(AbstractToolset[Any]):
    """The agent's wire schemas as pydantic-ai tools (under `code`: `run_code` alone)."""

    def __init__(self, tools: AgentTools, *, id: str | None = None, max_retries: int = 2) -> None:
        """`max_retries`: how often the model may send arguments that are not a JSON object
        for one tool before the run fails (pydantic-ai's own rule)."""
        self.tools = tools
        self._id = id
        self._max_retries = max_retries

    @property
    def id(self) -> str | None:
        return self._id

    async def get_instructions(self, ctx: RunContext[Any]) -> str | None:
        return self.tools.instructions or None

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            s.name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=s.name, description=s.description, parameters_json_schema=s.parameters
                ),
                max_retries=self._max_retries,
                args_validator=_ANY_OBJECT,
            )
            for s in self.tools.schemas
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        reply = await self.tools.call(ModelCall(ctx.tool_call_id or "", name, tool_args))
        if reply.is_error:
            raise ToolFailed(reply.text)
        if not any(isinstance(block, ImageContent) for block in reply.content):
            return reply.text
        return [
            BinaryContent(block.data, media_type=block.mime_type)
            if isinstance(block, ImageContent)
            else block_text(block)
            for block in reply.content
        ]
