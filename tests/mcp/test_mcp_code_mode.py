"""A code-mode agent's program calls MCP-provided tools through its typed bindings: every nested
call passes the one pipeline, with its history records and its span."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from codemode_wire.api.registry.v1 import presentation_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.codemode.conftest import value_of
from tests.mcp.conftest import attach, mcp_settings, tools_of
from tests.registry.conftest import CODE

PROGRAM = """
total = await tools.add({"a": 20, "b": 22})
echoed = await tools.echo({"text": "via mcp"})
try:
    await tools.fail({"why": "in a program"})
    failed = None
except ToolCallError as e:
    failed = str(e)
return [total, echoed, failed]
"""


async def test_a_program_fans_out_over_mcp_tools(make_stack: Any, mark_dir: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with make_stack(tracer_provider=provider, **mcp_settings(mark_dir, "tools")) as stack:
        agent = await attach(stack, "coder", "tools", mode=CODE)
        await tools_of(stack, agent, "add", "echo", "fail")
        # The SDK the model reads declares the MCP tools with their schemas.
        sdk = await stack.stub.GetSdk(presentation_pb2.GetSdkRequest(scope=agent))
        assert "add" in sdk.text and "echo" in sdk.text and "Adds two integers" in sdk.text
        _, result = await stack.run_code(PROGRAM, agent=agent)
        total, echoed, failed = value_of(result)["result"]
        assert total == {"sum": 42} and echoed == {"result": "via mcp"}
        assert "refused: in a program" in failed
        page = await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
        dispatched = [r for r in page.records if r.kind == "tool/code-dispatch"]
        assert [(r.tool_name, r.call_id, r.is_error) for r in dispatched] == [
            ("add", "call-1:code:1", False),
            ("echo", "call-1:code:2", False),
            ("fail", "call-1:code:3", True),
        ]
        assert all(r.parent_call_id == "call-1" for r in dispatched)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    outer = spans["execute_tool run_code"]
    for name in ("add", "echo", "fail"):
        nested = spans[f"execute_tool {name}"]
        assert nested.context.trace_id == outer.context.trace_id
    provider.shutdown()
