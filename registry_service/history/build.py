"""Builds history records from calls and their results (one home for both layers)."""

from __future__ import annotations

import base64
import time
import uuid

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.results import ImageBlock, TextBlock, ToolResult, error_result
from registry_service.history.records import END_OF, INTERRUPTED, Record

# Why an interrupted call has no real end record.
CRASHED = "the registry stopped before the call finished"
NOT_RECORDED = "its end could not be recorded (the history store was unavailable)"


def content_json(result: ToolResult) -> str:
    """The final rendered content as JSON text, every block in full (image data in base64)."""
    blocks: list[JsonValue] = []
    for block in result.content:
        if isinstance(block, TextBlock):
            blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            data = base64.b64encode(block.data).decode("ascii")
            blocks.append({"type": "image", "mime_type": block.mime_type, "data": data})
        else:
            blocks.append({"type": "json", "json": block.json})
    return jsonvalue.dumps(blocks)


def content_preview(content: str, limit: int) -> str:
    """What a record whose content was spilled keeps inline: its blocks as text (an image as a
    placeholder naming its type and size), cut to `limit` characters."""
    parts: list[str] = []
    size = 0
    blocks = jsonvalue.loads(content)
    for block in blocks if isinstance(blocks, list) else []:
        if size > limit:
            break
        if not isinstance(block, dict):
            continue
        if block.get("type") == "image":
            data = block.get("data")
            length = len(base64.b64decode(data)) if isinstance(data, str) else 0
            part = f"[image {block.get('mime_type', '')}, {length} bytes]"
        else:
            part = str(block.get("text", block.get("json", "")))
        parts.append(part)
        size += len(part) + 1
    return "\n".join(parts)[:limit]


def record(
    kind: str,
    *,
    agent: str,
    agent_id: str,
    call_id: str,
    root_call_id: str,
    parent_call_id: str,
    name: str,
    arguments_json: str = "",
    result: ToolResult | None = None,
) -> Record:
    return Record(
        kind=kind,
        agent=agent,
        agent_id=agent_id,
        call_id=call_id,
        root_call_id=root_call_id,
        parent_call_id=parent_call_id,
        name=name,
        arguments_json=arguments_json,
        content_json=content_json(result) if result is not None else "",
        is_error=bool(result and result.is_error),
        error_code=result.error.code if result is not None and result.error else "",
        time=time.time(),
    )


def agent_message(
    kind: str,
    *,
    agent: str,
    agent_id: str,
    source: str,
    text: str,
    metadata: dict[str, JsonValue],
) -> Record:
    """An `agent/steer` or `agent/inject` record: `text` for the agent, written by `source`.

    Its call ids are its own (`<kind>:<uuid>`): it belongs to no tool call, and retention
    prunes it as a call of its own."""
    call_id = f"{kind}:{uuid.uuid4().hex}"
    return record(
        kind,
        agent=agent,
        agent_id=agent_id,
        call_id=call_id,
        root_call_id=call_id,
        parent_call_id="",
        name=source,
        arguments_json=jsonvalue.dumps(metadata),
        result=ToolResult((TextBlock(text),)),
    )


def interrupted(start: Record, why: str) -> Record:
    """The end record that closes a call its process never finished (`start` is its start
    record, or the end record that could not be written): an error result with code
    `INTERRUPTED`, saying `why`."""
    message = f"tool call {start.name!r} interrupted: {why}"
    return record(
        END_OF.get(start.kind, start.kind),
        agent=start.agent,
        agent_id=start.agent_id,
        call_id=start.call_id,
        root_call_id=start.root_call_id,
        parent_call_id=start.parent_call_id,
        name=start.name,
        # A settle record carries the dispatched arguments, as its start does.
        arguments_json=start.arguments_json if start.parent_call_id else "",
        result=error_result(message, INTERRUPTED, "InterruptedError"),
    )
