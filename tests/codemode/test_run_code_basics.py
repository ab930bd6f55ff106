"""run_code end to end over real gRPC: registry → runtime → worker → nested calls → back."""

from __future__ import annotations

from typing import Any

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.codemode.conftest import Stack, value_of
from tests.registry.conftest import echo_tool, result_text


async def test_sequential_awaits_value_content_and_records(stack: Stack) -> None:
    async def echo(inv: Any) -> Any:
        return f"echo:{inv.arguments['text']}"

    stack.registry.register_tool("echo", echo)
    agent = await stack.code_agent()
    events, result = await stack.run_code(
        "a = await tools.echo({'text': 'one'})\n"
        "print('saw', a)\n"
        "return await tools.echo({'text': 'two'})",
        agent=agent,
    )
    assert value_of(result) == {"logs": ["saw echo:one"], "result": "echo:two"}
    assert result_text(result) == "saw echo:one\necho:two"
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds.count("nested_started") == 2 and kinds.count("nested_settled") == 2
    waits = [e.nested_started.queue_wait_ms for e in events if e.HasField("nested_started")]
    assert len(waits) == 2 and all(w >= 0 for w in waits)
    assert "log" in kinds
    history = await stack.registry.history.list(
        stack.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
    )
    summary = [(r.kind, r.call_id) for r in history]
    assert summary == [
        ("tool/call", "call-1"),
        ("tool/code-dispatch-start", "call-1:code:1"),
        ("tool/code-dispatch", "call-1:code:1"),
        ("tool/code-dispatch-start", "call-1:code:2"),
        ("tool/code-dispatch", "call-1:code:2"),
        ("tool/result", "call-1"),
    ]
    settle = history[2]
    assert settle.root_call_id == "call-1" and settle.parent_call_id == "call-1"
    assert settle.arguments_json == '{"text":"one"}' and not settle.is_error


async def test_no_progress_events_same_result_and_records(stack: Stack) -> None:
    async def echo(inv: Any) -> Any:
        return inv.arguments["text"]

    stack.registry.register_tool("echo", echo)
    agent = await stack.code_agent()
    program = "a = await tools.echo({'text': 'one'})\nprint(a)\nreturn a"
    events, result = await stack.run_code(program, agent=agent, progress=rpb.PROGRESS_EVENTS_NONE)
    assert events == []
    assert value_of(result) == {"logs": ["one"], "result": "one"}
    history = await stack.registry.history.list(
        stack.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
    )
    assert [r.kind for r in history] == [
        "tool/call",
        "tool/code-dispatch-start",
        "tool/code-dispatch",
        "tool/result",
    ]


async def test_no_output_text(stack: Stack) -> None:
    _, result = await stack.run_code("pass")
    assert value_of(result) == {"logs": []}
    assert result_text(result) == "(run_code completed with no output)"


async def test_failed_run_reports_kind_message_and_captured_output(stack: Stack) -> None:
    _, result = await stack.run_code("print('before')\nraise ValueError('boom')")
    assert result.is_error
    assert (result.error.code, result.error.name) == ("CODE_RUN_FAILED", "CodeRunFailedError")
    message = result.error.message
    assert message.startswith("code run failed (exception): ")
    assert "ValueError: boom" in message
    assert message.endswith("\nCaptured output:\nbefore")


async def test_tool_errors_reject_the_program_call(stack: Stack) -> None:
    echo_tool(stack.registry, "echo")
    program = (
        "try:\n"
        "    await tools.nope({})\n"
        "except AttributeError as e:\n"
        "    print('no binding')\n"
        "try:\n"
        "    await tools.echo({'x': float('nan')})\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)\n"
        "return 1"
    )
    _, result = await stack.run_code(program)
    assert value_of(result)["result"] == 1


async def test_blank_description_is_invalid(stack: Stack) -> None:
    _, result = await stack.run_code("return 1", description="   ")
    assert (
        result.is_error
        and result.error.message == "invalid description: expected a non-empty string"
    )


async def test_dispatch_start_record_is_durable_before_the_body_runs(stack: Stack) -> None:
    agent = await stack.code_agent()
    seen: list[list[str]] = []

    async def probe(inv: Any) -> Any:
        records = await stack.registry.history.list(
            stack.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
        )
        seen.append([f"{r.kind} {r.call_id}" for r in records])
        return len(seen)

    stack.registry.register_tool("probe", probe)
    _, result = await stack.run_code(
        "a = await tools.probe({})\nreturn await tools.probe({})", agent=agent
    )
    assert value_of(result)["result"] == 2
    assert seen[0][-1] == "tool/code-dispatch-start call-1:code:1"
    assert seen[1][-1] == "tool/code-dispatch-start call-1:code:2"
