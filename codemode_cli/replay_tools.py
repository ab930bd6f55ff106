"""The tools of a replay: a `ToolProvider` whose every tool answers from a recording.

The program's nested calls are numbered by the runtime in the order the program makes them
(sub-call id `<call_id>:code:<n>`), whatever order their bodies run in, so the n-th call is
matched with the recording's n-th: the same tool name and equal arguments (as JSON values)
get the recorded result back, a recorded failure raised again as `ToolFailed` with its code.
Anything else is a divergence: the call fails with `REPLAY_DIVERGED` (the program sees a tool
error, as it would see any) and the lowest-numbered one is reported.

A recorded result is replayed from its content blocks as history keeps them: a text block
holding JSON (how the registry renders a tool's JSON value) gives that value back, any other
content is returned as content blocks.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc

from codemode_cli.trajectory import RecordedCall
from codemode_client.provider import InvocationContext, ToolFailed, ToolProvider
from codemode_client.results import JsonContent, TextContent, ToolOutput

__all__ = ["DIVERGED", "Divergence", "MadeCall", "ReplayTools"]

DIVERGED = "REPLAY_DIVERGED"
_ERROR_PREFIX = "Error: "  # the registry's prefix of a failed tool's text


@dataclass(frozen=True)
class MadeCall:
    tool_name: str
    arguments: Any


@dataclass(frozen=True)
class Divergence:
    index: int
    reason: str
    expected: RecordedCall | None
    actual: MadeCall | None


@dataclass
class ReplayTools:
    channel: grpc.aio.Channel
    scope: str
    """The agent the tools are registered for (a fresh one per replay)."""
    call_id: str
    """The replayed run_code call's id: its nested calls are `<call_id>:code:<n>`."""
    recorded: list[RecordedCall]
    made: dict[int, MadeCall] = field(default_factory=dict)
    _diverged: dict[int, Divergence] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def provider(self) -> AsyncIterator[ToolProvider]:
        """Serves one tool per recorded tool name while the block runs."""
        provider = ToolProvider(self.channel, "codemode-replay")
        for name in dict.fromkeys(c.tool_name for c in self.recorded):
            provider.tool(
                name,
                description=f"{name}, answered from the recording",
                input_schema={"type": "object"},
                concurrency_safe=True,
                scope=self.scope,
            )(self._answer)
        async with provider:
            yield provider

    async def _answer(self, arguments: Any, ctx: InvocationContext) -> Any:
        index = self._index(ctx.call_id)
        actual = MadeCall(ctx.tool_name, arguments)
        self.made[index] = actual
        by_index = {c.index: c for c in self.recorded}
        expected = by_index.get(index)
        if expected is None:
            self._diverge(index, "the recording has no such call", None, actual)
        if expected.tool_name != actual.tool_name:
            self._diverge(index, "another tool", expected, actual)
        if _canonical(expected.arguments) != _canonical(actual.arguments):
            self._diverge(index, "other arguments", expected, actual)
        return _replayed(expected)

    def _index(self, sub_call_id: str) -> int:
        suffix = sub_call_id.removeprefix(f"{self.call_id}:code:")
        return int(suffix) if suffix.isdigit() else -1

    def _diverge(
        self, index: int, reason: str, expected: RecordedCall | None, actual: MadeCall
    ) -> NoReturn:
        self._diverged[index] = Divergence(index, reason, expected, actual)
        raise ToolFailed(f"replay: call {index} diverges from the recording ({reason})", DIVERGED)

    def divergence(self) -> Divergence | None:
        """The first divergent call, counting a recorded call the program did not make."""
        missing = [c for c in self.recorded if c.index not in self.made]
        found = list(self._diverged.values())
        if missing:
            first = missing[0]
            found.append(Divergence(first.index, "the program did not make it", first, None))
        return min(found, key=lambda d: d.index, default=None)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _replayed(call: RecordedCall) -> Any:
    texts = [b["text"] for b in call.content if isinstance(b, dict) and "text" in b]
    if call.is_error:
        message = "\n".join(texts).removeprefix(_ERROR_PREFIX)
        raise ToolFailed(message, call.error_code)
    if len(call.content) == 1 and len(texts) == 1:
        try:
            return json.loads(texts[0])
        except ValueError:
            pass
    blocks: list[Any] = []
    for block in call.content:
        if isinstance(block, dict) and "text" in block:
            blocks.append(TextContent(str(block["text"])))
        elif isinstance(block, dict) and "json" in block:
            blocks.append(JsonContent(block["json"]))
        # images are exported without their bytes (history --json): left out
    return ToolOutput(content=tuple(blocks))
