"""Translation between protobuf messages and domain objects (no behaviour lives here)."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from codemode_wire import jsonvalue, shared_logs
from codemode_wire.api.registry.v1 import history_pb2, scope_pb2, tool_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.errors import invalid_argument
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain import catalog, execution, records, results
from registry_service.domain.approvals import ApprovalOutcome, ApprovalRequest, ApproverMessage
from registry_service.domain.events import ToolProgress
from registry_service.domain.json_admission import (
    VALUE_TOO_DEEP,
    parse_text,
    parse_text_canonical,
)
from registry_service.domain.mcp_attachments import McpAttachment
from registry_service.domain.mcp_supervisor import McpServers
from registry_service.domain.providers import ToolSpec
from registry_service.domain.records import Record
from registry_service.domain.scopes import Mode
from registry_service.domain.tools import ToolDefinition

# The code of a provider's tool error whose own code no history store can hold.
PROVIDER_ERROR_CODE_INVALID = "PROVIDER_ERROR_CODE_INVALID"

_MODES = {
    Mode.NATIVE: scope_pb2.PRESENTATION_MODE_NATIVE,
    Mode.CODE: scope_pb2.PRESENTATION_MODE_CODE,
    Mode.BOTH: scope_pb2.PRESENTATION_MODE_BOTH,
}
_MODES_BACK = {v: k for k, v in _MODES.items()}
_OUTCOMES = {
    ApprovalOutcome.ALLOWED_ONCE: rpb.APPROVAL_OUTCOME_ALLOWED_ONCE,
    ApprovalOutcome.REJECTED: rpb.APPROVAL_OUTCOME_REJECTED,
    ApprovalOutcome.CANCELLED: rpb.APPROVAL_OUTCOME_CANCELLED,
    ApprovalOutcome.UNAVAILABLE: rpb.APPROVAL_OUTCOME_UNAVAILABLE,
    ApprovalOutcome.EXPIRED: rpb.APPROVAL_OUTCOME_EXPIRED,
}
_OUTCOMES_BACK = {v: k for k, v in _OUTCOMES.items()}


def parse_json(
    text: str, field: str, *, default: JsonValue = None, max_depth: int | None = None
) -> JsonValue:
    """Parses a JSON text field; empty text gives `default`. Bad JSON is INVALID_ARGUMENT
    (INVALID_JSON, or VALUE_TOO_DEEP past `max_depth`)."""
    if not text:
        return default
    return parse_text(text, field, max_depth=max_depth, too_deep=VALUE_TOO_DEEP)


def mode_from_proto(value: int, *, allow_unspecified: bool) -> Mode | None:
    if value == scope_pb2.PRESENTATION_MODE_UNSPECIFIED and allow_unspecified:
        return None
    mode: Mode | None = _MODES_BACK.get(value)  # type: ignore[call-overload]
    if mode is None:
        raise invalid_argument(
            "INVALID_MODE", f"presentation mode {value} is not valid", field="mode"
        )
    return mode


def mode_to_proto(mode: Mode | None) -> scope_pb2.PresentationMode.ValueType:
    return _MODES[mode] if mode is not None else scope_pb2.PRESENTATION_MODE_UNSPECIFIED


def outcome_to_proto(outcome: ApprovalOutcome) -> rpb.ApprovalOutcome.ValueType:
    return _OUTCOMES[outcome]


def approver_message(message: ApproverMessage) -> rpb.ApproveResponse:
    """The message an approver stream sends; its size is what the broker compares with each
    approver's receive limit (`approval_request_bytes`)."""
    if isinstance(message, ApprovalRequest):
        return rpb.ApproveResponse(request=approval_request_to_proto(message))
    return rpb.ApproveResponse(
        withdrawn=rpb.ApprovalWithdrawn(
            approval_id=message.approval_id, outcome=outcome_to_proto(message.outcome)
        )
    )


def approval_request_to_proto(request: ApprovalRequest) -> rpb.ApprovalRequest:
    """A request as approvers see it (a stream's `request`, a ListPendingApprovals entry)."""
    message = rpb.ApprovalRequest(
        approval_id=request.approval_id,
        call_id=request.call_id,
        agent=request.agent,
        tool_name=request.tool_name,
        arguments_json=request.arguments_json,
        reason=request.reason,
    )
    if request.expires_at is not None:
        message.expire_time.CopyFrom(_timestamp(request.expires_at))
    return message


def approval_request_bytes(request: ApprovalRequest) -> int:
    """The encoded size of the message that carries `request` to an approver, computed without
    encoding its arguments (up to `max_message_bytes` of them: not work for the event loop):
    the rest of the message is measured, and the arguments field (`arguments_json`, field 5)
    and the enclosing `request` field (field 2) are added as protobuf spells them, a one-byte
    tag and a varint length before each."""
    rest = dataclasses.replace(request, arguments_json="")
    inner = approver_message(rest).request.ByteSize()
    size = len(request.arguments_json.encode())
    if size:
        inner += 1 + _varint_bytes(size) + size
    return 1 + _varint_bytes(inner) + inner


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def outcome_from_proto(value: int) -> ApprovalOutcome | None:
    outcome: ApprovalOutcome | None = _OUTCOMES_BACK.get(value)  # type: ignore[call-overload]
    return outcome


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def optional_bool(message: Any, field: str) -> bool | None:
    """A proto3 `optional bool`: None when unset (the scope does not declare it)."""
    return bool(getattr(message, field)) if message.HasField(field) else None


def mcp_servers_from_proto(servers: Any) -> tuple[McpAttachment, ...]:
    """A scope's attachments as asked (what may be attached is `McpServers.admit`'s)."""
    return tuple(
        McpAttachment(
            server=server.server, url=server.url, headers=tuple(sorted(server.headers.items()))
        )
        for server in servers
    )


def mcp_servers_to_proto(
    scope: str, scopes: catalog.Catalog, mcp: McpServers | None
) -> list[scope_pb2.McpServer]:
    """The scope's attachments with their state here; header values are never returned."""
    answers = []
    for attachment in scopes.declared_mcp_servers(scope):
        answer = scope_pb2.McpServer(headers={name: "" for name, _ in attachment.headers})
        if attachment.server:
            answer.server = attachment.server
        else:
            answer.url = attachment.url
        if mcp is not None:
            status = mcp.status(scope, attachment)
            answer.state = status.state
            answer.last_error = status.last_error
            answer.refused_tools.extend(status.refused_tools)
        answers.append(answer)
    return answers


def preset_to_proto(
    preset: catalog.Preset, scopes: catalog.Catalog, mcp: McpServers | None = None
) -> scope_pb2.Preset:
    return scope_pb2.Preset(
        name=preset.name,
        mode=mode_to_proto(scopes.declared_mode(preset.name)),
        create_time=_timestamp(preset.create_time),
        code_language=scopes.declared_language(preset.name) or "",
        self_modification=scopes.declared_self_modification(preset.name),
        mcp_servers=mcp_servers_to_proto(preset.name, scopes, mcp),
    )


def agent_to_proto(
    agent: catalog.Agent, scopes: catalog.Catalog, mcp: McpServers | None = None
) -> scope_pb2.Agent:
    return scope_pb2.Agent(
        name=agent.name,
        preset=agent.preset,
        mode=mode_to_proto(scopes.declared_mode(agent.name)),
        effective_mode=mode_to_proto(scopes.mode_for(agent.name)),
        create_time=_timestamp(agent.create_time),
        code_language=scopes.declared_language(agent.name) or "",
        effective_code_language=scopes.language_for(agent.name),
        self_modification=scopes.declared_self_modification(agent.name),
        effective_self_modification=scopes.self_modification_for(agent.name),
        agent_id=agent.agent_id,
        mcp_servers=mcp_servers_to_proto(agent.name, scopes, mcp),
    )


def tool_to_proto(defn: ToolDefinition, scope: str) -> tool_pb2.Tool:
    return tool_pb2.Tool(
        name=defn.name,
        description=defn.description,
        input_schema_json=jsonvalue.dumps(defn.input_schema),
        output_schema_json=jsonvalue.dumps(defn.output_schema),
        concurrency=tool_pb2.CONCURRENCY_SAFE
        if defn.declared_safe
        else tool_pb2.CONCURRENCY_EXCLUSIVE,
        guidance=defn.guidance,
        owner=defn.owner,
        scope=scope,
    )


def tool_spec_from_proto(tool: tool_pb2.Tool) -> ToolSpec:
    where = f'tool "{tool.name}"'
    return ToolSpec(
        name=tool.name,
        description=tool.description,
        input_schema=parse_json(
            tool.input_schema_json, f"{where} input_schema_json", default={"type": "object"}
        ),
        output_schema=parse_json(
            tool.output_schema_json, f"{where} output_schema_json", default={}
        ),
        concurrency_safe=tool.concurrency == tool_pb2.CONCURRENCY_SAFE,
        guidance=tool.guidance,
    )


def content_to_proto(block: results.ContentBlock) -> tool_pb2.ContentBlock:
    if isinstance(block, results.TextBlock):
        return tool_pb2.ContentBlock(text=tool_pb2.TextContent(text=block.text))
    if isinstance(block, results.ImageBlock):
        return tool_pb2.ContentBlock(
            image=tool_pb2.ImageContent(mime_type=block.mime_type, data=block.data)
        )
    return tool_pb2.ContentBlock(json=tool_pb2.JsonContent(json=block.json))


def content_from_proto(
    block: tool_pb2.ContentBlock, max_depth: int | None = None
) -> results.ContentBlock:
    kind = block.WhichOneof("block")
    if kind == "text":
        return results.TextBlock(block.text.text)
    if kind == "image":
        return results.ImageBlock(block.image.mime_type, block.image.data)
    if kind == "json":
        if not block.json.json:
            return results.JsonBlock(jsonvalue.dumps(None))  # `parse_json`'s default
        _, canonical = parse_text_canonical(
            block.json.json, "content json block", max_depth=max_depth, too_deep=VALUE_TOO_DEEP
        )
        return results.JsonBlock(canonical)
    raise invalid_argument("INVALID_CONTENT", "a content block must set text, image or json")


def result_to_proto(result: results.ToolResult) -> tool_pb2.ToolResult:
    message = tool_pb2.ToolResult(
        content=[content_to_proto(b) for b in result.content],
        is_error=result.is_error,
        additional_contexts=[
            tool_pb2.AdditionalContext(
                content=[content_to_proto(b) for b in c.content], source=c.source
            )
            for c in result.additional_contexts
        ],
        concludes_turn=result.concludes_turn,
    )
    if result.has_value and not result.is_error:
        message.value_json = result.value_json or jsonvalue.dumps(result.value)
    if result.presentation_meta is not None:
        message.presentation_meta_json = jsonvalue.dumps(result.presentation_meta)
    if result.error is not None:
        message.error.CopyFrom(
            tool_pb2.ToolError(
                message=result.error.message, code=result.error.code, name=result.error.name
            )
        )
    return message


def result_from_proto(
    message: tool_pb2.ToolResult, max_depth: int | None = None
) -> results.ToolResult:
    """A provider's result, its JSON nesting at most `max_depth` deep. An error without a
    message gets a generic one. Shared logs (a provider has no need to send them, but the wire
    type allows them) are restored, so they mean here what they mean to a client."""
    try:
        shared_logs.restore(message)
    except ValueError as exc:
        raise invalid_argument("INVALID_SHARED_LOGS", str(exc)) from None
    content = tuple(content_from_proto(b, max_depth) for b in message.content)
    contexts = tuple(
        results.AdditionalContext(
            tuple(content_from_proto(b, max_depth) for b in c.content), c.source
        )
        for c in message.additional_contexts
    )
    if message.is_error:
        text = message.error.message or results.text_of(content) or "tool failed"
        code = message.error.code
        if problem := records.text_problem(code):
            # Stored as is, it would fail the call's records (and, batched, others'): the call
            # settles as the tool error it is, under a code that says the provider's was bad.
            text = f"{text} (the tool provider's error code was refused: it holds {problem})"
            code = PROVIDER_ERROR_CODE_INVALID
        failed = results.error_result(text, code, message.error.name)
        return results.ToolResult(
            content=content or failed.content,
            is_error=True,
            error=failed.error,
            additional_contexts=contexts,
        )
    has_value = message.HasField("value_json")
    value: JsonValue = None
    value_json = ""
    if has_value and message.value_json:
        # Decoded and written canonical in one pass: no decode -> encode of the value.
        value, value_json = parse_text_canonical(
            message.value_json, "result value_json", max_depth=max_depth, too_deep=VALUE_TOO_DEEP
        )
    elif has_value:
        value_json = jsonvalue.dumps(None)  # an empty text means null (`parse_json`)
    meta = (
        parse_json(message.presentation_meta_json, "presentation_meta_json", max_depth=max_depth)
        if message.HasField("presentation_meta_json")
        else None
    )
    return results.ToolResult(
        content=content,
        value=value,
        has_value=has_value,
        presentation_meta=meta,
        # Canonical text of a value decoded here and held by no one else: never copied again.
        value_json=value_json,
        additional_contexts=contexts,
        concludes_turn=message.concludes_turn,
    )


def event_to_proto(event: execution.Event) -> rpb.ExecuteToolCallResponse:
    if isinstance(event, execution.NestedCallStarted):
        return rpb.ExecuteToolCallResponse(
            nested_started=history_pb2.NestedCallStarted(
                sub_call_id=event.sub_call_id,
                tool_name=event.tool_name,
                queue_wait_ms=event.queue_wait_ms,
            )
        )
    if isinstance(event, execution.NestedCallSettled):
        return rpb.ExecuteToolCallResponse(
            nested_settled=history_pb2.NestedCallSettled(
                sub_call_id=event.sub_call_id,
                tool_name=event.tool_name,
                is_error=event.is_error,
                error_code=event.error_code,
                duration_ms=event.duration_ms,
            )
        )
    if isinstance(event, execution.ProgramLog):
        return rpb.ExecuteToolCallResponse(log=history_pb2.ProgramLog(text=event.text))
    if isinstance(event, ToolProgress):
        return rpb.ExecuteToolCallResponse(
            tool_progress=rpb.ToolProgress(
                call_id=event.call_id,
                tool_name=event.tool_name,
                progress=event.progress,
                total=event.total,
                message=event.message,
            )
        )
    if isinstance(event, execution.CallStarted):
        return rpb.ExecuteToolCallResponse(
            started=rpb.CallStarted(call_id=event.call_id, tool_name=event.tool_name)
        )
    if isinstance(event, execution.ApprovalPending):
        return rpb.ExecuteToolCallResponse(
            approval_pending=rpb.ApprovalPending(approval_id=event.approval_id, reason=event.reason)
        )
    return rpb.ExecuteToolCallResponse(
        approval_resolved=rpb.ApprovalResolved(
            approval_id=event.approval_id, outcome=outcome_to_proto(event.outcome)
        )
    )


def _block_from_json(block: JsonValue) -> tool_pb2.ContentBlock:
    if isinstance(block, dict) and block.get("type") == "text":
        return tool_pb2.ContentBlock(text=tool_pb2.TextContent(text=str(block.get("text", ""))))
    if isinstance(block, dict) and block.get("type") == "json":
        return tool_pb2.ContentBlock(json=tool_pb2.JsonContent(json=str(block.get("json", ""))))
    # Records written before image data was kept hold only the image's size.
    mime = block.get("mime_type", "") if isinstance(block, dict) else ""
    data = block.get("data") if isinstance(block, dict) else None
    image = tool_pb2.ImageContent(
        mime_type=str(mime), data=base64.b64decode(data) if isinstance(data, str) else b""
    )
    return tool_pb2.ContentBlock(image=image)


def content_from_json(content: str) -> list[tool_pb2.ContentBlock]:
    """A history record's content JSON (`records.content_json`) as content blocks."""
    blocks = jsonvalue.loads(content) if content else []
    return [_block_from_json(b) for b in blocks] if isinstance(blocks, list) else []


def record_to_proto(record: Record) -> history_pb2.HistoryRecord:
    return history_pb2.HistoryRecord(
        seq=record.seq,
        kind=record.kind,
        agent=record.agent,
        call_id=record.call_id,
        root_call_id=record.root_call_id,
        parent_call_id=record.parent_call_id,
        tool_name=record.name,
        arguments_json=record.arguments_json,
        content=content_from_json(record.content_json),
        is_error=record.is_error,
        error_code=record.error_code,
        time=_timestamp(record.time),
        spill_locator=record.spilled,
        agent_id=record.agent_id,
    )
