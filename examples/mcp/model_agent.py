"""A model calls your MCP server's tools through `run_code`.

    python examples/mcp/model_agent.py 127.0.0.1:50051

The `weather` agent (examples/mcp/registry.yaml) is in `code` mode: the model sees only
`run_code`, with the SDK of the MCP server's `forecast` tool in its description, and writes a
program calling it. With OPENAI_API_KEY set it asks OpenAI (`CODEMODE_EXAMPLE_MODEL`, default
gpt-5-mini), with ANTHROPIC_API_KEY Anthropic (default claude-sonnet-4-5), and otherwise a
scripted model on loopback (codemode_cli/scripted_model.py), through the same `openai` client.

It prints, with the scripted model:

    model: scripted · tools: ['run_code']
    tool call run_code: ok
    answer: Tomorrow in Paris: sunny, 21 °C.
"""

from __future__ import annotations

import asyncio
import os
import sys

from codemode_client import RegistryClient
from codemode_client.model_sdks import AgentTools, LoopResult, anthropic_messages, openai_responses

AGENT = "agents/weather"
TASK = "What is tomorrow's weather in Paris? Use the forecast tool from a program."
SCRIPT = {
    "weather": [
        {
            "call": {
                "name": "run_code",
                "arguments": {
                    "description": "Ask the forecast",
                    "code": "f = await tools.forecast({'city': 'Paris'})\nreturn f['weather']",
                },
            }
        },
        {"say": "Tomorrow in Paris: {result}."},
    ]
}


async def ask_model(tools: AgentTools) -> tuple[str, LoopResult]:
    name = os.environ.get("CODEMODE_EXAMPLE_MODEL")
    if os.environ.get("OPENAI_API_KEY"):
        from openai import AsyncOpenAI

        model = name or "gpt-5-mini"
        return model, await openai_responses.run(AsyncOpenAI(), tools, model=model, input=TASK)
    if os.environ.get("ANTHROPIC_API_KEY"):
        from anthropic import AsyncAnthropic

        model = name or "claude-sonnet-4-5"
        result = await anthropic_messages.run(AsyncAnthropic(), tools, model=model, messages=TASK)
        return model, result
    from openai import AsyncOpenAI

    from codemode_cli.scripted_model import ScriptedModel

    with ScriptedModel(SCRIPT) as scripted:
        client = AsyncOpenAI(base_url=f"{scripted.url}/v1", api_key="scripted", max_retries=0)
        result = await openai_responses.run(client, tools, model="weather", input=TASK)
        return "scripted", result


async def main(address: str) -> None:
    async with RegistryClient(address) as client:
        tools = await AgentTools.load(client, AGENT)  # wire schemas + system prompt
        model, result = await ask_model(tools)
        print(f"model: {model} · tools: {[s.name for s in tools.schemas]}")
        for reply in result.replies:
            status = f"error {reply.code}" if reply.is_error else "ok"
            print(f"tool call {reply.call.name}: {status}")
        print(f"answer: {result.text}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"))
