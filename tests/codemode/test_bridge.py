"""The run_code bridge over real runs."""

from __future__ import annotations

from typing import Any

import pytest

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValueError
from registry_service.codemode.token import ParentToken
from registry_service.domain.policy import Block, Deny, PostDecision, PreDecision
from registry_service.domain.records import MODEL_KINDS
from registry_service.domain.results import (
    AdditionalContext,
    ImageBlock,
    TextBlock,
    ToolResult,
    success,
)
from tests.codemode.conftest import Stack, value_of
from tests.codemode.fake_runtime import CHANNELS, FakeRuntime, Step, registry_on
from tests.registry.conftest import echo_tool, result_text


async def test_nested_hooks_see_an_opaque_parent_token(stack: Stack) -> None:
    parents: list[object] = []

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        parents.append(e.parent)
        return d

    stack.registry.catalog.hooks("").pre_execute.append(pre)
    echo_tool(stack.registry, "echo")
    await stack.run_code("return await tools.echo({})")
    assert parents[0] is None  # the outer run_code call
    assert isinstance(parents[1], ParentToken) and parents[1].execution_id == "call-1"


async def test_concludes_turn_propagates_unless_blocked(stack: Stack) -> None:
    async def finisher(inv: Any) -> Any:
        return ToolResult(
            content=(TextBlock("bye"),), value="bye", has_value=True, concludes_turn=True
        )

    stack.registry.register_tool("finish", finisher)
    _, result = await stack.run_code("return await tools.finish({})")
    assert result.concludes_turn

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        return Block((TextBlock("blocked"),)) if e.name == "finish" else d

    stack.registry.catalog.hooks("").post_execute.append(post)
    _, blocked = await stack.run_code(
        "try:\n    await tools.finish({})\nexcept ToolCallError as e:\n    return str(e)",
        call_id="c2",
    )
    assert value_of(blocked)["result"] == "blocked"
    assert not blocked.concludes_turn


async def test_tool_failure_message_and_policy_denial_reach_the_program(stack: Stack) -> None:
    async def broken(inv: Any) -> Any:
        raise RuntimeError("disk on fire")

    stack.registry.register_tool("broken", broken)
    echo_tool(stack.registry, "guarded")
    bodies: list[str] = []
    posts: list[str] = []

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        if e.name == "guarded":
            return Deny("guarded is off limits")
        if e.name == "explodes":
            raise RuntimeError("policy crashed")
        return d

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        posts.append(e.name)
        return d

    async def explodes(inv: Any) -> Any:
        bodies.append("explodes")

    stack.registry.register_tool("explodes", explodes)
    hooks = stack.registry.catalog.hooks("")
    hooks.pre_execute.append(pre)
    hooks.post_execute.append(post)
    agent = await stack.code_agent()
    program = (
        "out = []\n"
        "for name in ['broken', 'guarded', 'explodes']:\n"
        "    try:\n"
        "        await tools[name]({})\n"
        "    except ToolCallError as e:\n"
        "        out.append([e.toolName, str(e)])\n"
        "return out"
    )
    _, result = await stack.run_code(program, agent=agent)
    assert value_of(result)["result"] == [
        ["broken", "disk on fire"],
        ["guarded", "guarded is off limits"],
        ["explodes", "policy crashed"],
    ]
    assert bodies == [] and "explodes" not in posts and "guarded" in posts
    records = await stack.registry.history.list(
        stack.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
    )
    settles = {r.name: r for r in records if r.kind == "tool/code-dispatch"}
    assert all(settles[n].is_error for n in ("broken", "guarded", "explodes"))


async def test_lossy_arguments_are_rejected_before_dispatch(stack: Stack) -> None:
    echo_tool(stack.registry, "echo")
    agent = await stack.code_agent()
    program = (
        "out = []\n"
        "for bad in [float('nan'), object(), {1, 2}, -0.0]:\n"
        "    try:\n"
        "        await tools.echo({'x': bad})\n"
        "    except ToolCallError as e:\n"
        "        out.append([e.toolName, str(e)])\n"
        "try:\n"
        "    await tools.echo()\n"
        "except ToolCallError as e:\n"
        "    out.append([e.toolName, str(e)])\n"
        "out.append(await tools.echo({'ok': 1}))\n"
        "return out"
    )
    _, result = await stack.run_code(program, agent=agent)
    lossy = "tool arguments must be lossless JSON"
    assert value_of(result)["result"] == [
        ["echo", f"{lossy}: nan is not a finite number"],
        ["echo", f"{lossy}: object is not a JSON value"],
        ["echo", f"{lossy}: set is not a JSON value"],
        ["echo", f"{lossy}: -0.0 cannot round-trip through JSON"],
        ["echo", f"{lossy} (call the tool with an arguments object, e.g. `{{}}`)"],
        {"echo": {"ok": 1}},
    ]
    records = await stack.registry.history.list(
        stack.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
    )
    # Nothing dispatched or logged for the refused calls, and no sub-call number used.
    assert [(r.kind, r.call_id) for r in records] == [
        ("tool/call", "call-1"),
        ("tool/code-dispatch-start", "call-1:code:1"),
        ("tool/code-dispatch", "call-1:code:1"),
        ("tool/result", "call-1"),
    ]


@pytest.mark.parametrize("channel", CHANNELS)
async def test_registry_refuses_unusable_arguments_with_the_same_texts(channel: str) -> None:
    # The worker never sends these; a runtime that did gets the worker's own texts back.
    runtime = FakeRuntime()
    runtime.steps = [
        Step(arguments_json=""),
        Step(arguments_json="[1,"),
        Step(arguments_json="NaN"),
        Step(arguments_json="{}"),
    ]
    async with registry_on(runtime, runtime_channel=channel) as (h, _clock, agent):
        _, result = await h.execute("run_code", {"code": "pass", "description": "x"}, agent=agent)
        records = await h.registry.history.list(
            h.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
        )
    assert not result.is_error
    lossy = "tool arguments must be lossless JSON"
    assert [(r.value_json or r.error_message) for r in runtime.results] == [
        f"{lossy} (call the tool with an arguments object, e.g. `{{}}`)",
        f"{lossy}: {_refusal('[1,')}",
        f"{lossy}: {_refusal('NaN')}",
        '{"echo":{}}',
    ]
    assert [r.call_id for r in records if r.kind == "tool/code-dispatch"] == ["call-1:code:1"]


def _refusal(text: str) -> str:
    with pytest.raises(JsonValueError) as caught:
        jsonvalue.loads(text)
    return str(caught.value)


async def test_deep_arguments_and_proto_named_tool(stack: Stack) -> None:
    seen: list[str] = []

    async def proto(inv: Any) -> Any:
        seen.append("__proto__")
        return "ok"

    stack.registry.register_tool("__proto__", proto)
    echo_tool(stack.registry, "echo")
    agent = await stack.code_agent()
    program = (
        "v = []\n"
        "for _ in range(5000):\n"
        "    v = [v]\n"
        "r = await tools.echo({'deep': v})\n"
        "d = r['echo']['deep']\n"
        "n = 0\n"
        "while d:\n"
        "    d = d[0]\n"
        "    n += 1\n"
        "return [n, await tools['__proto__']({})]"
    )
    _, result = await stack.run_code(program, agent=agent)
    assert value_of(result)["result"] == [5000, "ok"]
    records = await stack.registry.history.list(
        stack.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
    )
    start = next(r for r in records if r.kind == "tool/code-dispatch-start" and r.name == "echo")
    assert start.arguments_json.startswith('{"deep":' + "[" * 5000)


async def test_images_and_contexts_are_deferred_even_when_the_program_fails(stack: Stack) -> None:
    async def snap(inv: Any) -> Any:
        return success(
            "shot", (TextBlock("a screenshot"), ImageBlock("image/png", b"\x89PNG"))
        ).with_contexts((AdditionalContext((TextBlock("remember this"),), "snap"),))

    async def hidden(inv: Any) -> Any:
        return success("h", (ImageBlock("image/png", b"\x89PNG"),))

    stack.registry.register_tool("snap", snap)
    stack.registry.register_tool("hidden", hidden)

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        if e.name == "hidden":
            from registry_service.domain.policy import Accept

            return Accept(content=(TextBlock("image removed"),))
        return d

    stack.registry.catalog.hooks("").post_execute.append(post)
    _, result = await stack.run_code(
        "await tools.snap({})\nawait tools.hidden({})\nraise RuntimeError('late')"
    )
    assert result.is_error and result.error.code == "CODE_RUN_FAILED"
    contexts = result.additional_contexts
    assert [c.source for c in contexts] == ["tools-code-mode", "snap"]
    assert [b.WhichOneof("block") for b in contexts[0].content] == ["text", "image"]


async def test_no_agent_dispatches_without_records(stack: Stack) -> None:
    echo_tool(stack.registry, "echo")
    _, result = await stack.run_code("return await tools.echo({'a': 1})")
    assert value_of(result)["result"] == {"echo": {"a": 1}}
    assert await stack.registry.history.list("", after_seq=0, limit=10) == []


async def test_missing_runtime_is_a_structured_error(make_registry: Any) -> None:
    from registry_service.domain.scopes import Mode

    async with make_registry(default_mode=Mode.CODE) as h:
        _, result = await h.execute("run_code", {"code": "return 1", "description": "x"})
        assert result.is_error and "requires a code runtime" in result.error.message


async def test_durable_content_shapes_and_pretty_json(stack: Stack) -> None:
    agent = await stack.code_agent()
    cases = {
        "print('only logs')": "only logs",
        "return 'raw string'": "raw string",
        "print('a')\nreturn {'k': [1, 2]}": 'a\n{\n  "k": [\n    1,\n    2\n  ]\n}',
        "pass": "(run_code completed with no output)",
        "return None": "null",
    }
    for i, (program, text) in enumerate(cases.items()):
        _, result = await stack.run_code(program, agent=agent, call_id=f"c{i}")
        assert result_text(result) == text
    records = await stack.registry.history.list(
        stack.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
    )
    results = [r for r in records if r.kind == "tool/result"]
    assert len(results) == len(cases)
    assert all(r.kind in MODEL_KINDS for r in records)  # no nested records: no tools called
