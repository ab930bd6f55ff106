"""The policy pipeline over gRPC: pre-execute, approval routing, guards, around, validation,
post-execute, observers (docs/pipeline.md)."""

from __future__ import annotations

import asyncio
from typing import Any

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.execution import ExecutionInput, ToolCallFailure
from registry_service.domain.policy import (
    Accept,
    Allow,
    Ask,
    Block,
    Deny,
    PostDecision,
    PreDecision,
)
from registry_service.domain.results import TextBlock, ToolResult
from registry_service.domain.signals import never
from registry_service.domain.tools import ToolDefinition, is_parallel
from tests.registry.conftest import Harness, echo_tool, result_text

SCHEMA: JsonValue = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "mode": {"enum": ["r", "w"]}},
    "required": ["path"],
    "additionalProperties": False,
}


async def test_stage_order_for_an_allowed_call(harness: Harness) -> None:
    order: list[str] = []
    hooks = harness.registry.catalog.hooks("")

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        order.append("pre")
        return d

    def guard(e: Any) -> None:
        order.append("guard")

    async def around(e: Any, proceed: Any) -> ToolResult:
        order.append("around-in")
        result: ToolResult = await proceed()
        order.append("around-out")
        return result

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        order.append("post")
        return d

    hooks.pre_execute.append(pre)
    hooks.guards.append(guard)
    hooks.around.append(around)
    hooks.post_execute.append(post)
    hooks.observers.append(lambda e, r: order.append("observe"))

    async def body(inv: Any) -> Any:
        order.append("body")
        return 1

    harness.registry.register_tool("t", body)
    events, result = await harness.execute("t")
    assert not result.is_error
    assert order == ["pre", "guard", "around-in", "body", "around-out", "post", "observe"]
    assert [e.WhichOneof("event") for e in events] == ["started"]


async def test_deny_skips_body_but_receives_post_execute(harness: Harness) -> None:
    posts: list[str] = []
    hooks = harness.registry.catalog.hooks("")

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        return Deny("writes are off today")

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        posts.append(r.error.message if r.error else "")
        return d

    hooks.pre_execute.append(pre)
    hooks.post_execute.append(post)
    ran: list[int] = []

    async def body(inv: Any) -> Any:
        ran.append(1)

    harness.registry.register_tool("t", body)
    _, result = await harness.execute("t")
    assert result.is_error and result.error.message == "writes are off today"
    assert result_text(result) == "Error: writes are off today"
    assert ran == [] and posts == ["writes are off today"]


async def test_throwing_pre_execute_is_final_without_post_execute(harness: Harness) -> None:
    posts: list[int] = []
    hooks = harness.registry.catalog.hooks("")

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        raise RuntimeError("policy store down")

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        posts.append(1)
        return d

    hooks.pre_execute.append(pre)
    hooks.post_execute.append(post)
    echo_tool(harness.registry, "t")
    _, result = await harness.execute("t")
    assert result.is_error and result.error.message == "policy store down"
    assert posts == []


async def test_guards_run_global_then_farthest_to_nearest_first_reason_wins(
    harness: Harness,
) -> None:
    preset = await harness.preset("p")
    agent = await harness.agent("a", preset=preset)
    seen: list[str] = []
    catalog = harness.registry.catalog

    def make(label: str, reason: str | None) -> Any:
        def guard(e: Any) -> str | None:
            seen.append(label)
            return reason

        return guard

    catalog.hooks(agent).guards.append(make("agent", "agent says no"))
    catalog.hooks(preset).guards.append(make("preset", None))
    catalog.hooks("").guards.append(make("global", None))
    echo_tool(harness.registry, "t")
    _, result = await harness.execute("t", agent=agent)
    assert seen == ["global", "preset", "agent"]
    assert result.error.message == "agent says no"
    seen.clear()
    _, other = await harness.execute("t", call_id="c2")  # global scope: agent guards don't apply
    assert not other.is_error and seen == ["global"]


async def test_scoped_pre_execute_only_sees_its_agents(harness: Harness) -> None:
    a = await harness.agent("a")
    b = await harness.agent("b")
    seen: list[str | None] = []

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        seen.append(e.agent)
        return d

    harness.registry.catalog.hooks(a).pre_execute.append(pre)
    echo_tool(harness.registry, "t")
    await harness.execute("t", agent=a)
    await harness.execute("t", agent=b)
    assert seen == [a]


async def test_input_validation_is_path_qualified_and_after_policy(harness: Harness) -> None:
    posts: list[str] = []

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        posts.append(r.error.code if r.error else "")
        return d

    harness.registry.catalog.hooks("").post_execute.append(post)
    echo_tool(harness.registry, "t", input_schema=SCHEMA)
    _, result = await harness.execute("t", {"mode": "x", "extra": 1})
    assert result.error.code == "INVALID_ARGS"
    assert result.error.name == "ToolArgsError"
    message = result.error.message
    assert message.startswith("invalid arguments: ")
    assert 'missing required property "path"' in message
    assert '"extra" is not a declared property (additionalProperties: false)' in message
    assert posts == ["INVALID_ARGS"]


async def test_invalid_tool_output(harness: Harness) -> None:
    async def body(inv: Any) -> Any:
        return {"n": "not a number"}

    harness.registry.register_tool(
        "t", body, output_schema={"type": "object", "properties": {"n": {"type": "number"}}}
    )
    _, result = await harness.execute("t")
    assert result.error.code == "INVALID_TOOL_OUTPUT"
    assert '"n" must be a number' in result.error.message


async def test_non_lossless_tool_output_is_invalid(harness: Harness) -> None:
    async def body(inv: Any) -> Any:
        return {"n": float("nan")}

    harness.registry.register_tool("t", body)
    _, result = await harness.execute("t")
    assert result.error.code == "INVALID_TOOL_OUTPUT"


async def test_around_wrapper_results_meet_the_output_contract(harness: Harness) -> None:
    """A wrapper that answers instead of the body is held to the tool's output schema and to
    lossless JSON, like a body."""
    answers: dict[str, ToolResult] = {
        "schema": ToolResult((), value={"n": "seven"}, has_value=True),
        "nan": ToolResult((), value={"n": float("nan")}, has_value=True),
        # A wrapper's own `value_json` is not trusted: the value is what counts.
        "good": ToolResult((), value={"n": 7}, has_value=True, value_json='{"n":0}'),
    }
    ran: list[str] = []

    async def around(e: Any, proceed: Any) -> ToolResult:
        answer = answers.get(e.call_id)
        if answer is not None:
            return answer
        result: ToolResult = await proceed()
        return result

    async def body(inv: Any) -> Any:
        ran.append(inv.call_id)
        return {"n": 1}

    harness.registry.catalog.hooks("").around.append(around)
    harness.registry.register_tool(
        "t", body, output_schema={"type": "object", "properties": {"n": {"type": "number"}}}
    )
    _, schema = await harness.execute("t", call_id="schema")
    assert (schema.error.code, schema.error.name) == ("INVALID_TOOL_OUTPUT", "ToolOutputError")
    assert '"n" must be a number' in schema.error.message
    _, nan = await harness.execute("t", call_id="nan")  # a tool error, not an RPC error
    assert nan.error.code == "INVALID_TOOL_OUTPUT"
    assert "not lossless JSON" in nan.error.message
    _, good = await harness.execute("t", call_id="good")
    assert not good.is_error and good.value_json == '{"n":7}'
    assert '"n": 7' in result_text(good)  # rendered like a body's value
    _, through = await harness.execute("t", call_id="through")
    assert through.value_json == '{"n":1}' and ran == ["through"]


async def test_body_failures_become_results(harness: Harness) -> None:
    async def coded(inv: Any) -> Any:
        raise ToolCallFailure("disk full", "ENOSPC")

    async def plain(inv: Any) -> Any:
        raise ValueError("bad")

    harness.registry.register_tool("coded", coded)
    harness.registry.register_tool("plain", plain)
    _, r1 = await harness.execute("coded")
    _, r2 = await harness.execute("plain")
    assert (r1.error.message, r1.error.code) == ("disk full", "ENOSPC")
    assert (r2.error.message, r2.error.name) == ("bad", "ValueError")
    assert result_text(r2) == "Error: bad"


async def test_post_execute_accept_replaces_content_or_value_and_block(harness: Harness) -> None:
    decisions: dict[str, PostDecision] = {
        "content": Accept(content=(TextBlock("redacted"),)),
        "value": Accept(value={"v": 2}, replace_value=True),
        "both": Accept(content=(TextBlock("x"),), value=1, replace_value=True),
        "block": Block(feedback=(TextBlock("not allowed to see this"),)),
    }

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        return decisions.get(e.name, d)

    harness.registry.catalog.hooks("").post_execute.append(post)
    for name in decisions:
        echo_tool(harness.registry, name)
    _, content = await harness.execute("content")
    assert result_text(content) == "redacted" and content.value_json == '{"echo":{}}'
    _, value = await harness.execute("value")
    assert value.value_json == '{"v":2}' and '"v": 2' in result_text(value)
    _, both = await harness.execute("both")
    assert both.is_error and "not both" in both.error.message
    _, block = await harness.execute("block")
    assert block.is_error and block.error.message == "not allowed to see this"
    assert result_text(block) == "not allowed to see this"


async def test_observer_failures_are_contained(harness: Harness) -> None:
    def boom(e: Any, r: ToolResult) -> None:
        raise RuntimeError("observer bug")

    harness.registry.catalog.hooks("").observers.append(boom)
    echo_tool(harness.registry, "t")
    _, result = await harness.execute("t")
    assert not result.is_error


async def test_ask_without_approver_is_unavailable(harness: Harness) -> None:
    async def pre(e: Any, d: PreDecision) -> PreDecision:
        return Ask("writes need a human")

    harness.registry.catalog.hooks("").pre_execute.append(pre)
    echo_tool(harness.registry, "t")
    agent = await harness.agent("a")
    events, result = await harness.execute("t", agent=agent)
    assert (
        result.error.message == 'tool "t" requires approval, but no approval channel is available'
    )
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds == ["started", "approval_pending", "approval_resolved"]
    pending, resolved = events[1].approval_pending, events[2].approval_resolved
    assert pending.reason == "writes need a human"
    assert resolved.approval_id == pending.approval_id
    assert resolved.outcome == rpb.APPROVAL_OUTCOME_UNAVAILABLE
    _, no_agent = await harness.execute("t", call_id="c2")
    assert (
        no_agent.error.message
        == 'tool "t" requires approval, but the call has no agent to route it through'
    )


async def test_one_argument_snapshot_across_the_pipeline(harness: Harness) -> None:
    seen: list[Any] = []

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        seen.append(e.arguments)
        return Allow()

    async def body(inv: Any) -> Any:
        assert inv.arguments is seen[0]  # admission's value, handed over: no second decode
        inv.arguments["mutated"] = True  # the body's to own
        return None

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        seen.append(e.arguments)  # after the body: read from the call's text
        return d

    harness.registry.catalog.hooks("").pre_execute.append(pre)
    harness.registry.catalog.hooks("").post_execute.append(post)
    harness.registry.register_tool("t", body)
    _, result = await harness.execute("t", {"a": 1})
    assert not result.is_error, result.error.message
    assert seen[1] == {"a": 1} and seen[1] is not seen[0]


def test_execution_mode_only_explicit_true_is_parallel() -> None:
    async def body(inv: Any) -> Any:
        return None

    def defn(classifier: Any) -> ToolDefinition:
        return ToolDefinition("t", "", {"type": "object"}, {}, body, is_concurrency_safe=classifier)

    def raises(args: Any) -> bool:
        raise RuntimeError

    assert is_parallel(defn(lambda a: True), {})
    for classifier in (None, lambda a: False, lambda a: 1, lambda a: "yes", raises):
        assert not is_parallel(defn(classifier), {})
    assert not is_parallel(None, {})


def test_execution_mode_is_exclusive_for_schema_invalid_arguments() -> None:
    async def body(inv: Any) -> Any:
        return None

    asked: list[Any] = []

    def classifier(args: Any) -> bool:
        asked.append(args)
        return True

    safe = ToolDefinition("t", "", SCHEMA, {}, body, is_concurrency_safe=classifier)
    assert is_parallel(safe, {"path": "/a"})
    assert asked == [{"path": "/a"}]
    invalid_arguments: list[JsonValue] = [{}, {"path": 1}, {"path": "/a", "x": 1}, "not an object"]
    for invalid in invalid_arguments:
        assert not is_parallel(safe, invalid)
    assert asked == [{"path": "/a"}]  # never asked about arguments the tool would refuse


async def test_execution_mode_for_collapsed_and_unknown(code_harness: Harness) -> None:
    echo_tool(code_harness.registry, "safe", concurrency_safe=True, input_schema=SCHEMA)
    executor = code_harness.registry.executor
    parent = object()
    nested = executor.create(ExecutionInput("c", "safe", {"path": "/a"}, never(), parent=parent))
    invalid = executor.create(ExecutionInput("c", "safe", {"path": 1}, never(), parent=parent))
    unknown = executor.create(ExecutionInput("c", "nope", {}, never(), parent=parent))
    assert executor.execution_mode(nested) == "parallel"  # type: ignore[arg-type]
    assert executor.execution_mode(invalid) == "exclusive"  # type: ignore[arg-type]
    assert executor.execution_mode(unknown) == "exclusive"  # type: ignore[arg-type]


async def test_concurrent_calls_run_in_parallel(harness: Harness) -> None:
    gate = asyncio.Event()
    entered: list[int] = []

    async def body(inv: Any) -> Any:
        entered.append(1)
        if len(entered) == 2:
            gate.set()
        await asyncio.wait_for(gate.wait(), 5)
        return None

    harness.registry.register_tool("t", body, concurrency_safe=True)
    results = await asyncio.gather(*(harness.execute("t", call_id=f"c{i}") for i in range(2)))
    assert all(not r.is_error for _, r in results)
