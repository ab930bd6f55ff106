"""MCP tools and results in the catalog's and the pipeline's terms (losslessly).

- A tool: its name, description (the title first when it has one), `inputSchema`, and
  `outputSchema` when declared (else none, `{}`); `readOnlyHint: true` makes it
  concurrency-safe (a read-only tool may overlap others in a program; everything else runs
  alone). The catalog itself refuses what it cannot express (`tools.validate_definition`).
- A result: text blocks as text, images as the pipeline's image blocks (bytes and MIME
  type), every other block (audio, resources, links) as a JSON block of its MCP form;
  `structuredContent` as the result's value; `isError: true` as a tool failure with code
  MCP_TOOL_ERROR and the content kept. A result is mapped from its wire form, which the SDK's
  session has already checked against the negotiated protocol version's schema
  (`ClientSession.send_request`, see registry_service/mcp/connector.py): it is not parsed
  into the SDK's models a second time.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import mcp_types

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue, JsonValueError
from registry_service.domain.mcp_servers import MCP_TOOL_ERROR, McpCallFailed
from registry_service.domain.providers import ToolSpec
from registry_service.domain.results import (
    INVALID_TOOL_OUTPUT,
    ContentBlock,
    ErrorInfo,
    ImageBlock,
    JsonBlock,
    TextBlock,
    ToolResult,
    text_of,
)


def tool_spec(tool: mcp_types.Tool, max_depth: int) -> ToolSpec:
    """Raises McpCallFailed when a schema is not lossless JSON within the depth bound."""
    description = tool.description or ""
    title = tool.title or (tool.annotations.title if tool.annotations else None)
    if title and title != tool.name:
        description = f"{title}: {description}" if description else title
    read_only = bool(tool.annotations and tool.annotations.read_only_hint)
    return ToolSpec(
        name=tool.name,
        description=description,
        input_schema=_json(tool.input_schema, max_depth, "input schema"),
        output_schema=(
            {} if tool.output_schema is None else _json(tool.output_schema, max_depth, "output")
        ),
        concurrency_safe=read_only,
        guidance="",
    )


def _json(value: object, max_depth: int, what: str) -> JsonValue:
    return _json_and_text(value, max_depth, what)[0]


def _json_and_text(value: object, max_depth: int, what: str) -> tuple[JsonValue, str]:
    """`value` as lossless JSON within the depth bound, and its canonical text."""
    try:
        return jsonvalue.loads_canonical(jsonvalue.dumps(value), max_depth=max_depth)
    except (JsonValueError, ValueError) as exc:
        message = f"the {what} is not lossless JSON: {exc}"
        raise McpCallFailed(message, INVALID_TOOL_OUTPUT) from None


def _block(block: Mapping[str, Any], max_depth: int) -> ContentBlock:
    kind = block.get("type")
    if kind == "text":
        return TextBlock(block["text"])
    if kind == "image":
        try:
            data = base64.b64decode(block["data"], validate=True)
        except (binascii.Error, ValueError):
            raise McpCallFailed(
                "the server returned an image whose data is not base64", INVALID_TOOL_OUTPUT
            ) from None
        return ImageBlock(block["mimeType"], data)
    return JsonBlock(jsonvalue.dumps(_json(block, max_depth, "content block")))


def tool_result(result: Mapping[str, Any], max_depth: int) -> ToolResult:
    """`result`: a `tools/call` result in its wire form, already checked against the MCP schema
    of the session's protocol version (so `content` is a list of typed blocks, `isError` a
    boolean and `structuredContent` an object when present)."""
    content = tuple(_block(b, max_depth) for b in result.get("content") or ())
    if result.get("isError"):
        message = text_of(content) or "the MCP tool failed"
        return ToolResult(
            content=content or (TextBlock(f"Error: {message}"),),
            is_error=True,
            error=ErrorInfo(message, MCP_TOOL_ERROR),
        )
    structured = result.get("structuredContent")
    if structured is None:
        return ToolResult(content=content)
    value, text = _json_and_text(structured, max_depth, "structured content")
    return ToolResult(content=content, value=value, has_value=True, value_json=text)
