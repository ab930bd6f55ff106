"""The per-run scheduler through real runs (docs/pipeline.md, "run_code end to end")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import ValidationError

from registry_service.config import RegistrySettings
from registry_service.domain.policy import PostDecision, PreDecision
from registry_service.domain.results import ToolResult
from tests.codemode.conftest import Stack, value_of

GATHER3 = "import asyncio\nreturn await asyncio.gather(tools.a({}), tools.b({}), tools.c({}))"


class Tracker:
    """Counts overlapping bodies and records the order things happened in."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.log: list[str] = []

    def tool(self, name: str, delay: float = 0.05) -> Any:
        async def body(inv: Any) -> Any:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.log.append(f"start:{name}")
            await asyncio.sleep(delay)
            self.log.append(f"end:{name}")
            self.active -= 1
            return name

        return body


def _records(stack: Stack, agent: str) -> Any:
    return stack.registry.history.list(
        stack.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=1000
    )


async def test_safe_calls_overlap_and_start_in_order(stack: Stack) -> None:
    tracker = Tracker()
    for name in "abc":
        stack.registry.register_tool(name, tracker.tool(name), concurrency_safe=True)
    agent = await stack.code_agent()
    events, result = await stack.run_code(GATHER3, agent=agent)
    assert value_of(result)["result"] == ["a", "b", "c"]
    assert tracker.peak == 3
    started = [e.nested_started for e in events if e.WhichOneof("event") == "nested_started"]
    assert [s.sub_call_id for s in started] == ["call-1:code:1", "call-1:code:2", "call-1:code:3"]
    assert all(s.queue_wait_ms >= 0 for s in started)
    records = await _records(stack, agent)
    for n in (1, 2, 3):
        kinds = [r.kind for r in records if r.call_id == f"call-1:code:{n}"]
        assert kinds == ["tool/code-dispatch-start", "tool/code-dispatch"]


async def test_exclusive_call_is_a_barrier(stack: Stack) -> None:
    tracker = Tracker()
    stack.registry.register_tool("a", tracker.tool("a"), concurrency_safe=True)
    stack.registry.register_tool("b", tracker.tool("b"), concurrency_safe=True)
    stack.registry.register_tool("x", tracker.tool("x"))  # exclusive
    program = (
        "import asyncio\n"
        "return await asyncio.gather(tools.a({}), tools.b({}), tools.x({}), tools.a({}))"
    )
    _, result = await stack.run_code(program)
    assert value_of(result)["result"] == ["a", "b", "x", "a"]
    log = tracker.log
    assert log.index("start:x") > max(log.index("end:a"), log.index("end:b"))
    assert log.index("start:a", log.index("start:x")) > log.index("end:x")


async def test_queue_wait_behind_an_exclusive_call(stack: Stack) -> None:
    tracker = Tracker()
    stack.registry.register_tool("x", tracker.tool("x"), concurrency_safe=False)  # sleeps 50 ms
    program = "import asyncio\nreturn await asyncio.gather(tools.x({}), tools.x({}))"
    events, result = await stack.run_code(program)
    assert value_of(result)["result"] == ["x", "x"]
    started = {
        e.nested_started.sub_call_id: e.nested_started.queue_wait_ms
        for e in events
        if e.WhichOneof("event") == "nested_started"
    }
    first, second = started["call-1:code:1"], started["call-1:code:2"]
    assert 0 <= first < second
    assert second >= 40  # held by the first call's exclusive barrier for its ~50 ms body


async def test_max_parallel_caps_overlap(make_stack: Any) -> None:
    async with make_stack(max_parallel_sub_calls=2) as stack:
        tracker = Tracker()
        for name in "abc":
            stack.registry.register_tool(name, tracker.tool(name), concurrency_safe=True)
        _, result = await stack.run_code(GATHER3)
        assert not result.is_error
        assert tracker.peak == 2


async def test_unsafe_calls_never_overlap_under_gather(stack: Stack) -> None:
    tracker = Tracker()
    for name in "abc":
        stack.registry.register_tool(name, tracker.tool(name, 0.02))
    _, result = await stack.run_code(GATHER3)
    assert not result.is_error
    assert tracker.peak == 1
    assert tracker.log == ["start:a", "end:a", "start:b", "end:b", "start:c", "end:c"]


async def test_tool_unregistered_after_enumeration(stack: Stack) -> None:
    ran: list[int] = []

    async def ephemeral(inv: Any) -> Any:
        ran.append(1)

    async def remover(inv: Any) -> Any:
        stack.registry.catalog.unregister("", defn)
        return None

    defn = stack.registry.register_tool("ephemeral", ephemeral)
    stack.registry.register_tool("remover", remover)
    program = (
        "await tools.remover({})\n"
        "try:\n"
        "    await tools.ephemeral({})\n"
        "except ToolCallError as e:\n"
        "    return [e.toolName, str(e)]"
    )
    _, result = await stack.run_code(program)
    assert value_of(result)["result"] == ["ephemeral", 'unknown tool "ephemeral"']
    assert ran == []


async def test_slow_pre_execute_blocks_later_starts(stack: Stack) -> None:
    order: list[str] = []
    tracker = Tracker()
    for name in "ab":
        stack.registry.register_tool(name, tracker.tool(name, 0), concurrency_safe=True)

    async def pre(e: Any, d: PreDecision) -> PreDecision:
        if e.parent is not None:
            order.append(f"enter:{e.name}")
            await asyncio.sleep(0.05 if e.name == "a" else 0)
            order.append(f"exit:{e.name}")
        return d

    stack.registry.catalog.hooks("").pre_execute.append(pre)
    _, result = await stack.run_code(
        "import asyncio\nreturn await asyncio.gather(tools.a({}), tools.b({}))"
    )
    assert not result.is_error
    assert order == ["enter:a", "exit:a", "enter:b", "exit:b"]


async def test_exclusive_holds_barrier_through_async_post_execute(stack: Stack) -> None:
    tracker = Tracker()
    stack.registry.register_tool("x", tracker.tool("x", 0))
    stack.registry.register_tool("a", tracker.tool("a", 0), concurrency_safe=True)

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        if e.name == "x":
            tracker.log.append("post:x:enter")
            await asyncio.sleep(0.05)
            tracker.log.append("post:x:exit")
        return d

    stack.registry.catalog.hooks("").post_execute.append(post)
    _, result = await stack.run_code(
        "import asyncio\nreturn await asyncio.gather(tools.x({}), tools.a({}))"
    )
    assert not result.is_error
    assert tracker.log.index("start:a") > tracker.log.index("post:x:exit")


async def test_post_execute_and_contexts_follow_submission_order(stack: Stack) -> None:
    from registry_service.domain.results import AdditionalContext, TextBlock, success

    def tool(name: str, delay: float) -> Any:
        async def body(inv: Any) -> Any:
            await asyncio.sleep(delay)
            ok = success(name, (TextBlock(name),))
            return ok.with_contexts((AdditionalContext((TextBlock(f"ctx:{name}"),), "test"),))

        return body

    stack.registry.register_tool("slow", tool("slow", 0.08), concurrency_safe=True)
    stack.registry.register_tool("fast", tool("fast", 0.0), concurrency_safe=True)
    posts: list[str] = []

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        if e.parent is not None:
            posts.append(e.name)
        return d

    stack.registry.catalog.hooks("").post_execute.append(post)
    _, result = await stack.run_code(
        "import asyncio\nreturn await asyncio.gather(tools.slow({}), tools.fast({}))"
    )
    assert value_of(result)["result"] == ["slow", "fast"]
    assert posts == ["slow", "fast"]
    texts = [c.content[0].text.text for c in result.additional_contexts]
    assert texts == ["ctx:slow", "ctx:fast"]


async def test_queued_call_is_abandoned_without_records(stack: Stack) -> None:
    ran: list[str] = []

    async def blocker(inv: Any) -> Any:
        # Returns only once the run's end has aborted it: a slow host cannot let it succeed
        # (and the writer run) before the program returned.
        await inv.signal.wait()

    async def writer(inv: Any) -> Any:
        ran.append("writer")

    stack.registry.register_tool("blocker", blocker)
    stack.registry.register_tool("writer", writer)
    agent = await stack.code_agent()
    # Both exclusive: the writer queues behind the blocker; the program returns at once.
    program = (
        "import asyncio\n"
        "asyncio.ensure_future(tools.blocker({}))\n"
        "asyncio.ensure_future(tools.writer({}))\n"
        "await asyncio.sleep(0.05)\n"
        "return 'done'"
    )
    _, result = await asyncio.wait_for(stack.run_code(program, agent=agent), 60)
    assert value_of(result)["result"] == "done"
    assert ran == []
    records = await _records(stack, agent)
    assert [r.call_id for r in records if r.name == "writer"] == []
    settles = [r for r in records if r.kind == "tool/code-dispatch"]
    assert len(settles) == 1 and settles[0].is_error  # the blocker: success replaced by abort


async def test_an_abandoned_call_says_why_on_its_span(make_stack: Any) -> None:
    # The abandonment reply can reach no program: it is queued after the terminal (or after the
    # cancel), when the worker is gone. The nested call's span is where the text is seen.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def blocker(inv: Any) -> Any:
        await inv.signal.wait()  # until the run settles

    async def writer(inv: Any) -> Any:
        raise AssertionError("an abandoned call never runs")

    async with make_stack(tracer_provider=provider) as stack:
        stack.registry.register_tool("blocker", blocker)
        stack.registry.register_tool("writer", writer)
        program = (
            "import asyncio\n"
            "asyncio.ensure_future(tools.blocker({}))\n"
            "asyncio.ensure_future(tools.writer({}))\n"
            "await asyncio.sleep(0.3)\n"
            "return 'done'"
        )
        _, result = await stack.run_code(program)
    assert value_of(result)["result"] == "done"
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool writer"]
    assert (span.attributes or {})["codemode.outcome"] == "ABANDONED"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == (
        "run_code run is over (run_code settled); writer tool call abandoned"
    )
    provider.shutdown()


async def test_the_result_waits_for_a_commit_in_progress(stack: Stack) -> None:
    # The program returns while a call's post-execute (its commit) is running.
    commit: list[str] = []

    async def slow(inv: Any) -> Any:
        return "slow value"

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        if e.name == "slow":
            commit.append("started")
            await e.signal.wait()  # the run has settled: the program is gone
            commit.append(f"run over: {e.signal.reason}")
            await asyncio.sleep(0.3)
            commit.append("finished")
        return d

    stack.registry.register_tool("slow", slow)
    stack.registry.catalog.hooks("").post_execute.append(post)
    agent = await stack.code_agent()
    program = (
        "import asyncio\n"
        "asyncio.ensure_future(tools.slow({}))\n"
        "await asyncio.sleep(0.3)\n"
        "return 'early'"
    )
    _, result = await stack.run_code(program, agent=agent)
    assert value_of(result)["result"] == "early"
    assert commit == ["started", "run over: run_code settled", "finished"]
    records = await _records(stack, agent)
    assert [(r.kind, r.call_id) for r in records] == [
        ("tool/call", "call-1"),
        ("tool/code-dispatch-start", "call-1:code:1"),
        ("tool/code-dispatch", "call-1:code:1"),
        ("tool/result", "call-1"),
    ]
    settle = records[2]
    assert settle.is_error and settle.error_code == "ABORTED"  # success replaced by abort


def test_max_parallel_sub_calls_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        RegistrySettings(max_parallel_sub_calls=0)
    assert RegistrySettings().max_parallel_sub_calls == 10
    assert RegistrySettings().default_mode.value == "native"
