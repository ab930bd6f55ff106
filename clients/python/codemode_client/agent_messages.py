"""Messages to the agent in its history: `agent/steer` and `agent/inject` records as typed
events.

The registry writes them for what the agent could not see in a tool result (a dynamic Cordis
plugin whose host died after its activation, an activation that ended after `cordis_run`
returned): `steer` asks the backend to wake the agent, `inject` is context for its next step.
The backend that runs the agent loop watches the history and hands them to the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import history_pb2
from codemode_wire.jsonvalue import JsonValue

STEER_KIND = "agent/steer"
INJECT_KIND = "agent/inject"
_KINDS: dict[str, Literal["steer", "inject"]] = {STEER_KIND: "steer", INJECT_KIND: "inject"}


@dataclass(frozen=True, slots=True)
class AgentMessage:
    """One `agent/steer` (`kind="steer"`) or `agent/inject` (`kind="inject"`) record."""

    kind: Literal["steer", "inject"]
    agent: str
    seq: int
    source: str  # who wrote it, e.g. "cordis-host-runner"
    text: str
    metadata: dict[str, JsonValue] = field(default_factory=dict)  # e.g. pluginId, pluginRunId
    time: float = 0.0  # Unix time it was written


def agent_message(record: history_pb2.HistoryRecord) -> AgentMessage | None:
    """The typed message a history record carries, None for any other record."""
    kind = _KINDS.get(record.kind)
    if kind is None:
        return None
    metadata = jsonvalue.loads(record.arguments_json) if record.arguments_json else {}
    return AgentMessage(
        kind=kind,
        agent=record.agent,
        seq=record.seq,
        source=record.tool_name,
        text="".join(b.text.text for b in record.content if b.WhichOneof("block") == "text"),
        metadata=metadata if isinstance(metadata, dict) else {},
        time=record.time.ToMicroseconds() / 1e6 if record.HasField("time") else 0.0,
    )
