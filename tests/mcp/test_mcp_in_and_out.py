"""MCP in and out at once: an MCP client calls `run_code` through `codemode mcp serve`, and the
program fans out over tools an attached MCP server provides. Every nested call passes the one
pipeline: a history record and a span each, in the outer call's trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.mcp.conftest import attach, mcp_settings, tools_of
from tests.mcp_serve.conftest import stdio_server
from tests.registry.conftest import CODE

FAN_OUT = (
    "import asyncio\n"
    "sums = await asyncio.gather(*(tools.add({'a': n, 'b': n}) for n in range(4)))\n"
    "echoed = await tools.echo({'text': 'in and out'})\n"
    "return [[s['sum'] for s in sums], echoed['result']]"
)


async def test_an_mcp_client_runs_a_program_over_mcp_provided_tools(
    make_stack: Any, mark_dir: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with make_stack(tracer_provider=provider, **mcp_settings(mark_dir, "tools")) as stack:
        agent = await attach(stack, "both-ways", "tools", mode=CODE)
        await tools_of(stack, agent, "add", "echo")
        async with Client(stdio_server(stack.running.address, agent)) as client:
            listed = [t.name for t in (await client.list_tools()).tools]
            assert listed == ["run_code"]  # the MCP-provided tools reach the model as bindings
            result = await client.call_tool(
                "run_code", {"code": FAN_OUT, "description": "mcp in and out"}
            )
        assert not result.is_error, result.content
        assert result.structured_content == {
            "logs": [],
            "result": [[0, 2, 4, 6], "in and out"],
        }
        call_id = result.meta["codemode"]["call_id"] if result.meta else ""
        page = await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
        assert call_id
        records = [r for r in page.records if call_id in (r.call_id, r.parent_call_id)]
    dispatched = [r for r in records if r.kind == "tool/code-dispatch"]
    assert sorted(r.tool_name for r in dispatched) == ["add", "add", "add", "add", "echo"]
    assert all(r.parent_call_id == call_id and not r.is_error for r in dispatched)
    assert [r.kind for r in records if r.call_id == call_id] == ["tool/call", "tool/result"]
    spans = exporter.get_finished_spans()
    (outer,) = [s for s in spans if s.name == "execute_tool run_code"]
    nested = [s for s in spans if s.name in ("execute_tool add", "execute_tool echo")]
    assert len(nested) == 5
    assert all(s.context.trace_id == outer.context.trace_id for s in nested)
    provider.shutdown()
