"""One agent as an MCP server: the MCP side of `codemode mcp serve`, whatever the transport.

A thin adapter over the Python client (`codemode_client.RegistryClient`); it decides nothing
the registry decides:

- `tools/list` is what the agent's mode shows its model, read from the model-facing API on
  every call: `GetWireSchemas` (under `code` only `run_code`; under `native`/`both` the tools),
  with `GetSdk`'s text appended to `run_code`'s description, as a model given only the tool list
  still needs the bindings; `GetSystemPrompt`'s text is the server's `instructions`.
- `tools/call` is one `ExecuteToolCall` for the agent. Its nested calls and approval waits are
  MCP progress notifications (when the client sent a progress token); MCP cancellation cancels
  the task, which cancels the gRPC call, so the registry aborts the run; the result or refusal
  becomes a `CallToolResult` (`mcp_results.py`); with `approvals`, its approvals are asked of
  the client's user (`mcp_approvals.py`).
- The registry has no catalog-change stream, so `watch_catalog` re-reads the presentation every
  few seconds and announces a change as `notifications/tools/list_changed` (to handshake-era
  connections directly, to 2026-07-28 clients through `subscriptions/listen`).

The agent is fixed at start and the registry connection carries one principal's credentials:
nothing an MCP client sends can name another agent or another principal.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import uuid
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from codemode_cli import mcp_results
from codemode_client.client import ToolCallResult
from codemode_client.errors import CodemodeError
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.jsonvalue import JsonValueError

if TYPE_CHECKING:
    from mcp.server.connection import Connection
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp.server.models import InitializationOptions

    from codemode_cli.mcp_approvals import ElicitedApprovals
    from codemode_client import RegistryClient

log = logging.getLogger("codemode.mcp")

RUN_CODE = "run_code"


@dataclass(frozen=True)
class Presentation:
    """What the agent's model is shown: its MCP tools and instructions."""

    tools: tuple[types.Tool, ...]
    instructions: str

    @property
    def fingerprint(self) -> str:
        """Changes exactly when the tools or the instructions change."""
        dumped = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in self.tools]
        text = json.dumps([dumped, self.instructions], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


async def fetch_presentation(client: RegistryClient, agent: str) -> Presentation:
    """The agent's presentation, from the same three RPCs a model loop reads."""
    schemas, sdk, prompt = await asyncio.gather(
        client.wire_schemas(agent), client.sdk(agent), client.system_prompt(agent)
    )
    tools = []
    for schema in schemas:
        description = str(schema["description"])
        if schema["name"] == RUN_CODE and sdk:
            description = f"{description}\n\n{sdk}"
        tools.append(
            types.Tool(
                name=str(schema["name"]),
                description=description,
                input_schema=_object_root(schema["parameters"]),
            )
        )
    return Presentation(tuple(tools), prompt)


def _object_root(parameters: object) -> dict[str, Any]:
    """The wire schema with `type: object` at its root, which MCP requires. The registry
    already requires a root that accepts objects and arguments are always objects, so this
    narrows nothing a call could pass (`{}`, a provider's schema for untyped arguments)."""
    if not isinstance(parameters, dict):
        return {"type": "object"}
    if parameters.get("type") == "object":
        return parameters
    return {**parameters, "type": "object"}


def _progress_message(event: rpb.ExecuteToolCallResponse) -> str | None:
    """One line per progress event the MCP client is told about, or None (not told)."""
    kind = event.WhichOneof("event")
    if kind == "nested_started":
        started = event.nested_started
        return f"started tools.{started.tool_name} ({started.sub_call_id})"
    if kind == "nested_settled":
        s = event.nested_settled
        status = f"error {s.error_code}".strip() if s.is_error else "ok"
        return f"settled tools.{s.tool_name} ({s.sub_call_id}): {status}"
    if kind == "tool_progress":
        p = event.tool_progress
        done = f"{p.progress:g}/{p.total:g}" if p.HasField("total") else f"{p.progress:g}"
        said = f": {p.message}" if p.message else ""
        return f"progress tools.{p.tool_name} ({p.call_id}) {done}{said}"
    if kind == "approval_pending":
        return f"waiting for approval: {event.approval_pending.reason}"
    if kind == "approval_resolved":
        outcome = event.approval_resolved.outcome
        name = rpb.ApprovalOutcome.Name(outcome).removeprefix("APPROVAL_OUTCOME_")
        return f"approval {name.lower()}"
    return None


class AgentServer:
    """The MCP server of one agent, over one registry client."""

    def __init__(
        self,
        client: RegistryClient,
        agent: str,
        presentation: Presentation,
        *,
        call_timeout_s: float,
        approvals: ElicitedApprovals | None = None,
    ) -> None:
        self.client = client
        self.approvals = approvals
        self.agent = agent
        self.current = presentation
        self.call_timeout_s = call_timeout_s
        self.bus = InMemorySubscriptionBus()
        # Handshake-era connections, to announce catalog changes to (weak: a closed one goes).
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self.server: Server[Any] = Server(
            f"codemode {agent}",
            version="0.1.0",
            instructions=presentation.instructions or None,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(self.bus),
        )
        self.server.middleware.append(self._remember_connection)

    def initialization_options(self) -> InitializationOptions:
        return self.server.create_initialization_options(NotificationOptions(tools_changed=True))

    async def _remember_connection(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            # ServerSession exposes no public handle on its connection; the notification must
            # go on the connection's standalone channel, not on one request's.
            self._connections.add(ctx.session._connection)
        return await call_next(ctx)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            presentation = await fetch_presentation(self.client, self.agent)
        except CodemodeError as exc:
            why = f"{exc.code.name}, {exc.reason}" if exc.reason else exc.code.name
            message = f"the registry refused: {exc.message} ({why})"
            raise MCPError(types.INTERNAL_ERROR, message) from None
        await self._adopt(presentation)
        return types.ListToolsResult(tools=list(presentation.tools))

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        call_id = f"mcp-{uuid.uuid4().hex[:16]}"
        arguments = params.arguments or {}
        # Without a progress token nobody is told of progress: the registry then sends the
        # result alone (one message instead of one per event).
        wants_progress = bool(params.meta and "progress_token" in params.meta)
        progress = 0
        asking = self.approvals.asking(call_id, ctx) if self.approvals else contextlib.nullcontext()
        try:
            with asking:
                events = self.client.execute(
                    params.name,
                    arguments,
                    agent=self.agent,
                    call_id=call_id,
                    deadline=self.call_timeout_s,
                    progress="all" if wants_progress else "none",
                )
                async for event in events:
                    if event.WhichOneof("event") == "result":
                        result = ToolCallResult.from_proto(event.result, [])
                        return mcp_results.tool_result(result, call_id)
                    message = _progress_message(event)
                    if message is not None:
                        progress += 1
                        await ctx.session.report_progress(progress, None, message)
        except CodemodeError as exc:
            return mcp_results.refused(exc, call_id)
        except JsonValueError as exc:  # arguments that are not lossless JSON (e.g. -0.0)
            return mcp_results.bad_arguments(str(exc), call_id)
        raise MCPError(types.INTERNAL_ERROR, f"the registry ended call {call_id} without a result")

    async def _adopt(self, presentation: Presentation) -> None:
        """Takes a freshly read presentation; announces it if it differs from the last one."""
        if presentation.fingerprint == self.current.fingerprint:
            return
        self.current = presentation
        self.server.instructions = presentation.instructions or None  # for new connections
        await self.bus.publish(ToolsListChanged())
        for connection in list(self._connections):
            try:
                await connection.send_tool_list_changed()
            except Exception:  # a connection closing under us: it is dropped from the set
                self._connections.discard(connection)

    async def watch_catalog(self, interval_s: float) -> None:
        """Re-reads the presentation every `interval_s` until cancelled (see the module doc)."""
        failing = False
        while True:
            await asyncio.sleep(interval_s)
            try:
                presentation = await fetch_presentation(self.client, self.agent)
            except CodemodeError as exc:
                if not failing:
                    log.warning("cannot read %s's tools: %s", self.agent, exc.message)
                failing = True
                continue
            failing = False
            await self._adopt(presentation)
