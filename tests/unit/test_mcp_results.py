"""How `codemode mcp serve` maps a registry result or refusal to an MCP `CallToolResult`."""

from __future__ import annotations

import base64

import grpc
import mcp_types as types

from codemode_cli import mcp_results
from codemode_client.client import ToolCallResult
from codemode_client.errors import ResourceExhausted
from codemode_client.results import AdditionalContext, ImageContent, JsonContent, TextContent

PNG = b"\x89PNG\r\n\x1a\n-not-really"


def result(**fields: object) -> ToolCallResult:
    base: dict[str, object] = {
        "is_error": False,
        "value": None,
        "has_value": False,
        "text": "",
        "error_code": "",
        "error_message": "",
        "concludes_turn": False,
    }
    return ToolCallResult(**{**base, **fields})  # type: ignore[arg-type]


def test_text_images_json_and_contexts_keep_their_kind_and_order() -> None:
    shown = result(
        value={"width": 2},
        has_value=True,
        content=(TextContent("the page:"), ImageContent(PNG, "image/png"), JsonContent([1, 2])),
        additional_contexts=(AdditionalContext([TextContent("cookies accepted")], "browser"),),
        concludes_turn=True,
    )
    mapped = mcp_results.tool_result(shown, "mcp-1")
    assert not mapped.is_error
    kinds = [type(b).__name__ for b in mapped.content]
    assert kinds == ["TextContent", "ImageContent", "TextContent", "TextContent"]
    image = mapped.content[1]
    assert isinstance(image, types.ImageContent)
    assert (base64.b64decode(image.data), image.mime_type) == (PNG, "image/png")
    assert [getattr(b, "text", None) for b in mapped.content[2:]] == ["[1,2]", "cookies accepted"]
    assert mapped.structured_content == {"width": 2}
    assert mapped.meta == {"codemode": {"call_id": "mcp-1", "concludes_turn": True}}


def test_a_value_that_is_not_an_object_stays_out_of_structured_content() -> None:
    mapped = mcp_results.tool_result(result(value=[1], has_value=True), "mcp-2")
    assert mapped.structured_content is None


def test_a_tool_failure_keeps_its_content_and_leads_with_its_code() -> None:
    failed = result(
        is_error=True,
        error_code="INVALID_ARGS",
        error_message="n must be an integer",
        content=(TextContent("Error: n must be an integer"),),
    )
    mapped = mcp_results.tool_result(failed, "mcp-3")
    assert mapped.is_error
    assert [getattr(b, "text", None) for b in mapped.content] == [
        "[INVALID_ARGS]",
        "Error: n must be an integer",
    ]
    assert mapped.meta == {"codemode": {"call_id": "mcp-3", "error_code": "INVALID_ARGS"}}
    bare = mcp_results.tool_result(result(is_error=True, error_message="boom"), "mcp-4")
    assert [getattr(b, "text", None) for b in bare.content] == ["boom"]


def test_a_refusal_keeps_the_status_reason_and_retry_delay() -> None:
    exc = ResourceExhausted(
        "over agents/a's max_concurrent_runs (8)", reason="ADMISSION_LIMIT", retry_delay=1.0
    )
    mapped = mcp_results.refused(exc, "mcp-5")
    assert mapped.is_error
    (text,) = mapped.content
    assert isinstance(text, types.TextContent)
    assert text.text.startswith("[RESOURCE_EXHAUSTED] the registry refused the call: over")
    assert text.text.endswith("(RESOURCE_EXHAUSTED, ADMISSION_LIMIT)")
    assert mapped.meta == {
        "codemode": {
            "call_id": "mcp-5",
            "error_code": "RESOURCE_EXHAUSTED",
            "reason": "ADMISSION_LIMIT",
            "retry_after_s": 1.0,
        }
    }
    assert exc.code is grpc.StatusCode.RESOURCE_EXHAUSTED
