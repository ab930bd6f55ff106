"""Logs that a tool result carries once on the wire (`ToolResult.shared_logs`).

A `run_code` result shows its program's logs twice: in its value (`{"logs": [...], ...}`) and
at the start of its content text (the logs joined by newlines, then the rendered result). Sent
whole, output over about half the message limit cannot be sent at all. To a request that set
`share_logs`, the registry sends the logs once, in `shared_logs`, and leaves them out of
`value_json` and of the first content block's text; the client restores the result as shown
before anything reads it. Both directions work on the JSON *text*, so the restored `value_json`
is byte for byte the one the registry would have sent whole.

A failed `run_code` result shows its captured output twice too: at the end of its error
message and of its content text (`Error: <message>`), after `CAPTURED`. `share_failure` sends
that text once, as the one entry of `shared_logs`, and leaves it out of both.

The result shows twice as well: in the value and, as shown (`render_pretty`: a string as it
is, any other value pretty JSON), at the end of the text. `share` leaves it out of the text then
(`shared_result`) and `restore` renders it again from `value_json`, so a result of more than
half the limit arrives. `value_json` is `dumps` of the value (the registry writes it so), whose
scalars `render_pretty` spells the same way, so the rendering is a pure function of that text
(the TypeScript client's `renderPrettyJson` re-indents it).

`share` only strips what `restore` puts back exactly: a result whose value or text does not
start with its logs (a post-execute hook rewrote it, say) goes whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.jsonvalue import JsonValue

__all__ = ["CAPTURED", "NO_RESULT", "NoResult", "restore", "share", "share_failure"]


class NoResult:
    """The type of `NO_RESULT`."""

    def __repr__(self) -> str:
        return "NO_RESULT"


NO_RESULT: Final = NoResult()
"""What `share` is given for a value without a `result` member (`None` is JSON null)."""

CAPTURED = "\nCaptured output:\n"
"""What precedes a failed run's captured output in its error message (and content text)."""


def _value_head(logs: Sequence[str]) -> str:
    return '{"logs":' + jsonvalue.dumps(list(logs))


def share(
    message: tool_pb2.ToolResult,
    logs: Sequence[str],
    result: JsonValue | NoResult = NO_RESULT,
) -> bool:
    """Moves `logs` (the value's `logs` key) out of `message`'s value and text into
    `shared_logs`, if both start with them exactly; and `result` (the value's `result`) as
    shown out of the text, if it ends with it (`shared_result`). True if it did either.

    `result` must be the value `message.value_json` holds (its text is `dumps` of it)."""
    if message.is_error or not message.HasField("value_json") or not message.content:
        return False
    first = message.content[0]
    if first.WhichOneof("block") != "text":
        return False
    shared = _share_logs(message, first.text, logs) if logs else False
    if isinstance(result, NoResult) or message.shared_result:
        return shared
    shown = jsonvalue.render_pretty(result)
    if not shown:
        return shared  # an empty string adds nothing to the text
    # What is left of the text is the result alone (shared logs), or the logs, a line break
    # and the result (logs kept whole, or none).
    text = first.text.text
    if text == shown:
        first.text.text = ""
    elif message.shared_logs or not text.endswith("\n" + shown):
        return shared
    else:
        first.text.text = text[: len(text) - len(shown) - 1]
    message.shared_result = True
    return True


def _share_logs(
    message: tool_pb2.ToolResult, first: tool_pb2.TextContent, logs: Sequence[str]
) -> bool:
    head = _value_head(logs)
    value_json = message.value_json
    if value_json == head + "}":
        rest_json = "{}"
    elif value_json.startswith(head + ","):
        rest_json = "{" + value_json[len(head) + 1 :]
    else:
        return False
    joined = "\n".join(logs)
    text = first.text
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
    first.text = rest_text
    message.shared_logs.extend(logs)
    return True


def share_failure(message: tool_pb2.ToolResult) -> bool:
    """Moves the captured output that ends both `message`'s error message and its first text
    block (after `CAPTURED`) into `shared_logs`, as one entry; True if it did."""
    if not message.is_error or not message.content or message.shared_logs:
        return False
    first = message.content[0]
    if first.WhichOneof("block") != "text":
        return False
    text = message.error.message
    at = text.find(CAPTURED)
    if at < 0 or len(text) == at + len(CAPTURED):
        return False
    tail = text[at:]
    if not first.text.text.endswith(tail):
        return False
    message.error.message = text[:at]
    first.text.text = first.text.text[: len(first.text.text) - len(tail)]
    message.shared_logs.append(tail[len(CAPTURED) :])
    return True


def restore(message: tool_pb2.ToolResult) -> None:
    """Makes `message` the result as the registry would have sent it whole (a whole one stays
    as it is).

    Raises ValueError for shared logs with nothing to restore them into (a broken sender)."""
    if not message.shared_logs:
        _restore_result(message)
        return
    logs = list(message.shared_logs)
    if message.is_error:
        if not message.content or message.content[0].WhichOneof("block") != "text":
            raise ValueError("a failure with shared_logs has no text block to restore")
        tail = CAPTURED + "\n".join(logs)
        message.error.message += tail
        message.content[0].text.text += tail
        message.ClearField("shared_logs")
        return
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
    _restore_result(message)


def _restore_result(message: tool_pb2.ToolResult) -> None:
    if not message.shared_result:
        return
    value = jsonvalue.loads(message.value_json) if message.HasField("value_json") else None
    if type(value) is not dict or "result" not in value:
        raise ValueError("a result with shared_result has no result to restore")
    shown = jsonvalue.render_pretty(value["result"])
    if not shown:
        raise ValueError("a result with shared_result has an empty result to restore")
    if not message.content or message.content[0].WhichOneof("block") != "text":
        raise ValueError("a result with shared_result has no text block to restore")
    first = message.content[0].text
    first.text = first.text + "\n" + shown if first.text else shown
    message.shared_result = False
