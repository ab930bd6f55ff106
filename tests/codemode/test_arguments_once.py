"""A call's arguments are decoded once, and the call's record is their text.

Admission decodes the argument text once (and writes its canonical text, the call's record);
the value it decoded is what pre-execute hooks read and what the body gets, handed over
without a copy or a second decode. The body owns it: an in-process body may mutate it, and
nothing after the body (post-execute hooks, result observers, history, events) sees that,
because all of them read the text. Decodes are counted over real runs (a real runtime and its
workers, the registry over gRPC); the runtime shares this process but never decodes a binding
call's argument text (it writes it from the worker's frame).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import pytest

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.events import (
    CallFinished,
    CallReceived,
    NestedCallSettled,
    NestedCallStarted,
)
from registry_service.domain.observers import Observers
from registry_service.domain.policy import Allow, PostDecision, PreDecision
from registry_service.domain.results import ToolResult
from registry_service.domain.scopes import Mode
from tests.codemode.conftest import Stack, value_of
from tests.registry.test_observers import Recording

MARKER = "arguments-once-marker"
ORIGINAL = {"marker": MARKER, "nested": {"items": [1, 2]}}
ORIGINAL_JSON = jsonvalue.dumps(ORIGINAL)
PROGRAM = (
    f"r = await tools.mutate({{'marker': {MARKER!r}, 'nested': {{'items': [1, 2]}}}})\nreturn r"
)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tool's argument texts that were decoded (by `loads` or `loads_canonical`), not
    counting the run_code call's own arguments (its program spells the tool's)."""
    seen: list[str] = []
    for name in ("loads", "loads_canonical"):
        real: Callable[..., Any] = getattr(jsonvalue, name)

        def counting(text: Any, *args: Any, _real: Callable[..., Any] = real, **kw: Any) -> Any:
            if isinstance(text, str) and MARKER in text and "tools.mutate" not in text:
                seen.append(text)
            return _real(text, *args, **kw)

        monkeypatch.setattr(jsonvalue, name, counting)
    return seen


def _mutating_tool(stack: Stack, handed: list[Any]) -> None:
    async def mutate(inv: Any) -> Any:
        arguments = inv.arguments
        handed.append(arguments)
        arguments["nested"]["items"].append(3)  # the body's own value: it may do this
        arguments["marker"] = "changed by the body"
        arguments["added"] = True
        return {"seen": len(arguments["nested"]["items"])}

    stack.registry.register_tool("mutate", mutate, description="mutates its arguments")


async def test_a_nested_call_decodes_its_arguments_once(stack: Stack, decodes: list[str]) -> None:
    pre_seen: list[Any] = []
    handed: list[Any] = []

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        if e.name == "mutate":
            pre_seen.append(e.arguments)
        return d

    stack.registry.catalog.hooks("").pre_execute.append(pre)
    _mutating_tool(stack, handed)
    _, result = await stack.run_code(PROGRAM)
    assert value_of(result)["result"] == {"seen": 3}
    assert decodes == [ORIGINAL_JSON]  # admission's, nothing after it
    # The body got the very value the pre-execute hook read: no copy in between.
    assert len(pre_seen) == 1 and handed[0] is pre_seen[0]


async def test_a_body_mutating_its_arguments_changes_nothing_anyone_else_sees(
    stack: Stack,
) -> None:
    recording = Recording()
    executor = stack.registry.executor
    executor.observers = Observers((recording, *executor.observers.members))
    after: list[tuple[str, Any]] = []
    hooks = stack.registry.catalog.hooks("")

    async def around(e: Any, proceed: Any) -> ToolResult:
        result: ToolResult = await proceed()
        if e.name == "mutate":
            after.append(("around", e.arguments))
        return result

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        if e.name == "mutate":
            after.append(("post", e.arguments))
            after.append(("post-text", e.arguments_json))
        return d

    def observe(e: Any, r: ToolResult) -> None:
        if e.name == "mutate":
            after.append(("observer", e.arguments))

    hooks.around.append(around)
    hooks.post_execute.append(post)
    hooks.observers.append(observe)
    handed: list[Any] = []
    _mutating_tool(stack, handed)
    agent = await stack.code_agent()
    _, result = await stack.run_code(PROGRAM, agent=agent, call_id="outer")
    assert value_of(result)["result"] == {"seen": 3}
    assert handed[0]["added"] is True  # the body did mutate its value
    assert after == [
        ("around", ORIGINAL),
        ("post", ORIGINAL),
        ("post-text", ORIGINAL_JSON),
        ("observer", ORIGINAL),
    ]
    agent_id = stack.registry.catalog.get_agent(agent).agent_id
    records = await stack.registry.history.list(
        agent_id, after_seq=0, limit=10, call_id="outer:code:1"
    )
    assert [r.kind for r in records] == ["tool/code-dispatch-start", "tool/code-dispatch"]
    assert [r.arguments_json for r in records] == [ORIGINAL_JSON, ORIGINAL_JSON]
    nested = [e for e in recording.seen if isinstance(e, NestedCallStarted | NestedCallSettled)]
    assert len(nested) == 2
    assert all(e.call is not None and e.call.arguments_json == ORIGINAL_JSON for e in nested)


async def test_a_direct_call_body_mutating_its_arguments_changes_nothing_after_it(
    make_stack: Any, decodes: list[str]
) -> None:
    async with make_stack(default_mode=Mode.BOTH) as stack:
        assert isinstance(stack, Stack)
        recording = Recording()
        executor = stack.registry.executor
        executor.observers = Observers((recording, *executor.observers.members))
        posts: list[Any] = []

        async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
            posts.append(e.arguments)
            return d

        async def pre(e: Any, d: PreDecision) -> PreDecision:
            return Allow()

        stack.registry.catalog.hooks("").pre_execute.append(pre)
        stack.registry.catalog.hooks("").post_execute.append(post)
        handed: list[Any] = []
        _mutating_tool(stack, handed)
        agent = await stack.agent("direct")
        _, result = await stack.execute("mutate", ORIGINAL, agent=agent, call_id="d1")
        assert not result.is_error, result.error.message
        assert jsonvalue.loads(result.value_json) == {"seen": 3}
        assert posts == [ORIGINAL]
        # Admission's decode, then the post hook's read of the text (the body's value is its own).
        assert decodes == [ORIGINAL_JSON, ORIGINAL_JSON]
        agent_id = stack.registry.catalog.get_agent(agent).agent_id
        records = await stack.registry.history.list(agent_id, after_seq=0, limit=10, call_id="d1")
        assert [r.kind for r in records] == ["tool/call", "tool/result"]
        assert records[0].arguments_json == ORIGINAL_JSON
        ends = [e for e in recording.seen if isinstance(e, CallReceived | CallFinished)]
        assert [e.call.recorded_arguments() for e in ends] == [ORIGINAL_JSON, ORIGINAL_JSON]


RESULT_MARKER = "result-once-marker"


def _registry_frame() -> bool:
    """Whether the caller of the counted function (two frames up) is the registry's code."""
    return str(sys._getframe(2).f_globals.get("__name__", "")).startswith("registry_service")


async def test_a_nested_result_is_written_once_and_never_decoded_in_the_registry(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    for name in ("loads", "loads_canonical", "dumps", "snapshot_with_text"):
        real: Callable[..., Any] = getattr(jsonvalue, name)

        def counting(arg: Any, *a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            if _registry_frame() and RESULT_MARKER in (arg if isinstance(arg, str) else str(arg)):
                calls.append(_name)
            return _real(arg, *a, **kw)

        monkeypatch.setattr(jsonvalue, name, counting)

    async def big(inv: Any) -> Any:
        return {"marker": RESULT_MARKER, "rows": list(range(100))}

    stack.registry.register_tool("big", big, description="a value")
    _, result = await stack.run_code("v = await tools.big({})\nreturn len(v['rows'])")
    assert value_of(result)["result"] == 100
    assert calls == ["dumps"]  # written once for the program; no copy, no decode


async def test_a_body_changing_its_result_after_returning_it_changes_nothing(
    stack: Stack,
) -> None:
    returned: dict[str, Any] = {}
    seen: list[Any] = []

    async def leaky(inv: Any) -> Any:
        items = [1]
        value = {"marker": RESULT_MARKER, "items": items}
        returned["value"] = value
        # The body keeps its object and changes it once it has returned.
        asyncio.get_running_loop().call_soon(items.append, 2)
        return value

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        if e.name == "leaky":
            await asyncio.sleep(0)  # the body's change has happened
            seen.append(r.value)
        return d

    stack.registry.register_tool("leaky", leaky, description="changes what it returned")
    stack.registry.catalog.hooks("").post_execute.append(post)
    agent = await stack.code_agent()
    _, result = await stack.run_code("return await tools.leaky({})", agent=agent, call_id="o")
    assert returned["value"]["items"] == [1, 2]  # it did change its object
    original: JsonValue = {"marker": RESULT_MARKER, "items": [1]}
    assert seen == [original]
    assert value_of(result)["result"] == original
    agent_id = stack.registry.catalog.get_agent(agent).agent_id
    records = await stack.registry.history.list(agent_id, after_seq=0, limit=10, call_id="o:code:1")
    (settle,) = [r for r in records if r.kind == "tool/code-dispatch"]
    assert jsonvalue.loads(settle.content_json) == [
        {"type": "text", "text": jsonvalue.render_pretty(original)}
    ]
