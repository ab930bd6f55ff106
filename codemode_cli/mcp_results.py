"""What `codemode mcp serve` answers a `tools/call` with: the registry's result as an MCP
`CallToolResult`, and every failure as an MCP tool error (`isError: true`) that keeps its code.

A tool failure of the registry (a `ToolResult` with `is_error`) keeps its content and adds its
code; a refused call (a gRPC status: `PERMISSION_DENIED`, `RESOURCE_EXHAUSTED`, ...) becomes a
tool error whose text names the status and the `ErrorInfo` reason. Either way the codes also
travel in `_meta["codemode"]`, so a program reading MCP results can branch on them without
parsing text. Nothing here calls the registry.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mcp_types as types

from codemode_client.results import ContentBlock, ImageContent, JsonContent, TextContent
from codemode_wire import jsonvalue

if TYPE_CHECKING:
    from codemode_client.client import ToolCallResult
    from codemode_client.errors import CodemodeError

META_KEY = "codemode"
"""The `_meta` key of a result's Codemode details: call id, error code, reason."""


def content_blocks(result: ToolCallResult) -> list[types.ContentBlock]:
    """The result's content as MCP blocks, then its additional contexts' (added to the
    conversation after the result; an MCP result is one message, so they follow it)."""
    blocks = _blocks(result.content)
    for context in result.additional_contexts:
        blocks.extend(_blocks(context.content))
    return blocks


def _blocks(content: Sequence[ContentBlock]) -> list[types.ContentBlock]:
    """Text as text, images as base64 images, JSON blocks as their lossless JSON text (MCP has
    no JSON block)."""
    blocks: list[types.ContentBlock] = []
    for block in content:
        if isinstance(block, TextContent):
            blocks.append(types.TextContent(text=block.text))
        elif isinstance(block, ImageContent):
            data = base64.b64encode(block.data).decode("ascii")
            blocks.append(types.ImageContent(data=data, mime_type=block.mime_type))
        elif isinstance(block, JsonContent):
            blocks.append(types.TextContent(text=jsonvalue.dumps(block.value)))
    return blocks


def tool_result(result: ToolCallResult, call_id: str) -> types.CallToolResult:
    """A registry result, success or tool failure. A success whose value is a JSON object is
    also the structured content (what a program gets); other values stay in the text."""
    meta: dict[str, Any] = {"call_id": call_id}
    blocks = content_blocks(result)
    if result.is_error:
        meta["error_code"] = result.error_code
        label = f"[{result.error_code}] " if result.error_code else ""
        if not any(isinstance(b, types.TextContent) for b in blocks):
            blocks.insert(0, types.TextContent(text=f"{label}{result.error_message}"))
        elif label:
            blocks.insert(0, types.TextContent(text=label.strip()))
    if result.concludes_turn:
        meta["concludes_turn"] = True
    structured = result.value if not result.is_error and isinstance(result.value, dict) else None
    return types.CallToolResult(
        content=blocks,
        structured_content=structured,
        is_error=result.is_error,
        _meta={META_KEY: meta},
    )


def refused(exc: CodemodeError, call_id: str) -> types.CallToolResult:
    """A call the registry refused with a gRPC status (nothing ran, or it was cut short)."""
    status = exc.code.name
    why = f"{status}, {exc.reason}" if exc.reason else status
    meta: dict[str, Any] = {"call_id": call_id, "error_code": status}
    if exc.reason:
        meta["reason"] = exc.reason
    if exc.retry_delay is not None:
        meta["retry_after_s"] = exc.retry_delay
    text = f"[{status}] the registry refused the call: {exc.message} ({why})"
    return types.CallToolResult(
        content=[types.TextContent(text=text)], is_error=True, _meta={META_KEY: meta}
    )


def bad_arguments(message: str, call_id: str) -> types.CallToolResult:
    """Arguments that cannot be sent as lossless JSON (refused here, before any call exists)."""
    meta = {"call_id": call_id, "error_code": "INVALID_ARGS"}
    text = f"[INVALID_ARGS] {message}"
    return types.CallToolResult(
        content=[types.TextContent(text=text)], is_error=True, _meta={META_KEY: meta}
    )
