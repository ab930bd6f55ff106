"""Builds history records from calls and their results (one home for both layers)."""

from __future__ import annotations

import time

from codemode_common import jsonvalue
from codemode_common.jsonvalue import JsonValue
from registry_service.domain.results import ImageBlock, TextBlock, ToolResult
from registry_service.history.records import Record


def content_json(result: ToolResult) -> str:
    """The final rendered content as JSON text; image bytes are not kept, only their size."""
    blocks: list[JsonValue] = []
    for block in result.content:
        if isinstance(block, TextBlock):
            blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            blocks.append({"type": "image", "mime_type": block.mime_type, "bytes": len(block.data)})
        else:
            blocks.append({"type": "json", "json": block.json})
    return jsonvalue.dumps(blocks)


def record(
    kind: str,
    *,
    agent: str,
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
