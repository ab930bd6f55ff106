"""Invariant 1: under `code` the executor collapses, before any policy observes."""

from __future__ import annotations

from typing import Any

from registry_service.domain.execution import ExecutionInput
from registry_service.domain.policy import PreDecision
from registry_service.domain.scopes import Mode
from registry_service.domain.signals import AbortController
from tests.registry.conftest import CODE, Harness, echo_tool, result_text

ROUTE = (
    'unknown tool "write": only `run_code` is callable directly — call `write` from inside a '
    "`run_code` program instead"
)


def _spy(harness: Harness) -> list[str]:
    seen: list[str] = []

    async def pre(execution: Any, decision: PreDecision) -> PreDecision:
        seen.append(f"pre:{execution.name}")
        return decision

    def guard(execution: Any) -> None:
        seen.append(f"guard:{execution.name}")

    hooks = harness.registry.catalog.hooks("")
    hooks.pre_execute.append(pre)
    hooks.guards.append(guard)
    return seen


async def test_model_direct_call_under_code_is_unknown_tool_with_route_hint(
    code_harness: Harness,
) -> None:
    echo_tool(code_harness.registry, "write")
    seen = _spy(code_harness)
    events, result = await code_harness.execute("write", {"path": "x"})
    assert result.is_error
    assert result.error.code == "UNKNOWN_TOOL"
    assert result.error.name == "ToolNotFoundError"
    assert result.error.message == ROUTE
    assert result_text(result) == f"Error: {ROUTE}"
    assert seen == []  # no pre-execute, no guard observed the collapsed call
    assert events == []  # not even a `started` event


async def test_wire_listing_under_code_still_lists_tools_for_programs(
    code_harness: Harness,
) -> None:
    echo_tool(code_harness.registry, "write")
    assert await code_harness.visible() == ["run_code", "write"]


async def test_native_and_both_execute_directly(make_registry: Any) -> None:
    for mode in (Mode.NATIVE, Mode.BOTH):
        async with make_registry(default_mode=mode) as h:
            echo_tool(h.registry, "write")
            _, result = await h.execute("write", {"a": 1})
            assert not result.is_error, result
            assert result.value_json == '{"echo":{"a":1}}'


async def test_agent_in_code_mode_collapses_while_deployment_is_native(harness: Harness) -> None:
    echo_tool(harness.registry, "write")
    agent = await harness.agent("coder", mode=CODE)
    _, result = await harness.execute("write", agent=agent)
    assert result.error.code == "UNKNOWN_TOOL"
    _, direct = await harness.execute("write")
    assert not direct.is_error


async def test_unknown_name_under_code_is_not_route_hinted(code_harness: Harness) -> None:
    seen = _spy(code_harness)
    _, result = await code_harness.execute("nope")
    assert result.error.code == "UNKNOWN_TOOL"
    assert result.error.message == 'unknown tool "nope"'
    assert seen == ["pre:nope", "guard:nope"]  # invisible names do traverse policy


async def test_pre_aborted_collapsed_call_reports_aborted_before_dispatch(
    code_harness: Harness,
) -> None:
    echo_tool(code_harness.registry, "write")
    controller = AbortController()
    controller.abort("gone")
    result = await code_harness.registry.executor.execute(
        ExecutionInput(call_id="c", name="write", arguments={}, signal=controller.signal)
    )
    assert result.error is not None
    assert result.error.code == "ABORTED_BEFORE_DISPATCH"
    assert result.error.message == "tool call aborted before dispatch"


async def test_parent_token_lifts_only_the_collapse(code_harness: Harness) -> None:
    echo_tool(code_harness.registry, "write")
    seen = _spy(code_harness)
    controller = AbortController()
    result = await code_harness.registry.executor.execute(
        ExecutionInput(
            call_id="c:code:1",
            name="write",
            arguments={"k": 1},
            signal=controller.signal,
            parent=object(),
        )
    )
    assert not result.is_error
    assert seen == ["pre:write", "guard:write"]


async def test_run_code_itself_is_callable_directly_under_code(code_harness: Harness) -> None:
    _, result = await code_harness.execute("run_code", {"code": "return 1", "description": "one"})
    # No runtime exists yet in this deployment: a structured error, not UNKNOWN_TOOL.
    assert result.is_error
    assert result.error.code == "CODE_RUNTIME_UNAVAILABLE"
    assert "requires a code runtime" in result.error.message
