"""History records as the CLI shows and exports them: listing one call's records (under one agent
or every agent) and a record as a JSON object."""

from __future__ import annotations

import asyncio
import datetime
from typing import TYPE_CHECKING

from codemode_cli.registry_access import agent_name

if TYPE_CHECKING:
    from codemode_client import RegistryClient
    from codemode_wire.api.registry.v1 import history_pb2
    from codemode_wire.jsonvalue import JsonValue

__all__ = ["list_records", "record_time", "record_to_json"]


async def list_records(
    client: RegistryClient, agent: str | None, call_id: str | None
) -> list[history_pb2.HistoryRecord]:
    """The agent's records (of `call_id` and its nested calls only, with one); without an
    agent, the call's records under every agent, in seq order."""
    if agent:
        return await client.history(agent_name(agent), call_id=call_id or "")
    agents = [a.name for a in await client.list_agents()]
    found = await asyncio.gather(*(client.history(a, call_id=call_id or "") for a in agents))
    return sorted((r for page in found for r in page), key=lambda r: r.seq)


def record_time(record: history_pb2.HistoryRecord) -> datetime.datetime:
    return record.time.ToDatetime(tzinfo=datetime.UTC)


def record_to_json(record: history_pb2.HistoryRecord) -> dict[str, JsonValue]:
    """A record as `--json` prints it (and `history export` writes it)."""
    from codemode_wire import jsonvalue

    content: list[JsonValue] = []
    for block in record.content:
        kind = block.WhichOneof("block")
        if kind == "text":
            content.append({"text": block.text.text})
        elif kind == "json":
            content.append({"json": jsonvalue.loads(block.json.json)})
        elif kind == "image":
            image = block.image
            content.append({"image": {"mime_type": image.mime_type, "bytes": len(image.data)}})
    arguments = jsonvalue.loads(record.arguments_json) if record.arguments_json else None
    return {
        "seq": record.seq,
        "time": record_time(record).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "kind": record.kind,
        "agent": record.agent,
        "call_id": record.call_id,
        "root_call_id": record.root_call_id,
        "parent_call_id": record.parent_call_id,
        "tool_name": record.tool_name,
        "arguments": arguments,
        "content": content,
        "is_error": record.is_error,
        "error_code": record.error_code,
        "spill_locator": record.spill_locator,
    }
