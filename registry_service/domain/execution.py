"""The one pipeline every tool call passes through (reference §1.8–§1.11).

create (argument snapshot, collapse) → prepare (pre-execute, approval, guards) → dispatch (around
wrappers, body, output validation) → finalize (post-execute) → finish (result observers).
The stages are separate methods because the code-mode scheduler runs them in different lanes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Literal, cast

from codemode_common import jsonvalue
from codemode_common.jsonvalue import JsonValue, JsonValueError
from registry_service.domain.approvals import ApprovalBroker, ApprovalOutcome, ApprovalRequest
from registry_service.domain.catalog import Catalog
from registry_service.domain.json_admission import DEFAULT_LIMITS, JsonLimits, off_loop
from registry_service.domain.jsonschema import format_invalid_args, validate
from registry_service.domain.policy import Accept, Allow, Ask, Block, Deny, PreDecision
from registry_service.domain.results import (
    INVALID_ARGS,
    INVALID_TOOL_OUTPUT,
    UNKNOWN_TOOL,
    AdditionalContext,
    TextBlock,
    ToolResult,
    aborted,
    error_result,
    text_of,
)
from registry_service.domain.scopes import GLOBAL
from registry_service.domain.signals import AbortSignal, fuse
from registry_service.domain.telemetry import (
    APPROVAL_WAIT,
    BODY,
    GUARDS,
    NO_TRACE,
    POST_EXECUTE,
    PRE_EXECUTE,
    CallTrace,
    RegistryTelemetry,
)
from registry_service.domain.tools import Invocation, ToolDefinition, is_parallel

log = logging.getLogger(__name__)


class ToolCallFailure(Exception):
    """Raised by a tool body to fail with a stable code (anything else fails without one)."""

    def __init__(self, message: str, code: str = "", name: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.name = name


@dataclass(frozen=True, slots=True)
class ExecutionInput:
    call_id: str
    name: str
    arguments: object
    signal: AbortSignal
    agent: str | None = None
    root_call_id: str | None = None
    parent: object | None = None  # the run_code parent token; set only for nested calls
    deadline: float | None = None
    traceparent: str = ""  # W3C context of the caller (the parent of this call's span)
    tracestate: str = ""
    trace: CallTrace = NO_TRACE  # the call's span when the caller started it (nested calls)
    # `dumps(arguments)`, from a caller that has just decoded `arguments` and shares it with no
    # one (a wire message): the pipeline then takes the pair as its snapshot without copying.
    arguments_json: str | None = None


@dataclass(frozen=True, slots=True)
class Execution:
    """One admitted call. `token` identifies it; `arguments` is an immutable snapshot."""

    token: object
    call_id: str
    root_call_id: str
    name: str
    arguments: JsonValue
    arguments_json: str
    agent: str | None
    parent: object | None
    signal: AbortSignal
    deadline: float | None
    traceparent: str
    tracestate: str
    trace: CallTrace = NO_TRACE

    @property
    def scope(self) -> str:
        return self.agent or GLOBAL

    @property
    def nested(self) -> bool:
        return self.parent is not None


@dataclass(frozen=True, slots=True)
class CallStarted:
    call_id: str
    tool_name: str


@dataclass(frozen=True, slots=True)
class ApprovalPending:
    approval_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class ApprovalResolved:
    approval_id: str
    outcome: ApprovalOutcome


@dataclass(frozen=True, slots=True)
class NestedCallStarted:
    """A run_code program's binding call started (scheduler start, before pre-execute)."""

    sub_call_id: str
    tool_name: str
    queue_wait_ms: float  # submission to start, in the run's scheduler queue


@dataclass(frozen=True, slots=True)
class NestedCallSettled:
    sub_call_id: str
    tool_name: str
    is_error: bool
    error_code: str
    duration_ms: float


@dataclass(frozen=True, slots=True)
class ProgramLog:
    text: str


Event = (
    CallStarted
    | ApprovalPending
    | ApprovalResolved
    | NestedCallStarted
    | NestedCallSettled
    | ProgramLog
)
Emit = Callable[[Event], None]


@dataclass(frozen=True, slots=True)
class Prepared:
    """What prepare decided: dispatch the body, or a result that skips it."""

    action: Literal["dispatch", "post", "final"]
    result: ToolResult | None = None


@dataclass
class _Dispatch:
    body_invoked: bool = False
    deferred: list[AdditionalContext] = field(default_factory=list)
    # What `_body` returned: already normalized, so a wrapper passing it through costs nothing.
    body_result: ToolResult | None = None


def no_events(_event: Event) -> None:
    return None


class Executor:
    def __init__(
        self,
        catalog: Catalog,
        approvals: ApprovalBroker,
        telemetry: RegistryTelemetry | None = None,
        json_limits: JsonLimits = DEFAULT_LIMITS,
    ) -> None:
        self.catalog = catalog
        self.approvals = approvals
        self.telemetry = telemetry or RegistryTelemetry()
        self.json_limits = json_limits

    async def execute(self, inp: ExecutionInput, emit: Emit = no_events) -> ToolResult:
        """A model-direct call, inside its `execute_tool` span."""
        trace = inp.trace
        if not trace.recording:
            trace = self.telemetry.start_call(
                call_id=inp.call_id,
                name=inp.name,
                root_call_id=inp.root_call_id or inp.call_id,
                agent=inp.agent,
                traceparent=inp.traceparent,
                tracestate=inp.tracestate,
            )
            if trace.recording:
                inp = replace(inp, trace=trace)
        try:
            with trace.activated():
                result = await self._execute(inp, emit)
        except BaseException as exc:
            trace.fail(exc)
            raise
        trace.end(result)
        return result

    async def _execute(self, inp: ExecutionInput, emit: Emit) -> ToolResult:
        created = self.create(inp)
        if isinstance(created, ToolResult):
            return created
        emit(CallStarted(created.call_id, created.name))
        prepared = await self.prepare(created, emit)
        if prepared.action == "final":
            assert prepared.result is not None
            return self.finish(created, prepared.result)
        result = prepared.result
        if prepared.action == "dispatch":
            try:
                result = await self.dispatch(created, emit)
            except Exception as exc:  # an around wrapper threw: final, no post-execute
                return self.finish(created, _failure(exc))
        assert result is not None
        return await self.finalize(created, result)

    # -- create --------------------------------------------------------------------------------

    def create(self, inp: ExecutionInput) -> Execution | ToolResult:
        """Snapshots the arguments and applies the code-mode collapse before any policy runs."""
        try:
            if inp.arguments_json is None:
                arguments, arguments_json = jsonvalue.snapshot_with_text(inp.arguments)
            else:
                arguments = cast(JsonValue, inp.arguments)  # decoded from arguments_json
                arguments_json = inp.arguments_json
        except JsonValueError as exc:
            return error_result(
                f"tool execution arguments must be losslessly JSON-serializable: {exc}",
                name="TypeError",
            )
        scope = inp.agent or GLOBAL
        nested = inp.parent is not None
        if self.catalog.collapses(inp.name, scope, nested) and self.catalog.get(inp.name, scope):
            if inp.signal.aborted:
                return aborted(before_dispatch=True)
            return error_result(
                f'unknown tool "{inp.name}": only `run_code` is callable directly — call '
                f"`{inp.name}` from inside a `run_code` program instead",
                UNKNOWN_TOOL,
                "ToolNotFoundError",
            )
        return Execution(
            token=object(),
            call_id=inp.call_id,
            root_call_id=inp.root_call_id or inp.call_id,
            name=inp.name,
            arguments=arguments,
            arguments_json=arguments_json,
            agent=inp.agent,
            parent=inp.parent,
            signal=inp.signal,
            deadline=inp.deadline,
            traceparent=inp.traceparent,
            tracestate=inp.tracestate,
            trace=inp.trace,
        )

    def execution_mode(self, execution: Execution) -> Literal["parallel", "exclusive"]:
        defn = self.catalog.resolve_execution(execution.name, execution.scope, execution.nested)
        return "parallel" if is_parallel(defn, execution.arguments) else "exclusive"

    # -- prepare -------------------------------------------------------------------------------

    async def prepare(self, execution: Execution, emit: Emit = no_events) -> Prepared:
        if execution.signal.aborted:
            return Prepared("final", aborted(before_dispatch=True))
        # A stage with nothing to run (no hooks, no guards) records no event.
        trace = execution.trace
        try:
            started = time.time_ns()
            decision, hooks = await self._pre_execute(execution)
            if hooks and isinstance(decision, Allow):
                trace.stage(PRE_EXECUTE, started)
            elif hooks:
                trace.stage(PRE_EXECUTE, started, decision=type(decision).__name__.lower())
            if isinstance(decision, Ask):
                approved = await self._approve(execution, decision, emit)
                if approved is None:  # approval cancelled because the caller went away
                    return Prepared("post", aborted(before_dispatch=True))
                decision = approved
            guards = self.catalog.guards(execution.agent)
            if isinstance(decision, Allow) and guards:
                started = time.time_ns()
                for guard in guards:
                    reason = guard(execution)
                    if reason is not None:
                        decision = Deny(reason)
                        break
                if isinstance(decision, Deny):
                    trace.stage(GUARDS, started, decision="deny")
                else:
                    trace.stage(GUARDS, started)
        except Exception as exc:
            return Prepared("final", _failure(exc))
        if isinstance(decision, Deny):
            return Prepared("post", error_result(decision.reason, "DENIED"))
        if execution.signal.aborted:
            return Prepared("post", aborted(before_dispatch=True))
        return Prepared("dispatch")

    async def _pre_execute(self, execution: Execution) -> tuple[PreDecision, int]:
        """The waterfall's decision, and how many hooks made it."""
        decision: PreDecision = Allow()
        count = 0
        for hooks in self.catalog.chain_hooks(execution.agent):
            for hook in hooks.pre_execute:
                decision = await hook(execution, decision)
                count += 1
        return decision, count

    async def _approve(self, execution: Execution, ask: Ask, emit: Emit) -> PreDecision | None:
        name = execution.name
        if not execution.agent:
            return Deny(
                f'tool "{name}" requires approval, but the call has no agent to route it through'
            )
        request = ApprovalRequest(
            approval_id=self.approvals.next_id(),
            call_id=execution.call_id,
            agent=execution.agent,
            tool_name=name,
            arguments_json=execution.arguments_json,
            reason=ask.reason or f'tool "{name}" requires approval',
        )
        emit(ApprovalPending(request.approval_id, request.reason))
        started, clock = time.time_ns(), time.perf_counter()
        outcome = await self.approvals.request(request, execution.signal)
        self.telemetry.approval_waited(outcome.value, time.perf_counter() - clock)
        execution.trace.stage(
            APPROVAL_WAIT, started, approval_id=request.approval_id, outcome=outcome.value
        )
        emit(ApprovalResolved(request.approval_id, outcome))
        if outcome is ApprovalOutcome.ALLOWED_ONCE:
            return Allow()
        if outcome is ApprovalOutcome.REJECTED:
            return Deny(f'the user rejected tool "{name}"')
        if outcome is ApprovalOutcome.CANCELLED:
            if execution.signal.aborted:
                return None
            return Deny(f'approval for tool "{name}" was cancelled')
        return Deny(f'tool "{name}" requires approval, but no approval channel is available')

    # -- dispatch ------------------------------------------------------------------------------

    async def dispatch(self, execution: Execution, emit: Emit = no_events) -> ToolResult:
        """Around wrappers (outermost: global) then the body. A wrapper's throw propagates."""
        state = _Dispatch()
        wrappers = [w for hooks in self.catalog.chain_hooks(execution.agent) for w in hooks.around]

        async def body() -> ToolResult:
            state.body_result = await self._body(execution, state, emit)
            return state.body_result

        def call(index: int) -> Callable[[], Awaitable[ToolResult]]:
            if index == len(wrappers):
                return body
            return lambda: wrappers[index](execution, call(index + 1))

        started = time.time_ns()
        try:
            result = await call(0)()
        finally:
            if state.body_invoked:
                execution.trace.stage(BODY, started)
            else:  # refused before the tool ran (unknown tool, invalid arguments, aborted)
                execution.trace.stage(BODY, started, invoked=False)
        if wrappers:
            result = self._wrapper_result(execution, state.body_result, result)
        if state.deferred:
            result = result.with_contexts((*state.deferred, *result.additional_contexts))
        if execution.signal.aborted and not result.is_error:
            return aborted(before_dispatch=not state.body_invoked).with_contexts(
                result.additional_contexts
            )
        return result

    async def _body(self, execution: Execution, state: _Dispatch, emit: Emit) -> ToolResult:
        if execution.signal.aborted:
            return aborted(before_dispatch=True)
        defn = self.catalog.resolve_execution(execution.name, execution.scope, execution.nested)
        if defn is None:
            return error_result(
                f'unknown tool "{execution.name}"', UNKNOWN_TOOL, "ToolNotFoundError"
            )
        # Validation walks the whole value: a large one is validated off the event loop.
        size = len(execution.arguments_json)
        violations = await off_loop(
            self.json_limits, size, validate, defn.input_schema, execution.arguments
        )
        if violations:
            return error_result(format_invalid_args(violations), INVALID_ARGS, "ToolArgsError")
        state.body_invoked = True
        trace = execution.trace
        traceparent, tracestate = trace.propagation(execution.traceparent, execution.tracestate)
        invocation = Invocation(
            emit=emit,
            call_id=execution.call_id,
            root_call_id=execution.root_call_id,
            agent=execution.agent,
            tool_name=execution.name,
            arguments_json=execution.arguments_json,
            signal=fuse(execution.signal),
            deadline=execution.deadline,
            traceparent=traceparent,  # the call's own span: providers continue from it
            tracestate=tracestate,
        )
        try:
            with trace.activated():
                returned = await defn.body(invocation)
        except Exception as exc:
            return _failure(exc)
        result = await self._normalize_output(defn, returned)
        if execution.signal.aborted and not result.is_error:
            return aborted(before_dispatch=False)
        return result

    async def _normalize_output(
        self, defn: ToolDefinition, returned: JsonValue | ToolResult
    ) -> ToolResult:
        """`_normalize` of a body's output, off the event loop when the value is large: its
        validation and the pretty content rendered from it walk every member in Python."""
        if not isinstance(returned, ToolResult):
            # Snapshot first (C-speed), so the value's size is known.
            try:
                value, value_json = jsonvalue.snapshot_with_text(returned)
            except JsonValueError as exc:
                return _invalid_output(defn.name, [f"output is not lossless JSON: {exc}"])
            returned = ToolResult((), value=value, has_value=True, value_json=value_json)
        size = len(returned.value_json)
        return await off_loop(self.json_limits, size, self._normalize, defn, returned)

    def _wrapper_result(
        self, execution: Execution, body_result: ToolResult | None, result: ToolResult
    ) -> ToolResult:
        """A result an around wrapper wrote goes through the tool's output contract like a
        body's (reference §1.10): it must be lossless JSON and match the output schema."""
        if result is body_result:
            return result
        if (
            body_result is not None
            and body_result.has_value
            and not body_result.is_error
            and result.value is body_result.value
            and result.value_json == body_result.value_json
        ):
            return result  # the body's normalized value, with other fields rewritten
        returned: object = result
        if isinstance(returned, ToolResult):
            # The wrapper's `value_json` vouches for nothing: take our own snapshot.
            returned = replace(returned, value_json="")
        defn = self.catalog.resolve_execution(execution.name, execution.scope, execution.nested)
        return self._normalize(defn, cast("JsonValue | ToolResult", returned), name=execution.name)

    def _normalize(
        self,
        defn: ToolDefinition | None,
        returned: JsonValue | ToolResult,
        *,
        name: str = "",
    ) -> ToolResult:
        """Validates a body's output against the tool's output schema and renders content.

        Without a definition (a wrapper answered for an unknown tool) only losslessness is
        checked."""
        name = defn.name if defn is not None else name
        if isinstance(returned, ToolResult):
            if returned.is_error:
                return returned
            if not returned.has_value:
                # Content alone is a whole result only for a tool that promises no particular
                # value: a program's typed binding would otherwise get None for a declared type.
                if defn is not None and not _accepts_anything(defn.output_schema):
                    return _invalid_output(
                        name, ["the result has no value, but the tool declares an output schema"]
                    )
                return returned
            value, content, value_json = returned.value, returned.content, returned.value_json
        else:
            value, content, value_json = returned, (), ""
        if not value_json:  # a body's own value: copy it, so later mutation cannot reach us
            try:
                value, value_json = jsonvalue.snapshot_with_text(value)
            except JsonValueError as exc:
                return _invalid_output(name, [f"output is not lossless JSON: {exc}"])
        violations = [] if defn is None else validate(defn.output_schema, value, root="result")
        if violations:
            return _invalid_output(name, violations)
        rendered = content or (TextBlock(jsonvalue.render_pretty(value)),)
        if not isinstance(returned, ToolResult):
            return ToolResult(rendered, value=value, has_value=True, value_json=value_json)
        return replace(
            returned, value=value, content=rendered, has_value=True, value_json=value_json
        )

    # -- finalize / finish ---------------------------------------------------------------------

    async def finalize(self, execution: Execution, result: ToolResult) -> ToolResult:
        """Post-execute waterfall (default accept), then finish."""
        started = time.time_ns()
        count = 0
        try:
            decision: Accept | Block = Accept()
            for hooks in self.catalog.chain_hooks(execution.agent):
                for hook in hooks.post_execute:
                    decision = await hook(execution, result, decision)
                    count += 1
            result = self._apply_post(execution, result, decision)
        except Exception as exc:
            result = _failure(exc)
        if count:  # a stage with no hooks records no event
            execution.trace.stage(POST_EXECUTE, started)
        if execution.signal.aborted and not result.is_error:
            result = aborted(before_dispatch=False).with_contexts(result.additional_contexts)
        return self.finish(execution, result)

    def _apply_post(
        self, execution: Execution, result: ToolResult, decision: Accept | Block
    ) -> ToolResult:
        if isinstance(decision, Block):
            message = text_of(decision.feedback) or "tool result blocked by post-execute policy"
            blocked = error_result(message, "BLOCKED")
            return replace(
                blocked, content=decision.feedback, additional_contexts=decision.contexts
            )
        if decision.content is not None and decision.replace_value:
            raise TypeError("post-execute may replace content or value, not both")
        if decision.replace_value:
            if result.is_error:
                raise TypeError("post-execute cannot replace the value of a failed result")
            defn = self.catalog.resolve_execution(execution.name, execution.scope, execution.nested)
            if defn is None:
                raise TypeError(f'unknown tool "{execution.name}"')
            result = self._normalize(defn, decision.value)
        elif decision.content is not None:
            result = replace(result, content=decision.content)
        if decision.contexts:
            result = result.with_contexts((*result.additional_contexts, *decision.contexts))
        return result

    def finish(self, execution: Execution, result: ToolResult) -> ToolResult:
        """Notifies result observers; their failures are logged, never propagated."""
        for hooks in self.catalog.chain_hooks(execution.agent):
            for observer in hooks.observers:
                try:
                    observer(execution, result)
                except Exception:
                    log.exception("result observer failed for call %s", execution.call_id)
        return result


def _failure(exc: BaseException) -> ToolResult:
    if isinstance(exc, ToolCallFailure):
        return error_result(str(exc), exc.code, exc.name)
    return error_result(str(exc) or type(exc).__name__, name=type(exc).__name__)


def _accepts_anything(schema: JsonValue) -> bool:
    # `{}` is what a tool that declares no output schema gets.
    return schema is True or schema == {}


def _invalid_output(name: str, violations: list[str]) -> ToolResult:
    detail = "; ".join(violations)
    return error_result(
        f'tool "{name}" returned invalid output: {detail}', INVALID_TOOL_OUTPUT, "ToolOutputError"
    )
