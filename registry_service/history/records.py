"""History record kinds and the record itself (the store interface is in `history.store`)."""

from __future__ import annotations

from dataclasses import dataclass

from codemode_wire.text import has_lone_surrogate, utf8_exceeds

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
# refuses a record that still holds one, alone (history.store), without failing the others.
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
