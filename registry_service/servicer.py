"""The RegistryService servicer: translates messages and calls the domain, nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeAlias

from google.protobuf import json_format

from codemode_common.peer import current_principal
from codemode_wire import jsonvalue, shared_logs
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2
from codemode_wire.errors import (
    CodemodeError,
    already_exists,
    failed_precondition,
    internal,
    invalid_argument,
    not_found,
    unavailable,
)
from codemode_wire.jsonvalue import JsonValue
from registry_service import convert
from registry_service._errors import streaming, unary
from registry_service.domain import records
from registry_service.domain.access import AccessPolicy, Permission, resource_of
from registry_service.domain.approvals import ApprovalOutcome, Decided
from registry_service.domain.execution import (
    ApprovalPending,
    ApprovalResolved,
    Emit,
    Event,
    ExecutionInput,
    no_events,
)
from registry_service.domain.json_admission import decode_arguments, off_loop
from registry_service.domain.results import ToolResult, error_result
from registry_service.domain.signals import AbortController
from registry_service.domain.tools import RUN_CODE
from registry_service.presentation_servicer import PresentationRpcs
from registry_service.registry import Registry
from registry_service.streams import OpenStreams, approver_stream, provider_stream

# grpc is untyped (see pyproject); the alias documents intent.
Context: TypeAlias = Any

log = logging.getLogger(__name__)
_SHUTTING_DOWN = unavailable(
    "REGISTRY_SHUTTING_DOWN", "the registry is shutting down; reconnect to continue"
)


class RegistryServicer(PresentationRpcs, rpb_grpc.RegistryServiceServicer):
    def __init__(self, registry: Registry, policy: AccessPolicy | None = None) -> None:
        self._registry = registry
        # The RPC table (rpc_access) already admitted each call; the policy is also asked per
        # stream message (Connect's scopes, Approve's agents).
        self._policy = policy or AccessPolicy((), enforced=False)
        self._catalog = registry.catalog
        self._inflight: set[tuple[str, str]] = set()
        self._no_calls = asyncio.Event()  # set while no ExecuteToolCall is in flight
        self._no_calls.set()
        self._streams = OpenStreams()
        self._max_message_bytes = registry.settings.max_message_bytes
        self._json_limits = registry.settings.json_limits()
        self._draining = False

    async def drain(self, grace: float) -> None:
        """Shutdown, once the server refuses new RPCs: waits up to `grace` seconds for the tool
        calls in flight (their providers and approvers stay connected meanwhile), then ends the
        provider, approver and history-watch streams with UNAVAILABLE, so that they neither
        hold the server to its grace period nor see a bare cancellation."""
        self._draining = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._no_calls.wait(), grace)
        self._streams.end_all(_SHUTTING_DOWN)
        self._registry.history.end_watches()

    async def _audit(self, method: str, resource: str, request: Any) -> None:
        """An `admin/audit` record of a change just made, with the principal who made it.
        Written after the change succeeded (a refused or failed change is not one). Should
        the history fail, the change stands and the call succeeds (administration does not
        depend on the history store, as before), and the lost audit record is logged."""
        details = {
            "principal": current_principal().qualified,
            "resource": resource_of(resource),
            "request": json.loads(json_format.MessageToJson(request)),
        }
        record = records.record(
            records.ADMIN_AUDIT,
            agent=records.AUDIT_LOG,
            agent_id=records.AUDIT_LOG,  # the global scope's history, whatever agent changed
            call_id=f"audit-{uuid.uuid4().hex[:16]}",
            root_call_id="",
            parent_call_id="",
            name=method,
            arguments_json=jsonvalue.dumps(details),
        )
        try:
            await self._registry.history.append(record)
        except CodemodeError as error:
            log.error("audit record of %s by %s lost: %s", method, details["principal"], error)

    # -- presets and agents ----------------------------------------------------------------

    def _preset(self, name: str) -> scope_pb2.Preset:
        preset = self._catalog.get_preset(name)
        return convert.preset_to_proto(preset, self._catalog, self._registry.mcp)

    def _agent(self, name: str) -> scope_pb2.Agent:
        agent = self._catalog.get_agent(name)
        return convert.agent_to_proto(agent, self._catalog, self._registry.mcp)

    @unary
    async def CreatePreset(
        self, request: rpb.CreatePresetRequest, context: Context
    ) -> rpb.CreatePresetResponse:
        mode = convert.mode_from_proto(request.preset.mode, allow_unspecified=True)
        language = request.preset.code_language or None
        self_modification = convert.optional_bool(request.preset, "self_modification")
        mcp_servers = convert.mcp_servers_from_proto(request.preset.mcp_servers)
        self._registry.mcp.admit(f"presets/{request.preset_id}", mcp_servers)
        preset = await self._catalog.create_preset(
            request.preset_id, mode, language, self_modification, mcp_servers=mcp_servers
        )
        await self._audit("CreatePreset", preset.name, request)
        return rpb.CreatePresetResponse(preset=self._preset(preset.name))

    @unary
    async def GetPreset(
        self, request: rpb.GetPresetRequest, context: Context
    ) -> rpb.GetPresetResponse:
        return rpb.GetPresetResponse(preset=self._preset(request.name))

    @unary
    async def ListPresets(
        self, request: rpb.ListPresetsRequest, context: Context
    ) -> rpb.ListPresetsResponse:
        presets, token = self._catalog.list_presets(request.page_size, request.page_token)
        return rpb.ListPresetsResponse(
            presets=[self._preset(p.name) for p in presets], next_page_token=token
        )

    @unary
    async def DeletePreset(
        self, request: rpb.DeletePresetRequest, context: Context
    ) -> rpb.DeletePresetResponse:
        await self._catalog.delete_preset(request.name, force=request.force)
        await self._audit("DeletePreset", request.name, request)
        return rpb.DeletePresetResponse()

    @unary
    async def CreateAgent(
        self, request: rpb.CreateAgentRequest, context: Context
    ) -> rpb.CreateAgentResponse:
        mode = convert.mode_from_proto(request.agent.mode, allow_unspecified=True)
        language = request.agent.code_language or None
        self_modification = convert.optional_bool(request.agent, "self_modification")
        mcp_servers = convert.mcp_servers_from_proto(request.agent.mcp_servers)
        self._registry.mcp.admit(f"agents/{request.agent_id}", mcp_servers)
        agent = await self._catalog.create_agent(
            request.agent_id,
            request.agent.preset,
            mode,
            language,
            self_modification,
            mcp_servers=mcp_servers,
        )
        await self._audit("CreateAgent", agent.name, request)
        return rpb.CreateAgentResponse(agent=self._agent(agent.name))

    @unary
    async def GetAgent(
        self, request: rpb.GetAgentRequest, context: Context
    ) -> rpb.GetAgentResponse:
        return rpb.GetAgentResponse(agent=self._agent(request.name))

    @unary
    async def ListAgents(
        self, request: rpb.ListAgentsRequest, context: Context
    ) -> rpb.ListAgentsResponse:
        agents, token = self._catalog.list_agents(request.page_size, request.page_token)
        return rpb.ListAgentsResponse(
            agents=[self._agent(a.name) for a in agents], next_page_token=token
        )

    @unary
    async def DeleteAgent(
        self, request: rpb.DeleteAgentRequest, context: Context
    ) -> rpb.DeleteAgentResponse:
        await self._catalog.delete_agent(request.name)
        await self._audit("DeleteAgent", request.name, request)
        return rpb.DeleteAgentResponse()

    # -- modes, restrictions, listing --------------------------------------------------------

    @unary
    async def SetPresentationMode(
        self, request: rpb.SetPresentationModeRequest, context: Context
    ) -> rpb.SetPresentationModeResponse:
        mode = convert.mode_from_proto(request.mode, allow_unspecified=False)
        assert mode is not None
        await self._catalog.set_mode(request.scope, mode)
        await self._audit("SetPresentationMode", request.scope, request)
        return rpb.SetPresentationModeResponse()

    @unary
    async def AddRestriction(
        self, request: rpb.AddRestrictionRequest, context: Context
    ) -> rpb.AddRestrictionResponse:
        # proto3 cannot tell an empty `allow` from an absent one: `allow_none` is the empty list.
        if request.allow_none and request.allow:
            raise invalid_argument(
                "CONFLICTING_ALLOW",
                "allow_none cannot be combined with a non-empty allow",
                field="allow_none",
            )
        allow: list[str] | None = [] if request.allow_none else list(request.allow) or None
        restriction_id = await self._catalog.add_restriction(
            request.scope, allow, list(request.deny) or None
        )
        await self._audit("AddRestriction", request.scope, request)
        return rpb.AddRestrictionResponse(restriction_id=restriction_id)

    @unary
    async def RemoveRestriction(
        self, request: rpb.RemoveRestrictionRequest, context: Context
    ) -> rpb.RemoveRestrictionResponse:
        await self._catalog.remove_restriction(request.scope, request.restriction_id)
        await self._audit("RemoveRestriction", request.scope, request)
        return rpb.RemoveRestrictionResponse()

    @unary
    async def ListVisibleTools(
        self, request: rpb.ListVisibleToolsRequest, context: Context
    ) -> rpb.ListVisibleToolsResponse:
        scope = self._catalog.require_scope(request.scope)
        # Only the tools the caller may call (domain/tool_access.py).
        view = self._registry.authority.access(current_principal(), scope).restrict(
            self._catalog.view(scope)
        )
        return rpb.ListVisibleToolsResponse(
            tools=[
                convert.tool_to_proto(view.visible[n], view.registered_in[n])
                for n in sorted(view.visible)
            ],
            effective_mode=convert.mode_to_proto(view.mode),
        )

    # -- execution ---------------------------------------------------------------------------

    @streaming
    async def ExecuteToolCall(
        self, request: rpb.ExecuteToolCallRequest, context: Context
    ) -> AsyncIterator[rpb.ExecuteToolCallResponse]:
        agent = request.agent or None
        agent_id = self._catalog.get_agent(agent).agent_id if agent is not None else ""
        if not request.call_id:
            raise invalid_argument("MISSING_CALL_ID", "call_id is required", field="call_id")
        _check_key("call_id", request.call_id, records.MAX_CALL_ID_BYTES)
        if not request.tool_name:
            raise invalid_argument("MISSING_TOOL_NAME", "tool_name is required", field="tool_name")
        if problem := records.text_problem(request.tool_name):
            # An unknown or over-long name is the model's mistake, a tool result; this one no
            # store could record.
            raise invalid_argument(
                "INVALID_TOOL_NAME", f"tool_name holds {problem}", field="tool_name"
            )
        if request.progress_events not in _PROGRESS:
            raise invalid_argument(
                "INVALID_PROGRESS_EVENTS",
                f"unknown progress_events value {request.progress_events}",
                field="progress_events",
            )
        if request.tool_name == RUN_CODE:
            # A program in a language no runtime serves cannot run: the same refusal as the
            # scope's prompt assembly, before anything of the call exists.
            await self._registry.languages.ensure_known()
            self._registry.assembler.code_language(request.agent)
        wanted = _PROGRESS[request.progress_events]
        # Bounded in depth and size; a large text is decoded off the loop (json_admission).
        arguments, arguments_json = await decode_arguments(
            request.arguments_json, self._json_limits, default={}
        )
        key = (request.agent, request.call_id)
        if key in self._inflight:
            raise already_exists(
                "CALL_IN_PROGRESS", f"call {request.call_id!r} is already executing for this agent"
            )
        loop = asyncio.get_running_loop()
        remaining = context.time_remaining()
        controller = AbortController()
        # Progress events, then the outcome (a result, or the exception a bug raised) last.
        events: asyncio.Queue[Event | ToolResult | Exception] = asyncio.Queue()
        inp = ExecutionInput(
            call_id=request.call_id,
            name=request.tool_name,
            arguments=arguments,
            arguments_json=arguments_json,
            signal=controller.signal,
            agent=agent,
            agent_id=agent_id,
            deadline=None if remaining is None else loop.time() + remaining,
            principal=current_principal(),  # the guard's: the run and its nested calls keep it
        )
        self._inflight.add(key)
        self._no_calls.clear()
        task = asyncio.create_task(self._execute(inp, _filtered(events.put_nowait, wanted), events))
        outcome: ToolResult | Exception | None = None
        try:
            while outcome is None:
                item = await events.get()
                if isinstance(item, ToolResult | Exception):
                    outcome = item
                    break
                ready = [item]
                # Events that queued up while the stream was busy go out together (opt-in).
                while request.batch_progress and not events.empty():
                    item = events.get_nowait()
                    if isinstance(item, ToolResult | Exception):
                        outcome = item
                        break
                    ready.append(item)
                yield _progress_message(ready)
            if isinstance(outcome, Exception):
                raise outcome
            message = convert.result_to_proto(outcome)
            if request.share_logs:
                if outcome.is_error:
                    shared_logs.share_failure(message)
                else:
                    # Rendering the result again (to prove the text ends with it) walks the
                    # whole value: a large one off the loop.
                    await off_loop(
                        self._json_limits,
                        len(message.value_json),
                        shared_logs.share,
                        message,
                        _logs_of(outcome),
                        _result_of(outcome),
                    )
            final = rpb.ExecuteToolCallResponse(result=message)
            size = final.ByteSize()
            if size > self._max_message_bytes:
                # Sent as is, the RPC would fail with a transport error and no result at all.
                final = rpb.ExecuteToolCallResponse(
                    result=convert.result_to_proto(
                        _too_large(request.tool_name, size, self._max_message_bytes)
                    )
                )
            yield final
        finally:
            if not task.done():
                # The client cancelled or its deadline passed: abort, then wait for quiescence
                # so nothing of this call runs after the RPC is gone.
                controller.abort("tool call aborted")
                with contextlib.suppress(Exception):
                    await task
            self._inflight.discard(key)
            if not self._inflight:
                self._no_calls.set()

    async def _execute(
        self, inp: ExecutionInput, emit: Emit, out: asyncio.Queue[Event | ToolResult | Exception]
    ) -> None:
        # The outcome goes out from inside the task (not from a done callback, not via a
        # shield): one loop hand-off to the RPC instead of three.
        try:
            out.put_nowait(await self._registry.execute(inp, emit))
        except Exception as exc:
            out.put_nowait(exc)

    # -- history -----------------------------------------------------------------------------

    def _history_key(self, agent: str, agent_id: str) -> str:
        """The key of the history a request reads: the empty agent without an id is the global
        scope's history, which holds the audit log; else the agent's id (catalog rules)."""
        _check_key("agent_id", agent_id)
        if agent == records.AUDIT_LOG and not agent_id:
            return records.AUDIT_LOG
        return self._catalog.history_key(agent, agent_id)

    @unary
    async def ListHistory(
        self, request: rpb.ListHistoryRequest, context: Context
    ) -> rpb.ListHistoryResponse:
        agent_id = self._history_key(request.agent, request.agent_id)
        if request.page_size < 0:
            raise invalid_argument("INVALID_PAGE_SIZE", "page_size must not be negative")
        size = min(request.page_size or 100, 1000)
        after = _history_cursor(request.page_token)
        _check_key("call_id", request.call_id)
        page = await self._registry.history.list(
            agent_id, after_seq=after, limit=size + 1, call_id=request.call_id
        )
        token = str(page[size - 1].seq) if len(page) > size else ""
        return rpb.ListHistoryResponse(
            records=[convert.record_to_proto(r) for r in page[:size]], next_page_token=token
        )

    @streaming
    async def WatchHistory(
        self, request: rpb.WatchHistoryRequest, context: Context
    ) -> AsyncIterator[rpb.WatchHistoryResponse]:
        agent_id = self._history_key(request.agent, request.agent_id)
        if request.after_seq < 0:
            raise invalid_argument(
                "INVALID_AFTER_SEQ", "after_seq must not be negative", field="after_seq"
            )
        async for record in self._registry.history.watch(agent_id, request.after_seq):
            yield rpb.WatchHistoryResponse(record=convert.record_to_proto(record))
        if self._draining:
            raise _SHUTTING_DOWN  # the watch was ended by `drain`, not by the history

    @unary
    async def GetRecordContent(
        self, request: rpb.GetRecordContentRequest, context: Context
    ) -> rpb.GetRecordContentResponse:
        _check_key("agent_id", request.agent_id)
        agent_id = self._catalog.history_key(request.agent, request.agent_id)
        history = self._registry.history
        # No record has a seq <= 0; asking SQLite for one could overflow its integer range.
        found = (
            await history.list(agent_id, after_seq=request.seq - 1, limit=1)
            if request.seq > 0
            else []
        )
        if not found or found[0].seq != request.seq:
            raise not_found(
                "RECORD_NOT_FOUND",
                f"{request.agent or request.agent_id} has no history record {request.seq}",
            )
        record = found[0]
        content = record.content_json
        if record.spilled:
            spilled = await history.read_spill(record.spilled)
            if spilled is None:
                raise internal(
                    "SPILL_MISSING", f"the spilled content of record {record.seq} is gone"
                )
            content = spilled
        return rpb.GetRecordContentResponse(content=convert.content_from_json(content))

    @unary
    async def ResolvePluginReferences(
        self, request: rpb.ResolvePluginReferencesRequest, context: Context
    ) -> rpb.ResolvePluginReferencesResponse:
        self._catalog.get_agent(request.agent)
        return rpb.ResolvePluginReferencesResponse(
            contexts=[
                rpb.PluginReferenceContext(
                    plugin_id=block.plugin_id, available=block.available, text=block.text
                )
                for block in self._registry.cordis.references(request.agent, request.text)
            ]
        )

    # -- provider and approver streams ---------------------------------------------------------

    async def Connect(
        self, request_iterator: AsyncIterator[rpb.ConnectRequest], context: Context
    ) -> AsyncIterator[rpb.ConnectResponse]:
        principal = current_principal()

        def may_register(scope: str) -> None:
            self._policy.require(principal, Permission.REGISTER, resource_of(scope))

        async for response in provider_stream(
            self._registry, request_iterator, context, self._streams, may_register
        ):
            yield response

    async def Approve(
        self, request_iterator: AsyncIterator[rpb.ApproveRequest], context: Context
    ) -> AsyncIterator[rpb.ApproveResponse]:
        principal = current_principal()

        def may_approve(agent: str) -> bool:
            return self._policy.allows(principal, Permission.APPROVE, resource_of(agent))

        async for response in approver_stream(
            self._registry, request_iterator, context, self._streams, may_approve
        ):
            yield response

    # -- unary approvers -------------------------------------------------------------------

    def _may_approve(self) -> Callable[[str], bool]:
        principal = current_principal()
        return lambda agent: self._policy.allows(principal, Permission.APPROVE, resource_of(agent))

    @unary
    async def ListPendingApprovals(
        self, request: rpb.ListPendingApprovalsRequest, context: Context
    ) -> rpb.ListPendingApprovalsResponse:
        if request.page_size < 0:
            raise invalid_argument("INVALID_PAGE_SIZE", "page_size must not be negative")
        size = min(request.page_size or 50, 1000)
        after = _history_cursor(request.page_token)
        page, next_after = await self._registry.approvals.listing(
            self._may_approve(), after=after, limit=size
        )
        return rpb.ListPendingApprovalsResponse(
            approvals=[convert.approval_request_to_proto(p.request) for p in page],
            next_page_token=str(next_after) if next_after else "",
        )

    @unary
    async def ResolveApproval(
        self, request: rpb.ResolveApprovalRequest, context: Context
    ) -> rpb.ResolveApprovalResponse:
        outcome = convert.outcome_from_proto(request.outcome)
        if outcome not in (ApprovalOutcome.ALLOWED_ONCE, ApprovalOutcome.REJECTED):
            raise invalid_argument(
                "INVALID_DECISION", "outcome must be ALLOWED_ONCE or REJECTED", field="outcome"
            )
        _check_key("approval_id", request.approval_id)
        may_approve = self._may_approve()
        principal = current_principal().qualified
        decided = await self._registry.approvals.decide(
            request.approval_id,
            outcome,
            lambda agent, _size: may_approve(agent),
            f"principal:{principal}",
        )
        if decided is Decided.UNKNOWN:
            # Also an id of an agent the caller may not approve for: it reveals nothing.
            raise not_found(
                "APPROVAL_NOT_FOUND", f"no pending approval {request.approval_id} to answer"
            )
        if decided is Decided.NOT_PENDING:
            raise failed_precondition(
                "APPROVAL_NOT_PENDING",
                f"approval {request.approval_id} was already answered, withdrawn or expired",
            )
        return rpb.ResolveApprovalResponse()


# progress_events -> the event types the stream carries (None: all; empty: none).
_PROGRESS: dict[int, tuple[type, ...] | None] = {
    rpb.PROGRESS_EVENTS_UNSPECIFIED: None,
    rpb.PROGRESS_EVENTS_ALL: None,
    rpb.PROGRESS_EVENTS_APPROVALS: (ApprovalPending, ApprovalResolved),
    rpb.PROGRESS_EVENTS_NONE: (),
}


def _progress_message(events: list[Event]) -> rpb.ExecuteToolCallResponse:
    if len(events) == 1:
        return convert.event_to_proto(events[0])
    batch = rpb.ProgressBatch(events=[convert.event_to_proto(e) for e in events])
    return rpb.ExecuteToolCallResponse(batch=batch)


def _logs_of(result: ToolResult) -> list[str]:
    """The `logs` of a value shaped like `run_code`'s (`{"logs": [str, ...], ...}`), else none."""
    logs = result.value.get("logs") if isinstance(result.value, dict) else None
    if isinstance(logs, list) and all(isinstance(line, str) for line in logs):
        return logs  # type: ignore[return-value]
    return []


def _result_of(result: ToolResult) -> JsonValue | shared_logs.NoResult:
    """The `result` of a value shaped like `run_code`'s, else `NO_RESULT`."""
    if isinstance(result.value, dict) and "result" in result.value:
        return result.value["result"]
    return shared_logs.NO_RESULT


def _too_large(tool: str, size: int, limit: int) -> ToolResult:
    return error_result(
        f'the result of tool "{tool}" is too large to send: {size} bytes, over the '
        f"registry's max_message_bytes ({limit})",
        "RESULT_TOO_LARGE",
    )


def _filtered(emit: Emit, wanted: tuple[type, ...] | None) -> Emit:
    if wanted is None:
        return emit
    if not wanted:
        return no_events

    def only_wanted(event: Event) -> None:
        if isinstance(event, wanted):
            emit(event)

    return only_wanted


def _check_key(field: str, value: str, limit: int = records.MAX_KEY_BYTES) -> None:
    """Refuses a request's text that no history store can hold (records.key_problem): it
    would fail its own records, and it must never reach a batch of other calls' records."""
    if problem := records.key_problem(value, limit):
        raise invalid_argument(f"INVALID_{field.upper()}", f"{field} holds {problem}", field=field)


# The largest seq SQLite can hold (its INTEGER is 64-bit, signed).
_MAX_SEQ = 2**63 - 1


def _history_cursor(token: str) -> int:
    if not token:
        return 0
    # ASCII digits only (`isdigit` also admits `²` and `١٢`), and few enough of them to be a seq.
    if not (token.isascii() and token.isdigit() and len(token) <= 19 and int(token) <= _MAX_SEQ):
        raise invalid_argument("INVALID_PAGE_TOKEN", "page_token is not a valid page token")
    return int(token)
