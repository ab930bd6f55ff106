"""Every failure has its code: whichever way a call settles as an error, its result and its
history record name a code a caller can branch on (never the empty string).

One case per settle path of a direct call, through the real gRPC API: a tool body's plain
exception and its code-less `ToolCallFailure`, an unknown tool, invalid arguments and output, a
pre-execute deny, a guard, a rejected approval, a post-execute block, a provider's code-less
error and its disconnect (the caller's cancellation is tests/registry/test_providers.py's).
Nested calls, `run_code`'s own failures and a plugin stopped mid-call are in
tests/codemode/test_error_codes_nested.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from codemode_client import ToolProvider
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.calls import ToolCallFailure
from registry_service.domain.policy import Ask, Block, Deny
from registry_service.domain.results import TextBlock
from tests.registry.conftest import Harness, echo_tool
from tests.registry.test_providers import RawProvider

Arrange = Callable[[Harness, str], Awaitable[Callable[[], Awaitable[Any]] | None]]
"""Sets a failure up for agent `agent`'s tool `t`; returns what to run beside the call (or
None): the call itself is `t` with `{}`."""


async def _plain_exception(h: Harness, agent: str) -> None:
    async def body(_inv: Any) -> Any:
        raise RuntimeError("disk on fire")

    h.registry.register_tool("t", body, scope=agent)


async def _failure_without_code(h: Harness, agent: str) -> None:
    async def body(_inv: Any) -> Any:
        raise ToolCallFailure("no luck today")

    h.registry.register_tool("t", body, scope=agent)


async def _empty_exception(h: Harness, agent: str) -> None:
    async def body(_inv: Any) -> Any:
        raise ValueError

    h.registry.register_tool("t", body, scope=agent)


async def _invalid_output(h: Harness, agent: str) -> None:
    async def body(_inv: Any) -> Any:
        return {"n": "seven"}

    schema: JsonValue = {"type": "object", "properties": {"n": {"type": "number"}}}
    h.registry.register_tool("t", body, output_schema=schema, scope=agent)


async def _invalid_args(h: Harness, agent: str) -> None:
    schema = {"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}}
    echo_tool(h.registry, "t", input_schema=schema, scope=agent)


async def _unknown_tool(h: Harness, agent: str) -> None:
    echo_tool(h.registry, "not_t", scope=agent)


async def _pre_execute_deny(h: Harness, agent: str) -> None:
    echo_tool(h.registry, "t", scope=agent)

    async def pre(_e: Any, _d: Any) -> Any:
        return Deny("not today")

    h.registry.catalog.hooks(agent).pre_execute.append(pre)


async def _guard(h: Harness, agent: str) -> None:
    echo_tool(h.registry, "t", scope=agent)
    h.registry.catalog.hooks(agent).guards.append(lambda _e: "guarded")


async def _approval_rejected(h: Harness, agent: str) -> Callable[[], Awaitable[Any]]:
    echo_tool(h.registry, "t", scope=agent)

    async def pre(_e: Any, _d: Any) -> Any:
        return Ask("please")

    h.registry.catalog.hooks(agent).pre_execute.append(pre)
    approvals = h.stub.Approve()
    await approvals.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="no")))

    async def reject() -> None:
        async for message in approvals:
            if message.WhichOneof("message") == "request":
                answer = rpb.ApprovalDecision(
                    approval_id=message.request.approval_id,
                    outcome=rpb.APPROVAL_OUTCOME_REJECTED,
                )
                await approvals.write(rpb.ApproveRequest(decision=answer))
                return

    return reject


async def _post_execute_block(h: Harness, agent: str) -> None:
    echo_tool(h.registry, "t", scope=agent)

    async def post(_e: Any, _r: Any, _d: Any) -> Any:
        return Block((TextBlock("redacted"),))

    h.registry.catalog.hooks(agent).post_execute.append(post)


async def _provider_error_without_code(h: Harness, agent: str) -> Callable[[], Awaitable[Any]]:
    raw = await RawProvider(h).open()
    await raw.register(tool_pb2.Tool(name="t"), scope=agent)
    failed = tool_pb2.ToolResult(is_error=True, error=tool_pb2.ToolError(message="it broke"))

    async def answer() -> None:
        await raw.answer(failed)

    return answer


async def _provider_disconnects(h: Harness, agent: str) -> Callable[[], Awaitable[Any]]:
    provider = ToolProvider(h.channel, "flaky")
    started = asyncio.Event()

    @provider.tool(name="t", scope=agent)
    async def slow(_args: Any, _ctx: Any) -> Any:
        started.set()
        await asyncio.Event().wait()

    await provider.start()

    async def disconnect() -> None:
        await started.wait()
        await provider.close()

    return disconnect


CASES: dict[str, tuple[Arrange, str]] = {
    "plain-exception": (_plain_exception, "TOOL_FAILED"),
    "failure-without-code": (_failure_without_code, "TOOL_FAILED"),
    "empty-exception": (_empty_exception, "TOOL_FAILED"),
    "invalid-output": (_invalid_output, "INVALID_TOOL_OUTPUT"),
    "invalid-args": (_invalid_args, "INVALID_ARGS"),
    "unknown-tool": (_unknown_tool, "UNKNOWN_TOOL"),
    "pre-execute-deny": (_pre_execute_deny, "DENIED"),
    "guard": (_guard, "DENIED"),
    "approval-rejected": (_approval_rejected, "DENIED"),
    "post-execute-block": (_post_execute_block, "BLOCKED"),
    "provider-error-without-code": (_provider_error_without_code, "TOOL_FAILED"),
    "provider-disconnects": (_provider_disconnects, "PROVIDER_UNAVAILABLE"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_every_failed_direct_call_names_its_code(harness: Harness, case: str) -> None:
    arrange, code = CASES[case]
    agent = await harness.agent("a")
    beside = await arrange(harness, agent)
    call = asyncio.ensure_future(harness.execute("t", {}, agent=agent, call_id=case))
    if beside is not None:
        await beside()
    _events, result = await call
    assert result.is_error
    assert result.error.code == code, result.error.message
    record = await harness.settled(agent, case)
    assert record.is_error and record.error_code == code


def test_a_failed_result_cannot_be_built_without_a_code() -> None:
    # The domain's one construction rule behind every case above.
    from registry_service.domain.results import ErrorInfo, ToolResult, error_result

    assert error_result("x", "").error == ErrorInfo("x", "TOOL_FAILED")
    assert ToolResult((TextBlock("Error: it broke"),), is_error=True).error == ErrorInfo(
        "it broke", "TOOL_FAILED"
    )
    assert ToolResult((TextBlock("fine"),)).error is None
