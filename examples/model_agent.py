"""A model runs with an agent's tools: the model SDK adapters of the Python client.

    python examples/model_agent.py 127.0.0.1:50051

With OPENAI_API_KEY set it asks OpenAI (Responses API, `CODEMODE_EXAMPLE_MODEL`, default
gpt-5-mini), with ANTHROPIC_API_KEY Anthropic (Messages API, default claude-sonnet-4-5), and
otherwise the scripted model (codemode_cli/scripted_model.py with models/scripted.json) on
loopback, through the same `openai` client. The agent is in `code` mode: the model sees only
`run_code` and writes a program calling `add_numbers`, which this process serves. Safe to run
again: the agent is created once and reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from typing_extensions import TypedDict

from codemode_client import AlreadyExists, RegistryClient, ToolProvider, open_channel
from codemode_client.model_sdks import AgentTools, LoopResult, anthropic_messages, openai_responses

HERE = Path(__file__).resolve().parent
TASK = "What is 20 + 22? Use the add_numbers tool from a program."


class AddArgs(TypedDict):
    a: int
    b: int


@contextlib.asynccontextmanager
async def scripted_openai() -> AsyncIterator[Any]:
    """The real `openai` client pointed at the scripted model on loopback."""
    from openai import AsyncOpenAI

    from codemode_cli.scripted_model import ScriptedModel

    with ScriptedModel(json.loads((HERE / "models" / "scripted.json").read_text())) as model:
        yield AsyncOpenAI(base_url=f"{model.url}/v1", api_key="scripted", max_retries=0)


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
    async with scripted_openai() as openai:
        return "scripted", await openai_responses.run(openai, tools, model="example", input=TASK)


async def main(address: str) -> None:
    async with RegistryClient(address) as client, open_channel(address) as channel:
        provider = ToolProvider(channel, "example-numbers")

        @provider.tool(concurrency_safe=True)
        async def add_numbers(args: AddArgs, ctx: Any) -> int:
            """Add two integers."""
            return args["a"] + args["b"]

        async with provider:
            try:
                agent = (await client.create_agent("model-example", mode="code")).name
            except AlreadyExists:
                agent = "agents/model-example"
            tools = await AgentTools.load(client, agent)  # wire schemas + system prompt
            model, result = await ask_model(tools)
            print(f"model: {model} · tools: {[s.name for s in tools.schemas]}")
            for reply in result.replies:
                status = f"error {reply.code}" if reply.is_error else "ok"
                print(f"tool call {reply.call.name}: {status}")
            print(f"answer: {result.text}")
            history = await client.history(agent)
            runs = sum(r.kind == "tool/result" and r.tool_name == "run_code" for r in history)
            print(f"history: {runs} run_code calls so far")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"))
