"""`mcp serve --elicit-approvals`: an approval of this server's own calls is asked of the MCP
client's user, through MCP elicitation, where the client declared it.

The server connects one approver (`codemode_client.Approver`, concurrent) for its principal. A
request is answered only when it belongs to a call this server is running for a client that
can elicit (the call itself, or a nested call of its `run_code` program: `<call_id>:code:<n>`);
every other request is abstained from, so the agent's other approvers (the console, an
on-call service) decide it as before, and the first answer wins. The user's "accept" with
approve checked allows the call once, "decline" or approve unchecked rejects it, and dismissing
the form abstains. A request withdrawn meanwhile (answered elsewhere, the call gone) cancels
its elicitation.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from codemode_client import Approver

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

    from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb

log = logging.getLogger("codemode.mcp")

SCHEMA = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve",
            "description": "Allow this one call",
        }
    },
    "required": ["approve"],
}


class ElicitedApprovals:
    """The calls in flight whose approvals are elicited, and the approver that answers them."""

    def __init__(self, channel: grpc.aio.Channel, agent: str) -> None:
        self.agent = agent
        self._calls: dict[str, ServerRequestContext[Any, Any]] = {}
        self._approver = Approver(channel, f"mcp serve {agent}", self._decide, concurrent=True)

    async def start(self) -> None:
        """Connects the approver; without the `approve` permission approvals stay with the
        agent's other approvers (logged once)."""
        try:
            await self._approver.start()
        except (grpc.aio.AioRpcError, RuntimeError) as exc:
            why = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning("approvals are not elicited: the approver stream was refused (%s)", why)

    async def close(self) -> None:
        await self._approver.close()

    @contextlib.contextmanager
    def asking(self, call_id: str, ctx: ServerRequestContext[Any, Any]) -> Iterator[None]:
        """While the block runs, approvals of `call_id` are asked of `ctx`'s client (if it
        declared elicitation; else they are left to the other approvers)."""
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            yield
            return
        self._calls[call_id] = ctx
        try:
            yield
        finally:
            self._calls.pop(call_id, None)

    async def _decide(self, request: rpb.ApprovalRequest) -> bool | None:
        if request.agent != self.agent:
            return None
        ctx = self._calls.get(request.call_id.split(":code:", 1)[0])
        if ctx is None:
            return None
        message = (
            f"{self.agent} wants to call {request.tool_name} ({request.reason}). "
            f"Arguments: {request.arguments_json[:2000]}"
        )
        try:
            answer = await ctx.session.elicit_form(message, SCHEMA, ctx.request_id)
        except Exception as exc:  # the client went away or cannot elicit now: leave it
            log.warning("could not ask about %s: %s", request.call_id, exc)
            return None
        if answer.action == "accept":
            return bool((answer.content or {}).get("approve"))
        if answer.action == "decline":
            return False
        return None
