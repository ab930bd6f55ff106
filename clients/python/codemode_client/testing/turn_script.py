"""A scripted model, in process: the turns a model would take, played through `ExecuteToolCall`.

    conversation = await TurnScript(
        RunCode("return await tools.add({'a': 2, 'b': 3})"),
        lambda so_far: Answer(f"the sum is {so_far.last.result.value['result']}"),
    ).play(client, agent)

A model loop offers the model the agent's wire schemas, executes each tool call the model makes
and shows it the result, until the model answers. `TurnScript` does the same with turns written
in advance: `RunCode(program)` and `CallTool(name, arguments)` execute a call (a direct call the
agent's mode refuses comes back as the registry's error result, as it would for a model),
`Answer(text)` ends the conversation. A turn may be a function of the conversation so far, to
answer from what a call returned. (It drives the registry, not a model API: for an HTTP server
that speaks a vendor's API to its SDK, see the CLI's scripted model server.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from codemode_wire.jsonvalue import JsonValue

if TYPE_CHECKING:
    from codemode_client.client import RegistryClient, ToolCallResult


@dataclass(frozen=True)
class RunCode:
    """The model calls `run_code` with this program."""

    program: str
    description: str = "a scripted program"


@dataclass(frozen=True)
class CallTool:
    """The model calls a tool directly."""

    name: str
    arguments: JsonValue = None


@dataclass(frozen=True)
class Answer:
    """The model answers with this text: the conversation ends."""

    text: str


Turn = RunCode | CallTool | Answer
ScriptedTurn = Turn | Callable[["Conversation"], Turn]


@dataclass(frozen=True)
class Step:
    """One tool call of the conversation and the result the model was shown."""

    turn: RunCode | CallTool
    call_id: str
    result: ToolCallResult


@dataclass
class Conversation:
    agent: str
    offered: list[str]
    """The tool names on the wire when the conversation started (under `code`: `run_code`)."""
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None

    @property
    def last(self) -> Step:
        """The latest tool call's step."""
        if not self.steps:
            raise AssertionError("the conversation has made no tool call yet")
        return self.steps[-1]

    @property
    def call_ids(self) -> list[str]:
        return [step.call_id for step in self.steps]


class TurnScript:
    """A model that takes the given turns in order (see the module's docstring)."""

    def __init__(self, *turns: ScriptedTurn) -> None:
        self.turns = turns

    async def play(self, client: RegistryClient, agent: str) -> Conversation:
        """Plays every turn against `agent`; returns the conversation once it has answered
        (or run out of turns). A turn after the answer is a mistake in the script."""
        schemas = await client.wire_schemas(agent)
        offered = [str(s.get("name")) for s in schemas if isinstance(s, dict)]
        conversation = Conversation(agent, offered)
        for index, scripted in enumerate(self.turns):
            if conversation.answer is not None:
                raise ValueError(f"turn {index + 1} comes after the answer: {scripted!r}")
            turn = (
                scripted
                if isinstance(scripted, RunCode | CallTool | Answer)
                else scripted(conversation)
            )
            if isinstance(turn, Answer):
                conversation.answer = turn.text
                continue
            if not isinstance(turn, RunCode | CallTool):
                raise TypeError(f"turn {index + 1} is {turn!r}, not RunCode, CallTool or Answer")
            call_id = f"turn-{index + 1}-{uuid.uuid4().hex[:8]}"
            if isinstance(turn, RunCode):
                result = await client.run_code(
                    turn.program, turn.description, agent=agent, call_id=call_id
                )
            else:
                result = await client.call(turn.name, turn.arguments, agent=agent, call_id=call_id)
            conversation.steps.append(Step(turn, call_id, result))
        return conversation
