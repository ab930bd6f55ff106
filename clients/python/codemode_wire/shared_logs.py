"""Logs that a tool result carries once on the wire (`ToolResult.shared_logs`).

A `run_code` result shows its program's logs twice: in its value (`{"logs": [...], ...}`) and
at the start of its content text (the logs joined by newlines, then the rendered result). Sent
whole, output over about half the message limit cannot be sent at all. To a request that set
`share_logs`, the registry sends the logs once, in `shared_logs`, and leaves them out of
`value_json` and of the first content block's text; the client restores the result as shown
before anything reads it. Both directions work on the JSON *text*, so the restored `value_json`
is byte for byte the one the registry would have sent whole.

`share` only strips what `restore` puts back exactly: a result whose value or text does not
start with its logs (a post-execute hook rewrote it, say) goes whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import tool_pb2

__all__ = ["restore", "share"]


def _value_head(logs: Sequence[str]) -> str:
    return '{"logs":' + jsonvalue.dumps(list(logs))


def share(message: tool_pb2.ToolResult, logs: Sequence[str]) -> bool:
    """Moves `logs` (the value's `logs` key) out of `message`'s value and text into
    `shared_logs`, if both start with them exactly; True if it did."""
    if not logs or message.is_error or not message.HasField("value_json") or not message.content:
        return False
    first = message.content[0]
    if first.WhichOneof("block") != "text":
        return False
    head = _value_head(logs)
    value_json = message.value_json
    if value_json == head + "}":
        rest_json = "{}"
    elif value_json.startswith(head + ","):
        rest_json = "{" + value_json[len(head) + 1 :]
    else:
        return False
    joined = "\n".join(logs)
    text = first.text.text
    if not joined:
        rest_text = text
    elif text == joined:
        rest_text = ""
    elif text.startswith(joined + "\n") and len(text) > len(joined) + 1:
        rest_text = text[len(joined) + 1 :]
    else:
        # (`joined + "\n"` alone would come back without its newline.)
        return False
    message.value_json = rest_json
    first.text.text = rest_text
    message.shared_logs.extend(logs)
    return True


def restore(message: tool_pb2.ToolResult) -> None:
    """Makes `message` the result as the registry would have sent it whole (a whole one stays
    as it is).

    Raises ValueError for shared logs with nothing to restore them into (a broken sender)."""
    if not message.shared_logs:
        return
    logs = list(message.shared_logs)
    rest_json = message.value_json
    if not message.HasField("value_json") or not rest_json.startswith("{"):
        raise ValueError("a result with shared_logs has no object value_json to restore")
    if not message.content or message.content[0].WhichOneof("block") != "text":
        raise ValueError("a result with shared_logs has no text block to restore")
    head = _value_head(logs)
    message.value_json = head + "}" if rest_json == "{}" else head + "," + rest_json[1:]
    first = message.content[0].text
    first.text = "\n".join(part for part in ("\n".join(logs), first.text) if part)
    message.ClearField("shared_logs")
