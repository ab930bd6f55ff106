"""The parent token lifts only the `code` collapse (architecture invariant 2): a nested call
still goes through every stage of the pipeline. Each test runs a real program on a real
runtime and asserts what the program sees (its ToolCallError) and the settle record's error
code, read back over the ListHistory RPC."""

from __future__ import annotations

import asyncio
from typing import Any

from codemode_wire.api.registry.v1 import history_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.policy import Ask, PreDecision
from registry_service.domain.results import ToolResult, error_result
from tests.codemode.conftest import Stack, value_of

ARGUMENTS = {"path": "notes.txt"}


def program(name: str, arguments: str = repr(ARGUMENTS)) -> str:
    return (
        "try:\n"
        f"    return await tools.{name}({arguments})\n"
        "except ToolCallError as e:\n"
        "    return [e.toolName, str(e)]"
    )


async def settle_record(stack: Stack, agent: str) -> history_pb2.HistoryRecord:
    page: rpb.ListHistoryResponse = await stack.stub.ListHistory(
        rpb.ListHistoryRequest(agent=agent)
    )
    (settle,) = [r for r in page.records if r.kind == "tool/code-dispatch"]
    assert settle.call_id == "call-1:code:1" and settle.parent_call_id == "call-1"
    assert settle.is_error
    return settle


def body_that_must_not_run(ran: list[str], name: str) -> Any:
    async def body(inv: Any) -> Any:
        ran.append(name)
        return "ran"

    return body


async def test_a_guard_denies_a_nested_call(stack: Stack) -> None:
    ran: list[str] = []
    stack.registry.register_tool("write", body_that_must_not_run(ran, "write"))
    stack.registry.catalog.hooks("").guards.append(
        lambda e: "writes are frozen during the release" if e.name == "write" else None
    )
    agent = await stack.code_agent()
    _, result = await stack.run_code(program("write"), agent=agent)
    assert value_of(result)["result"] == ["write", "writes are frozen during the release"]
    assert (await settle_record(stack, agent)).error_code == "DENIED"
    assert ran == []


async def test_an_around_wrapper_short_circuits_a_nested_call(stack: Stack) -> None:
    ran: list[str] = []
    stack.registry.register_tool("fetch", body_that_must_not_run(ran, "fetch"))

    async def quota(e: Any, proceed: Any) -> ToolResult:
        if e.name == "fetch":
            return error_result("fetch quota exhausted for this hour", "QUOTA_EXHAUSTED")
        result: ToolResult = await proceed()
        return result

    stack.registry.catalog.hooks("").around.append(quota)
    agent = await stack.code_agent()
    _, result = await stack.run_code(program("fetch"), agent=agent)
    assert value_of(result)["result"] == ["fetch", "fetch quota exhausted for this hour"]
    assert (await settle_record(stack, agent)).error_code == "QUOTA_EXHAUSTED"
    assert ran == []


async def test_a_nested_result_is_validated_against_the_output_schema(stack: Stack) -> None:
    async def count(inv: Any) -> Any:
        return "seven"

    stack.registry.register_tool("count", count, output_schema={"type": "integer"})
    agent = await stack.code_agent()
    _, result = await stack.run_code(program("count"), agent=agent)
    assert value_of(result)["result"] == [
        "count",
        'tool "count" returned invalid output: result must be an integer',
    ]
    assert (await settle_record(stack, agent)).error_code == "INVALID_TOOL_OUTPUT"


async def test_nested_arguments_are_validated_against_the_input_schema(stack: Stack) -> None:
    ran: list[str] = []
    stack.registry.register_tool(
        "read",
        body_that_must_not_run(ran, "read"),
        input_schema={
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "lines": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["path"],
        },
    )
    agent = await stack.code_agent()
    arguments = "{'path': 'notes.txt', 'lines': [1, 'two']}"
    _, result = await stack.run_code(program("read", arguments), agent=agent)
    message = 'invalid arguments: "lines[1]" must be an integer'  # the path of the bad value
    assert value_of(result)["result"] == ["read", message]
    assert (await settle_record(stack, agent)).error_code == "INVALID_ARGS"
    assert ran == []


async def test_a_rejected_approval_refuses_a_nested_call(stack: Stack) -> None:
    ran: list[str] = []
    stack.registry.register_tool("write", body_that_must_not_run(ran, "write"))

    async def ask(e: Any, d: PreDecision) -> PreDecision:
        return Ask("write changes files") if e.name == "write" else d

    stack.registry.catalog.hooks("").pre_execute.append(ask)
    agent = await stack.code_agent()
    approver = stack.stub.Approve()
    await approver.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="human")))
    assert (await approver.read()).WhichOneof("message") == "opened"
    try:
        run = asyncio.create_task(stack.run_code(program("write"), agent=agent))
        request = (await asyncio.wait_for(approver.read(), 20)).request
        assert (request.call_id, request.tool_name, request.agent) == (
            "call-1:code:1",
            "write",
            agent,
        )
        assert request.arguments_json == '{"path":"notes.txt"}'
        await approver.write(
            rpb.ApproveRequest(
                decision=rpb.ApprovalDecision(
                    approval_id=request.approval_id, outcome=rpb.APPROVAL_OUTCOME_REJECTED
                )
            )
        )
        events, result = await asyncio.wait_for(run, 20)
    finally:
        approver.cancel()
    assert value_of(result)["result"] == ["write", 'the user rejected tool "write"']
    assert (await settle_record(stack, agent)).error_code == "DENIED"
    kinds = [e.WhichOneof("event") for e in events]
    assert "approval_pending" in kinds and "approval_resolved" in kinds
    assert ran == []
