"""A tool's own progress, from an MCP server's `notifications/progress` to the caller: the
registry's MCP client sends a progress token with each `tools/call` and the pipeline's one
`ProgressReporter` bounds what the caller's stream (and the call's observers) get: in order,
increasing, finite, a bounded message, a flood coalesced."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.config import RegistrySettings
from registry_service.domain import events
from registry_service.domain.events import (
    MAX_PROGRESS_MESSAGE,
    PROGRESS_BURST,
    PROGRESS_PER_SECOND,
    ProgressReporter,
    ToolProgress,
)
from registry_service.domain.observers import Observers
from registry_service.registry import build_registry
from tests.codemode.conftest import value_of
from tests.mcp.conftest import attach, mcp_settings, tools_of
from tests.mcp_serve.conftest import stdio_server
from tests.registry.conftest import CODE


def progress_of(stream: list[rpb.ExecuteToolCallResponse]) -> list[rpb.ToolProgress]:
    return [e.tool_progress for e in stream if e.WhichOneof("event") == "tool_progress"]


class Seen:
    """An observer that keeps the `ToolProgress` events it is told."""

    def __init__(self) -> None:
        self.progress: list[ToolProgress] = []

    def observe(self, event: object) -> None:
        if isinstance(event, ToolProgress):
            self.progress.append(event)


def watch(h: Any) -> Seen:
    seen = Seen()
    executor = h.registry.executor
    executor.observers = Observers((*executor.observers.members, seen))
    return seen


async def test_a_direct_call_streams_its_tools_progress_before_the_result(
    make_registry: Any, mark_dir: Path
) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "a1", "tools")
        await tools_of(h, agent, "progress")
        seen = watch(h)
        stream, result = await h.execute(
            "progress", {"values": ["1", "2", "3"], "total": 3}, agent=agent, call_id="p1"
        )
        assert not result.is_error, result.error.message
        reported = progress_of(stream)
        assert [(p.call_id, p.tool_name) for p in reported] == [("p1", "progress")] * 3
        assert [(p.progress, p.total, p.message) for p in reported] == [
            (1.0, 3.0, "step 0"),
            (2.0, 3.0, "step 1"),
            (3.0, 3.0, "step 2"),
        ]
        kinds = [e.WhichOneof("event") for e in stream]
        assert kinds[0] == "started" and kinds[1:] == ["tool_progress"] * 3
        # The observers are told the same events (and a call without a total has none).
        assert [e.progress for e in seen.progress] == [1.0, 2.0, 3.0]
        stream, _ = await h.execute("progress", {"values": ["5"]}, agent=agent, call_id="p2")
        (only,) = progress_of(stream)
        assert only.progress == 5.0 and not only.HasField("total")


async def test_decreasing_and_nan_progress_is_dropped(make_registry: Any, mark_dir: Path) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "a1", "tools")
        await tools_of(h, agent, "progress")
        values = ["1", "3", "2", "3", "nan", "4", "-1"]
        stream, result = await h.execute("progress", {"values": values}, agent=agent)
        assert not result.is_error, result.error.message
        assert [p.progress for p in progress_of(stream)] == [1.0, 3.0, 4.0]


async def test_progress_events_approvals_carries_no_tool_progress(
    make_registry: Any, mark_dir: Path
) -> None:
    async with make_registry(**mcp_settings(mark_dir, "tools")) as h:
        agent = await attach(h, "a1", "tools")
        await tools_of(h, agent, "progress")
        for choice in (rpb.PROGRESS_EVENTS_APPROVALS, rpb.PROGRESS_EVENTS_NONE):
            stream, result = await h.execute(
                "progress",
                {"values": ["1", "2"]},
                agent=agent,
                call_id=f"c{choice}",
                progress=choice,
            )
            assert not result.is_error and stream == []
        stream, _ = await h.execute(
            "progress", {"values": ["1", "2"]}, agent=agent, progress=rpb.PROGRESS_EVENTS_ALL
        )
        assert len(progress_of(stream)) == 2


async def test_a_progress_flood_is_coalesced_and_the_call_returns(
    make_registry: Any, mark_dir: Path
) -> None:
    count = 10_000
    settings = mcp_settings(mark_dir, "tools", mcp_messages_per_second=1_000_000)
    async with make_registry(**settings) as h:
        agent = await attach(h, "a1", "tools")
        bystander = await attach(h, "bystander", "tools")
        await tools_of(h, agent, "progress_flood")
        await tools_of(h, bystander, "add")
        loop = asyncio.get_running_loop()
        started = loop.time()
        flood = asyncio.ensure_future(
            h.execute("progress_flood", {"count": count}, agent=agent, call_id="flood")
        )
        # Another tenant's calls go on meanwhile, and see none of the flood.
        for n in range(3):
            theirs, other = await h.execute(
                "add", {"a": n, "b": 1}, agent=bystander, call_id=f"b{n}"
            )
            assert value_of(other) == {"sum": n + 1} and progress_of(theirs) == []
        stream, result = await flood
        took = loop.time() - started
        assert not result.is_error, result.error.message
        assert value_of(result) == {"result": "flooded"}
        values = [p.progress for p in progress_of(stream)]
        # The burst arrives whole and in order; past it, at most the bucket's rate over the
        # time the call took (however long the machine made it), latest values only.
        assert values[:PROGRESS_BURST] == [float(i) for i in range(1, PROGRESS_BURST + 1)]
        assert len(values) <= PROGRESS_BURST + PROGRESS_PER_SECOND * took + 2
        assert values[-1] == count  # the latest value is always seen
        assert len(values) < count // 10
        assert values == sorted(set(values))
        messages = [p.message for p in progress_of(stream)]
        assert all(len(m) == MAX_PROGRESS_MESSAGE and m.endswith("\u2026") for m in messages)


PROGRAM = """
first = await tools.progress({"values": ["1", "2"], "total": 2})
second = await tools.progress({"values": ["7"]})
return [first, second]
"""


async def test_a_nested_calls_progress_reaches_the_run_code_stream_and_observers(
    make_stack: Any, mark_dir: Path
) -> None:
    async with make_stack(**mcp_settings(mark_dir, "tools")) as stack:
        agent = await attach(stack, "coder", "tools", mode=CODE)
        await tools_of(stack, agent, "progress")
        seen = watch(stack)
        stream, result = await stack.run_code(PROGRAM, agent=agent)
        assert value_of(result)["result"] == [{"result": "reported"}] * 2
        reported = progress_of(stream)
        assert [(p.call_id, p.progress) for p in reported] == [
            ("call-1:code:1", 1.0),
            ("call-1:code:1", 2.0),
            ("call-1:code:2", 7.0),
        ]
        # Each nested call's progress comes between its start and its settle.
        kinds = [
            (e.WhichOneof("event"), e.tool_progress.call_id or e.nested_settled.sub_call_id)
            for e in stream
            if e.WhichOneof("event") in ("tool_progress", "nested_settled")
        ]
        assert kinds == [
            ("tool_progress", "call-1:code:1"),
            ("tool_progress", "call-1:code:1"),
            ("nested_settled", "call-1:code:1"),
            ("tool_progress", "call-1:code:2"),
            ("nested_settled", "call-1:code:2"),
        ]
        assert [(e.call_id, e.progress) for e in seen.progress] == [
            (p.call_id, p.progress) for p in reported
        ]


async def test_mcp_serve_forwards_a_nested_calls_tool_progress(
    make_stack: Any, mark_dir: Path
) -> None:
    async with make_stack(**mcp_settings(mark_dir, "tools")) as stack:
        agent = await attach(stack, "both-ways", "tools", mode=CODE)
        await tools_of(stack, agent, "progress")
        seen: list[tuple[float, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, message))

        program = 'return await tools.progress({"values": ["1", "2"], "total": 2})'
        async with Client(stdio_server(stack.running.address, agent)) as client:
            result = await client.call_tool(
                "run_code", {"code": program, "description": "p"}, progress_callback=on_progress
            )
        assert not result.is_error, result.content
    # The nested call's start, its two progress values, its settle: one notification each.
    messages = [m or "" for _, m in seen]
    assert [p for p, _ in seen] == [1.0, 2.0, 3.0, 4.0]
    assert messages[0].startswith("started tools.progress")
    assert messages[1].startswith("progress tools.progress (") and messages[1].endswith(
        ") 1/2: step 0"
    )
    assert messages[2].endswith(") 2/2: step 1")
    assert messages[3].startswith("settled tools.progress")


# -- the reporter itself --------------------------------------------------------------------------


async def test_the_reporter_drops_bad_values_and_coalesces_past_its_burst() -> None:
    sent: list[events.Event] = []
    report = ProgressReporter("c", "t", sent.append)
    for bad in (math.nan, math.inf, -math.inf):
        report(bad, None, None)
    assert sent == []
    report(1, math.inf, "x" * (MAX_PROGRESS_MESSAGE * 2))
    first = sent[0]
    assert isinstance(first, ToolProgress)
    assert first.total is None and len(first.message) == MAX_PROGRESS_MESSAGE
    report(1, 2, "same")  # not above the last: dropped
    report(0.5, 2, "lower")
    assert len(sent) == 1
    for value in range(2, PROGRESS_BURST + 10):
        report(value, None, None)
    assert [e.progress for e in sent if isinstance(e, ToolProgress)] == list(
        range(1, PROGRESS_BURST + 1)
    )
    # Past the burst only the latest waiting value goes out, once a token is back.
    flushed = asyncio.Event()

    def emit(event: events.Event) -> None:
        sent.append(event)
        flushed.set()

    report._emit = emit
    await asyncio.wait_for(flushed.wait(), 30)
    last = sent[-1]
    assert isinstance(last, ToolProgress) and last.progress == PROGRESS_BURST + 9
    assert len(sent) == PROGRESS_BURST + 1


async def test_closing_the_reporter_sends_the_waiting_value_then_nothing() -> None:
    sent: list[events.Event] = []
    report = ProgressReporter("c", "t", sent.append)
    for value in range(1, PROGRESS_BURST + 3):
        report(value, None, None)
    assert len(sent) == PROGRESS_BURST
    report.close()
    last = sent[-1]
    assert len(sent) == PROGRESS_BURST + 1
    assert isinstance(last, ToolProgress) and last.progress == PROGRESS_BURST + 2
    report(1000, None, None)
    report.close()
    await asyncio.sleep(2 / PROGRESS_PER_SECOND)  # past when the waiting value was due
    assert len(sent) == PROGRESS_BURST + 1


@pytest.mark.parametrize("event", [ToolProgress("c", "t", 1.0, None, "m")])
def test_tool_progress_is_a_progress_event(event: ToolProgress) -> None:
    assert isinstance(event, events.PROGRESS)


async def test_the_calls_span_records_each_progress_its_caller_is_told(
    make_registry: Any, mark_dir: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings: dict[str, Any] = {"listen": "127.0.0.1:0", "history_path": ":memory:"}
    settings |= mcp_settings(mark_dir, "tools")
    registry = build_registry(RegistrySettings(**settings), tracer_provider=provider)
    async with make_registry(registry, **settings) as h:
        agent = await attach(h, "a1", "tools")
        await tools_of(h, agent, "progress")
        stream, result = await h.execute(
            "progress", {"values": ["1", "0", "nan", "2"], "total": 2}, agent=agent, call_id="p1"
        )
        assert not result.is_error, result.error.message
        told = [(p.progress, p.total) for p in progress_of(stream)]
        assert told == [(1.0, 2.0), (2.0, 2.0)]
        (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool progress"]
        recorded = [dict(e.attributes or {}) for e in span.events if e.name == "tool_progress"]
        # What the stream carried, in order; the dropped values (0 after 1, NaN) are not there,
        # and the server's message is not recorded.
        assert recorded == [
            {"codemode.progress": 1.0, "codemode.progress_total": 2.0},
            {"codemode.progress": 2.0, "codemode.progress_total": 2.0},
        ]
