"""Async client for the registry: agents and presets, tool calls and run_code, history.

    async with RegistryClient("127.0.0.1:50051") as client:
        agent = await client.create_agent("coder", mode="code")
        result = await client.run_code("return 1 + 1", "add numbers", agent=agent.name)
        result.value   # {"logs": [], "result": 2}

Every call carries a deadline (`timeout`, default 30 s) that covers all its attempts. Retries
are the channel's one gRPC retry policy (`channel.py`): idempotent reads on UNAVAILABLE and
RESOURCE_EXHAUSTED, a tool call only when admission control refused it (nothing started) or
the code runtime was at capacity (the program did not run), after the server's RetryInfo delay;
nothing that changes state is retried.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc

from codemode_client.agent_messages import AgentMessage, agent_message
from codemode_client.channel import open_channel
from codemode_client.errors import CodemodeError, from_rpc_error
from codemode_client.results import (
    AdditionalContext,
    ContentBlock,
    content_from_proto,
    contexts_from_proto,
)
from codemode_wire import jsonvalue, shared_logs
from codemode_wire.api.registry.v1 import history_pb2, presentation_pb2, scope_pb2, tool_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.jsonvalue import JsonValue

ModeName = Literal["native", "code", "both"]
Language = Literal["python", "typescript"]
# Which progress events an execute stream carries before its result (see ProgressEvents).
Progress = Literal["all", "approvals", "none"]
_PROGRESS = {
    "all": rpb.PROGRESS_EVENTS_ALL,
    "approvals": rpb.PROGRESS_EVENTS_APPROVALS,
    "none": rpb.PROGRESS_EVENTS_NONE,
}


def unbatched(message: rpb.ExecuteToolCallResponse) -> Iterable[rpb.ExecuteToolCallResponse]:
    """The events one execute-stream message carries, in order: a `batch`'s events (sent to
    requests that set `batch_progress`), else the message itself."""
    return message.batch.events if message.HasField("batch") else (message,)


_MODES: dict[str, scope_pb2.PresentationMode.ValueType] = {
    "native": scope_pb2.PRESENTATION_MODE_NATIVE,
    "code": scope_pb2.PRESENTATION_MODE_CODE,
    "both": scope_pb2.PRESENTATION_MODE_BOTH,
}


@dataclass(frozen=True)
class ToolCallResult:
    """The final result of a tool call, with the events that led to it."""

    is_error: bool
    value: JsonValue
    has_value: bool
    text: str
    error_code: str
    error_message: str
    concludes_turn: bool
    events: list[rpb.ExecuteToolCallResponse] = field(default_factory=list)
    raw: tool_pb2.ToolResult | None = None
    content: tuple[ContentBlock, ...] = ()
    """What the model is shown (`text` joins its text blocks)."""
    additional_contexts: tuple[AdditionalContext, ...] = ()
    """Messages to add to the conversation after the result."""

    @staticmethod
    def from_proto(
        result: tool_pb2.ToolResult, events: list[rpb.ExecuteToolCallResponse]
    ) -> ToolCallResult:
        has_value = result.HasField("value_json")
        return ToolCallResult(
            is_error=result.is_error,
            value=jsonvalue.loads(result.value_json) if has_value else None,
            has_value=has_value,
            text="\n".join(b.text.text for b in result.content if b.WhichOneof("block") == "text"),
            error_code=result.error.code,
            error_message=result.error.message,
            concludes_turn=result.concludes_turn,
            events=events,
            raw=result,
            content=content_from_proto(result.content),
            additional_contexts=contexts_from_proto(result.additional_contexts),
        )


class RegistryClient:
    def __init__(
        self,
        target: str | grpc.aio.Channel,
        *,
        timeout: float = 30.0,
        read_retries: int = 3,
        credentials: grpc.ChannelCredentials | None = None,
        bearer_token: str | None = None,
    ) -> None:
        """`target`: an address (the client owns the channel it opens: TLS with
        `credentials`, e.g. `grpc.ssl_channel_credentials(ca)`, else plaintext; its retry
        policy makes up to `read_retries` retries, and every call carries `bearer_token`
        when given) or a channel (open it with `open_channel` for the same policy)."""
        self._owned = isinstance(target, str)
        if not isinstance(target, str):
            self.channel: grpc.aio.Channel = target
        else:
            self.channel = open_channel(
                target,
                credentials=credentials,
                max_attempts=read_retries + 1,
                bearer_token=bearer_token,
            )
        self.stub = rpb_grpc.RegistryServiceStub(self.channel)
        self.timeout = timeout
        self.read_retries = read_retries

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owned:
            await self.channel.close()

    # -- plumbing ------------------------------------------------------------------------------

    async def _unary(
        self, method: Callable[..., Awaitable[Any]], request: Any, *, read: bool = False
    ) -> Any:
        """Calls a unary RPC with the client deadline, over all attempts (grpc is untyped:
        callers annotate). Which methods are retried is the channel's policy, not `read`'s:
        it only documents the call."""
        try:
            return await method(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def _all_pages(
        self, method: Callable[..., Awaitable[Any]], request: Any, field: str
    ) -> list[Any]:
        """Every item of a paginated list RPC: `request` is re-sent with each next page token."""
        out: list[Any] = []
        while True:
            page = await self._unary(method, request, read=True)
            out.extend(getattr(page, field))
            if not page.next_page_token:
                return out
            request.page_token = page.next_page_token

    # -- presets and agents --------------------------------------------------------------------

    async def create_preset(
        self,
        preset_id: str,
        *,
        mode: ModeName | None = None,
        language: Language | None = None,
        self_modification: bool | None = None,
        mcp_servers: Sequence[str | scope_pb2.McpServer] = (),
    ) -> scope_pb2.Preset:
        """`language`: the program language its agents' `run_code` uses (none: inherit).
        `self_modification`: whether its agents get the dynamic Cordis tools (none: inherit).
        `mcp_servers`: MCP servers whose tools its scope gets, each a name the registry
        settings declare or a `McpServer(url=..., headers=...)` (docs/mcp.md)."""
        preset = scope_pb2.Preset(
            mode=_MODES[mode] if mode else scope_pb2.PRESENTATION_MODE_UNSPECIFIED,
            code_language=language or "",
            self_modification=self_modification,
            mcp_servers=_mcp_servers(mcp_servers),
        )
        request = rpb.CreatePresetRequest(preset_id=preset_id, preset=preset)
        response: rpb.CreatePresetResponse = await self._unary(self.stub.CreatePreset, request)
        return response.preset

    async def get_preset(self, name: str) -> scope_pb2.Preset:
        request = rpb.GetPresetRequest(name=name)
        response: rpb.GetPresetResponse = await self._unary(self.stub.GetPreset, request, read=True)
        return response.preset

    async def list_presets(self) -> list[scope_pb2.Preset]:
        return await self._all_pages(self.stub.ListPresets, rpb.ListPresetsRequest(), "presets")

    async def delete_preset(self, name: str, *, force: bool = False) -> None:
        """`force` also deletes a preset that agents use: they fall back to the default."""
        request = rpb.DeletePresetRequest(name=name, force=force)
        await self._unary(self.stub.DeletePreset, request)

    async def create_agent(
        self,
        agent_id: str,
        *,
        preset: str = "",
        mode: ModeName | None = None,
        language: Language | None = None,
        self_modification: bool | None = None,
        mcp_servers: Sequence[str | scope_pb2.McpServer] = (),
    ) -> scope_pb2.Agent:
        """`language`: the program language of its `run_code` (none: the preset's, else the
        deployment default); the agent's `effective_code_language` says which is in force.
        `self_modification` likewise (`effective_self_modification`): the Cordis tools.
        `mcp_servers` as for `create_preset`."""
        agent = scope_pb2.Agent(
            preset=preset,
            mode=_MODES[mode] if mode else scope_pb2.PRESENTATION_MODE_UNSPECIFIED,
            code_language=language or "",
            self_modification=self_modification,
            mcp_servers=_mcp_servers(mcp_servers),
        )
        request = rpb.CreateAgentRequest(agent_id=agent_id, agent=agent)
        response: rpb.CreateAgentResponse = await self._unary(self.stub.CreateAgent, request)
        return response.agent

    async def get_agent(self, name: str) -> scope_pb2.Agent:
        request = rpb.GetAgentRequest(name=name)
        response: rpb.GetAgentResponse = await self._unary(self.stub.GetAgent, request, read=True)
        return response.agent

    async def list_agents(self) -> list[scope_pb2.Agent]:
        return await self._all_pages(self.stub.ListAgents, rpb.ListAgentsRequest(), "agents")

    async def delete_agent(self, name: str) -> None:
        await self._unary(self.stub.DeleteAgent, rpb.DeleteAgentRequest(name=name))

    async def resolve_plugin_references(
        self, agent: str, text: str
    ) -> list[rpb.PluginReferenceContext]:
        """The `@pluginId` context blocks for one user message (append them to the step)."""
        request = rpb.ResolvePluginReferencesRequest(agent=agent, text=text)
        response: rpb.ResolvePluginReferencesResponse = await self._unary(
            self.stub.ResolvePluginReferences, request, read=True
        )
        return list(response.contexts)

    async def set_mode(self, scope: str, mode: ModeName) -> None:
        request = rpb.SetPresentationModeRequest(scope=scope, mode=_MODES[mode])
        await self._unary(self.stub.SetPresentationMode, request)

    async def add_restriction(
        self, scope: str, *, allow: list[str] | None = None, deny: list[str] | None = None
    ) -> str:
        """`allow=None`: no allow list; `allow=[]`: an allow list naming none (hides every
        inherited tool; the wire spells it `allow_none`, as an empty repeated field is absent)."""
        request = rpb.AddRestrictionRequest(
            scope=scope,
            allow=allow or [],
            deny=deny or [],
            allow_none=allow is not None and not allow,
        )
        response: rpb.AddRestrictionResponse = await self._unary(self.stub.AddRestriction, request)
        return response.restriction_id

    async def remove_restriction(self, scope: str, restriction_id: str) -> None:
        request = rpb.RemoveRestrictionRequest(scope=scope, restriction_id=restriction_id)
        await self._unary(self.stub.RemoveRestriction, request)

    # -- presentation --------------------------------------------------------------------------

    async def list_tools(self, scope: str = "") -> list[tool_pb2.Tool]:
        request = rpb.ListVisibleToolsRequest(scope=scope)
        response = await self._unary(self.stub.ListVisibleTools, request, read=True)
        return list(response.tools)

    async def wire_schemas(self, scope: str = "", language: str = "") -> list[dict[str, JsonValue]]:
        request = presentation_pb2.GetWireSchemasRequest(scope=scope, language=language)
        response = await self._unary(self.stub.GetWireSchemas, request, read=True)
        return [
            {
                "name": s.name,
                "description": s.description,
                "parameters": jsonvalue.loads(s.parameters_json),
            }
            for s in response.schemas
        ]

    async def system_prompt(self, scope: str = "", language: str = "") -> str:
        request = presentation_pb2.GetSystemPromptRequest(scope=scope, language=language)
        return str(
            (
                await self._unary(
                    self.stub.GetSystemPrompt,
                    request,
                    read=True,
                )
            ).text
        )

    async def sdk(self, scope: str = "", language: str = "") -> str:
        request = presentation_pb2.GetSdkRequest(scope=scope, language=language)
        return str((await self._unary(self.stub.GetSdk, request, read=True)).text)

    # -- execution -----------------------------------------------------------------------------

    async def execute(
        self,
        tool: str,
        arguments: JsonValue = None,
        *,
        agent: str = "",
        call_id: str | None = None,
        deadline: float | None = None,
        progress: Progress = "all",
        arguments_json: str | None = None,
    ) -> AsyncIterator[rpb.ExecuteToolCallResponse]:
        """Streams the call's events, one at a time; the last one carries `result`. `progress`
        chooses which events come before it ("none": the result only, one message per event
        saved). Events the registry sends as a batch are yielded one by one, in order.
        `arguments_json`: the arguments as JSON text, sent untouched instead of `arguments` (a
        model's tool call: the registry, not this client, judges text that is not JSON)."""
        if arguments_json is None:
            arguments_json = jsonvalue.dumps({} if arguments is None else arguments)
        request = rpb.ExecuteToolCallRequest(
            agent=agent,
            call_id=call_id or f"call-{uuid.uuid4().hex[:12]}",
            tool_name=tool,
            arguments_json=arguments_json,
            progress_events=_PROGRESS[progress],
            batch_progress=True,
            share_logs=True,  # restored below: callers see every result whole
        )
        try:
            async for message in self.stub.ExecuteToolCall(
                request, timeout=deadline or self.timeout
            ):
                for event in unbatched(message):
                    if event.WhichOneof("event") == "result":
                        shared_logs.restore(event.result)
                    yield event
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def call(
        self,
        tool: str,
        arguments: JsonValue = None,
        *,
        agent: str = "",
        call_id: str | None = None,
        deadline: float | None = None,
        progress: Progress = "all",
        arguments_json: str | None = None,
    ) -> ToolCallResult:
        events: list[rpb.ExecuteToolCallResponse] = []
        async for event in self.execute(
            tool,
            arguments,
            agent=agent,
            call_id=call_id,
            deadline=deadline,
            progress=progress,
            arguments_json=arguments_json,
        ):
            if event.WhichOneof("event") == "result":
                return ToolCallResult.from_proto(event.result, events)
            events.append(event)
        raise CodemodeError("the registry ended the call without a result")

    async def run_code(
        self,
        code: str,
        description: str,
        *,
        agent: str = "",
        call_id: str | None = None,
        deadline: float | None = None,
        progress: Progress = "all",
    ) -> ToolCallResult:
        """Executes a `run_code` call; `value` is `{"logs": [...], "result"?: ...}`."""
        arguments: JsonValue = {"code": code, "description": description}
        return await self.call(
            "run_code",
            arguments,
            agent=agent,
            call_id=call_id,
            deadline=deadline,
            progress=progress,
        )

    # -- approvals, for approvers that are not streams (see `Approver` for a stream) -----------

    async def pending_approvals(self) -> list[rpb.ApprovalRequest]:
        """The pending approval requests this client's principal may answer, oldest first
        (with `approvals_in_store`, those of every registry sharing the database)."""
        request = rpb.ListPendingApprovalsRequest(page_size=500)
        return await self._all_pages(self.stub.ListPendingApprovals, request, "approvals")

    async def resolve_approval(self, approval_id: str, allowed: bool) -> None:
        """Answers a pending request (the first answer on any registry wins): `NotFound` for
        an id this principal may not answer, `FailedPrecondition` (`APPROVAL_NOT_PENDING`)
        when it was answered, withdrawn or expired already."""
        outcome = rpb.APPROVAL_OUTCOME_ALLOWED_ONCE if allowed else rpb.APPROVAL_OUTCOME_REJECTED
        request = rpb.ResolveApprovalRequest(approval_id=approval_id, outcome=outcome)
        await self._unary(self.stub.ResolveApproval, request)

    # -- history -------------------------------------------------------------------------------

    async def history(
        self, agent: str = "", *, call_id: str = "", agent_id: str = ""
    ) -> list[history_pb2.HistoryRecord]:
        """An agent's history by name, or by `agent_id` (`Agent.agent_id`, with `agent` empty):
        how an operator reads a deleted agent's history (a re-created name starts empty)."""
        request = rpb.ListHistoryRequest(
            agent=agent, agent_id=agent_id, call_id=call_id, page_size=500
        )
        return await self._all_pages(self.stub.ListHistory, request, "records")

    async def record_content(
        self, agent: str, seq: int, *, agent_id: str = ""
    ) -> list[tool_pb2.ContentBlock]:
        """A record's full content: what was spilled when the record holds only a preview
        (`agent_id`: as in `history`)."""
        request = rpb.GetRecordContentRequest(agent=agent, agent_id=agent_id, seq=seq)
        response: rpb.GetRecordContentResponse = await self._unary(
            self.stub.GetRecordContent, request, read=True
        )
        return list(response.content)

    async def watch_history(
        self, agent: str, after_seq: int = 0, *, agent_id: str = ""
    ) -> AsyncIterator[history_pb2.HistoryRecord]:
        """Replays records after `after_seq`, then follows new ones (no deadline; cancel it);
        `agent_id`: as in `history`."""
        try:
            async for response in self.stub.WatchHistory(
                rpb.WatchHistoryRequest(agent=agent, agent_id=agent_id, after_seq=after_seq)
            ):
                yield response.record
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def watch_agent_messages(
        self, agent: str, after_seq: int = 0
    ) -> AsyncIterator[AgentMessage]:
        """`watch_history` reduced to the messages for the agent (`agent/steer`,
        `agent/inject`) as typed events; the rest of the history is skipped."""
        async for record in self.watch_history(agent, after_seq):
            message = agent_message(record)
            if message is not None:
                yield message


def _mcp_servers(servers: Sequence[str | scope_pb2.McpServer]) -> list[scope_pb2.McpServer]:
    """A name is a server the registry settings declare."""
    return [scope_pb2.McpServer(server=s) if isinstance(s, str) else s for s in servers]
