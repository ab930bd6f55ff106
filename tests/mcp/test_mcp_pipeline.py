"""An MCP server's tools pass the same pipeline as a `ToolProvider`'s: the operator's policy rules
(deny, ask) and the approver streams apply to them, and what a rule refuses never reaches the
server (its marks say so)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.mcp.conftest import attach, mcp_settings, tools_of

RULES = """
rules:
  - tool: echo
    agent: "agents/locked"
    action: deny
    reason: locked agents do not echo
  - tool: slow
    action: deny
  - tool: add
    action: ask
    reason: sums need a human
"""


async def _approver(h: Any) -> Any:
    call = h.stub.Approve()
    await call.write(rpb.ApproveRequest(open=rpb.OpenApprover(approver_name="human")))
    opened = await call.read()
    assert opened.WhichOneof("message") == "opened"
    return call


async def test_rules_and_approvals_apply_to_mcp_tools(
    make_registry: Any, mark_dir: Path, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    async with make_registry(policy_rules=rules, **mcp_settings(mark_dir, "tools")) as h:
        locked = await attach(h, "locked", "tools")
        free = await attach(h, "free", "tools")
        await tools_of(h, locked, "echo", "add", "slow")
        await tools_of(h, free, "echo", "add", "slow")

        _, result = await h.execute("echo", {"text": "x"}, agent=locked, call_id="d1")
        assert (result.error.code, result.error.message) == ("DENIED", "locked agents do not echo")
        _, result = await h.execute("echo", {"text": "x"}, agent=free, call_id="d2")
        assert not result.is_error and jsonvalue.loads(result.value_json) == {"result": "x"}
        # Denied before the server is asked: `slow` would leave a start mark.
        _, result = await h.execute("slow", {"marker": "denied"}, agent=free, call_id="d3")
        assert result.is_error and result.error.code == "DENIED"
        assert await asyncio.to_thread(os.listdir, mark_dir) == []
        record = await h.settled(free, "d3")
        assert record.is_error and record.error_code == "DENIED"

        # An ask rule: the approver sees the MCP tool's call, and its answer decides.
        approver = await _approver(h)
        allowed = asyncio.create_task(h.execute("add", {"a": 1, "b": 2}, agent=free, call_id="a1"))
        request = (await approver.read()).request
        assert (request.tool_name, request.agent, request.reason) == (
            "add",
            free,
            "sums need a human",
        )
        await approver.write(
            rpb.ApproveRequest(
                decision=rpb.ApprovalDecision(
                    approval_id=request.approval_id, outcome=rpb.APPROVAL_OUTCOME_ALLOWED_ONCE
                )
            )
        )
        events, result = await allowed
        assert [e.WhichOneof("event") for e in events] == [
            "started",
            "approval_pending",
            "approval_resolved",
        ]
        assert not result.is_error and jsonvalue.loads(result.value_json) == {"sum": 3}
        assert (await approver.read()).WhichOneof("message") == "withdrawn"

        rejected = asyncio.create_task(h.execute("add", {"a": 1, "b": 2}, agent=free, call_id="a2"))
        request = (await approver.read()).request
        await approver.write(
            rpb.ApproveRequest(
                decision=rpb.ApprovalDecision(
                    approval_id=request.approval_id, outcome=rpb.APPROVAL_OUTCOME_REJECTED
                )
            )
        )
        _, result = await rejected
        assert result.is_error and result.error.message == 'the user rejected tool "add"'
        approver.cancel()
