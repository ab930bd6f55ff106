"""Model SDK adapters: an agent's tools in the formats of the model APIs, and a loop.

- `AgentTools.load(client, agent)`: the agent's wire schemas and system prompt; `call(ModelCall)`
  executes a model's tool call through the registry and gives the `ToolReply` for the model.
- `openai_responses`, `openai_chat`, `anthropic_messages`: `tool_definitions(tools.schemas)`,
  the calls of a response (`calls_of`), the replies in the vendor's shape, and
  `run(vendor_client, tools, ...)`: a loop that runs the model with the agent's tools until it
  answers (bounded turns, nothing kept: the registry records the history). They import no
  vendor SDK: pass the client you built (`AsyncOpenAI`, `AsyncAnthropic`), installed with
  `codemode-client[openai]` or `codemode-client[anthropic]`.
- `pydantic_ai_toolset.CodemodeToolset` (`codemode-client[pydantic-ai]`): a pydantic-ai toolset;
  import that module explicitly (it imports pydantic-ai).
"""

from codemode_client.model_sdks.loop import LoopResult, run_loop
from codemode_client.model_sdks.tools import AgentTools, ModelCall, ToolReply, WireSchema

__all__ = ["AgentTools", "LoopResult", "ModelCall", "ToolReply", "WireSchema", "run_loop"]
