"""A nested result's pretty text is rendered only when something reads it.

The program gets a nested call's value as JSON; the text `render_pretty` would make of it is
needed only by a hook that reads the content, a history record or a model-direct caller.
Counted by calls of `render_pretty` on the tool's value, over real runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.policy import PostDecision
from registry_service.domain.results import PrettyTextBlock, TextBlock, ToolResult, text_of
from tests.codemode.conftest import Stack, value_of
from tests.registry.conftest import BOTH

MARKER = "nested-render-marker"
PROGRAM = "value = await tools.big({})\nreturn len(value['rows'])"


def _value() -> JsonValue:
    return {"marker": MARKER, "rows": [{"i": i, "name": f"row {i}"} for i in range(50)]}


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[JsonValue]:
    """The tool values `render_pretty` was asked to render (other renders are not counted)."""
    seen: list[JsonValue] = []
    real: Callable[[JsonValue], str] = jsonvalue.render_pretty

    def counting(value: JsonValue) -> str:
        if isinstance(value, dict) and value.get("marker") == MARKER:
            seen.append(value)
        return real(value)

    monkeypatch.setattr(jsonvalue, "render_pretty", counting)
    return seen


def _register(stack: Stack) -> None:
    async def body(invocation: Any) -> JsonValue:
        return _value()

    stack.registry.register_tool("big", body, description="a big value")


async def test_an_unread_nested_result_is_never_rendered(
    stack: Stack, renders: list[JsonValue]
) -> None:
    _register(stack)
    _, result = await stack.run_code(PROGRAM)
    assert value_of(result)["result"] == 50
    assert renders == []


async def test_a_hook_that_reads_the_content_gets_the_pretty_text_rendered_once(
    stack: Stack, renders: list[JsonValue]
) -> None:
    _register(stack)
    texts: list[str] = []

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        if e.name == "big":
            assert isinstance(r.content[0], PrettyTextBlock)
            texts.append(text_of(r.content))
            texts.append(text_of(r.content))  # read again: not rendered again
        return d

    stack.registry.catalog.hooks("").post_execute.append(post)
    _, result = await stack.run_code(PROGRAM)
    assert value_of(result)["result"] == 50
    expected = jsonvalue.render_pretty(_value())
    assert texts == [expected, expected]
    assert len(renders) == 2  # the hook's first read, and `expected` here


async def test_a_model_direct_result_shows_the_same_text(stack: Stack) -> None:
    _register(stack)
    agent = await stack.agent("direct", mode=BOTH)
    _, result = await stack.execute("big", {}, agent=agent)
    assert [block.text.text for block in result.content] == [jsonvalue.render_pretty(_value())]


def test_the_lazy_block_equals_the_eager_one() -> None:
    lazy, eager = PrettyTextBlock(_value()), TextBlock(jsonvalue.render_pretty(_value()))
    assert lazy == eager and eager == lazy and hash(lazy) == hash(eager)
    assert lazy != TextBlock("other") and lazy.type == "text"
    copied = copy.deepcopy(lazy)
    assert type(copied) is TextBlock and copied == eager
