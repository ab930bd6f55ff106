"""The history record: its kinds, the record itself, what every store can hold, and how records
are built from calls and their results (one home for both layers). The store interface is in
`registry_service/history/store.py`; stores import this module, never the other way round."""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from codemode_wire.text import has_lone_surrogate, utf8_exceeds
from registry_service.domain.results import ImageBlock, TextBlock, ToolResult, error_result

TOOL_CALL = "tool/call"
TOOL_RESULT = "tool/result"
DISPATCH_START = "tool/code-dispatch-start"
DISPATCH = "tool/code-dispatch"
# Messages to the agent's backend, not tool calls: `agent/steer` wakes the agent (an outcome it
# could not see in a tool result: a late activation outcome, a plugin host that died), and
# `agent/inject` is context for its next step (a person's panel action). `name` is the source
# that wrote it (e.g. `cordis-host-runner`), `arguments_json` a JSON object of source metadata
# (plugin, package and run ids), the content one text block.
AGENT_STEER = "agent/steer"
AGENT_INJECT = "agent/inject"
# An administrative change (presets, agents, modes, restrictions) and who made it: `name` is
# the RPC, `arguments_json` `{"principal", "resource", "request"}`. Kept in one audit log, the
# history of the global scope (agent `""`), so that deleting or re-creating an agent neither
# erases nor inherits the trail; read it with ListHistory/WatchHistory for the empty agent.
ADMIN_AUDIT = "admin/audit"
# A tool call refused for want of a permission (registry_service/domain/tool_access.py), by any
# path (direct, a run_code program, a plugin host): `name` is the tool, `arguments_json`
# `{"principal", "permission", "resource", "agent", "tool", "call_id", "parent_call_id",
# "via"}` (never the call's arguments), `is_error` with `error_code` PERMISSION_DENIED. In the
# same audit log.
ACCESS_DENIED = "access/denied"
AUDIT_LOG = ""
KINDS = (
    TOOL_CALL,
    TOOL_RESULT,
    DISPATCH_START,
    DISPATCH,
    AGENT_STEER,
    AGENT_INJECT,
    ADMIN_AUDIT,
    ACCESS_DENIED,
)
# Only the outer layer derives model messages; nested records are log-only.
MODEL_KINDS = frozenset({TOOL_CALL, TOOL_RESULT})
# Each start record and the record that closes its call.
END_OF = {TOOL_CALL: TOOL_RESULT, DISPATCH_START: DISPATCH}
# The error code of an end record written for a call its process never finished (a crash, or
# an end record the store failed to write).
INTERRUPTED = "INTERRUPTED"


@dataclass(frozen=True, slots=True)
class Record:
    """One history record. `content_json` is the final rendered content as JSON text (a list of
    blocks), or a spill preview when the content was larger than the inline limit."""

    kind: str
    agent: str  # the agent's name, `agents/{id}` (shown; a re-created name has a new id)
    call_id: str  # the outer call id, or the sub-call id for nested records
    root_call_id: str
    parent_call_id: str  # "" for outer records
    name: str
    arguments_json: str = ""
    content_json: str = ""
    is_error: bool = False
    error_code: str = ""
    time: float = 0.0
    seq: int = 0  # assigned by the store, strictly increasing
    spilled: str = ""  # locator of the full content when spilled
    # The agent's stable identity: the key of its history (`list`, `watch`, calls left open).
    agent_id: str = ""


# What every store can hold, whatever its backend: Unicode text without NUL (PostgreSQL's text
# holds no NUL, and no backend encodes a lone surrogate as UTF-8), and indexed fields short
# enough to index (a PostgreSQL btree entry holds about 2.7 kB, the agent id included). The API
# edge refuses such values in requests, and maps a provider's (servicer.py, convert.py); a store
# refuses a record that still holds one, alone (history/store.py), without failing the others.
MAX_KEY_BYTES = 1024
# A request's call id: its nested calls' ids (`<call_id>:code:<n>`) are keys too.
MAX_CALL_ID_BYTES = 512
_KEY_FIELDS = ("agent_id", "call_id", "root_call_id", "parent_call_id")  # indexed
_TEXT_FIELDS = ("kind", "agent", "name", "error_code")
# JSON text, written by `codemode_wire.jsonvalue` (which escapes control characters and lone
# surrogates): only a NUL is looked for, at C speed (these may be megabytes).
_JSON_FIELDS = ("arguments_json", "content_json")


def text_problem(text: str) -> str:
    """Why no store can hold `text` ("" when every store can)."""
    if "\x00" in text:
        return "a NUL character"
    if has_lone_surrogate(text):
        return "a lone surrogate (not Unicode text)"
    return ""


def key_problem(text: str, limit: int = MAX_KEY_BYTES) -> str:
    """Why no store can hold `text` in an indexed field ("" when every store can)."""
    if problem := text_problem(text):
        return problem
    if utf8_exceeds(text, limit):
        return f"more than {limit} bytes of UTF-8"
    return ""


def unstorable(record: Record) -> str:
    """Why no store can hold `record` ("" when every store can), naming the field."""
    for field in _KEY_FIELDS:
        if problem := key_problem(getattr(record, field)):
            return f"{field} holds {problem}"
    for field in _TEXT_FIELDS:
        if problem := text_problem(getattr(record, field)):
            return f"{field} holds {problem}"
    for field in _JSON_FIELDS:
        if "\x00" in getattr(record, field):
            return f"{field} holds a NUL character"
    return ""


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
