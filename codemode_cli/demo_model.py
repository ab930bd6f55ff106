"""`codemode demo --model scripted|openai|anthropic`: a model drives the demo agent.

The demo's services and provider are those of codemode_cli.demo; here a model gets the agent's
tools (in `code` mode: `run_code` alone, the SDK in the system prompt) through the client's
model SDK adapters (codemode_client.model_sdks) and runs until it answers. `scripted` is the
scripted model (codemode_cli/scripted_model.py) on loopback, spoken to by the real `openai`
client over the Responses API, offline and without a key: it calls `run_code` with the demo's
program, then answers with what it got back. `openai` (Responses API) and `anthropic`
(Messages API) are the real models, with `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`.
"""

from __future__ import annotations

import os
from typing import Any

from codemode_cli.scripted_model import ScriptedModel
from codemode_client import RegistryClient
from codemode_client.client import Language
from codemode_client.model_sdks import AgentTools, LoopResult, anthropic_messages, openai_responses

MODELS = ("scripted", "openai", "anthropic")
DEFAULT_MODEL_NAMES = {"scripted": "demo", "openai": "gpt-5-mini", "anthropic": "claude-sonnet-4-5"}
KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
TASK = (
    "Count the TODO markers in every file of the workspace, in one program, and tell me the "
    "total and which files have them."
)
MAX_TURNS = 8


class ModelFailed(Exception):
    """The model's API refused or failed a request (the vendor SDK's error, in words)."""


def missing_key(model: str) -> str | None:
    """The environment variable a real model needs and lacks, else None."""
    key = KEYS.get(model)
    return key if key is not None and not os.environ.get(key) else None


def script(program: str) -> dict[str, Any]:
    """What the scripted model does: run the program, then report what it returned."""
    return {
        DEFAULT_MODEL_NAMES["scripted"]: [
            {"call": {"name": "run_code", "arguments": {"code": program, "description": TASK}}},
            {"say": "The program reported:\n{result}"},
        ]
    }


async def _run(model: str, model_name: str, tools: AgentTools, program: str) -> LoopResult:
    if model == "anthropic":
        from anthropic import AsyncAnthropic

        return await anthropic_messages.run(
            AsyncAnthropic(), tools, model=model_name, messages=TASK, max_turns=MAX_TURNS
        )
    from openai import AsyncOpenAI

    if model == "openai":
        return await openai_responses.run(
            AsyncOpenAI(), tools, model=model_name, input=TASK, max_turns=MAX_TURNS
        )
    with ScriptedModel(script(program)) as server:
        client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="scripted", max_retries=0)
        return await openai_responses.run(
            client, tools, model=model_name, input=TASK, max_turns=MAX_TURNS
        )


async def model_walkthrough(
    address: str, language: str, model: str, model_name: str | None, program: str
) -> str:
    """Runs the model on the demo agent and prints its turns; the first `run_code` call id
    (for the trace), or "" when the model made none."""
    name = model_name or DEFAULT_MODEL_NAMES[model]
    async with RegistryClient(address, timeout=120) as client:
        code_language: Language = "typescript" if language == "typescript" else "python"
        agent = (await client.create_agent("demo-agent", mode="code", language=code_language)).name
        tools = await AgentTools.load(client, agent)
        print(f"{agent} (mode code, {language}) · model: {model} ({name})")
        print(f"  schemas the model sees: {[s.name for s in tools.schemas]}")
        print(f"  task: {TASK}\n")
        try:
            result = await _run(model, name, tools, program)
        except Exception as exc:
            if type(exc).__module__.partition(".")[0] not in ("openai", "anthropic"):
                raise
            raise ModelFailed(f"the {model} model {name!r} failed: {exc}") from exc
        for reply in result.replies:
            status = f"error {reply.code}" if reply.is_error else "ok"
            print(f"tool call {reply.call.name} [{reply.call_id}]: {status}")
            if reply.call.name == "run_code" and isinstance(reply.call.arguments, str):
                print("".join(f"  │ {line}\n" for line in _code_of(reply.call.arguments)), end="")
            print("".join(f"  → {line}\n" for line in reply.text.splitlines()[:20]), end="")
        print(f"\nmodel answer ({result.turns} turns, {result.stop}):")
        print("".join(f"  {line}\n" for line in result.text.splitlines()), end="")
        history = await client.history(agent)
        kinds: dict[str, int] = {}
        for record in history:
            kinds[record.kind] = kinds.get(record.kind, 0) + 1
        print(f"\nhistory for {agent}: {kinds}")
    return next((r.call_id for r in result.replies if r.call.name == "run_code"), "")


def _code_of(arguments: str) -> list[str]:
    import json

    try:
        code = json.loads(arguments).get("code", "")
    except (ValueError, AttributeError):
        return []
    return str(code).rstrip().splitlines()
