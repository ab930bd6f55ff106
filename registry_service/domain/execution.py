"""The one pipeline every tool call passes through.

create (argument snapshot, collapse; the call's plan) → pre-execute → approval → guards →
around wrappers → body (input and output validation) → post-execute → result observers.
`Executor.run` is the only driver of that sequence. A caller that must order stages across
calls (the per-run scheduler of nested calls) passes a `Gate` that the driver awaits at each
stage boundary; it decides when a stage may enter, never what the stage does.

The pipeline writes no history and records no telemetry itself: it emits events
(registry_service/domain/events.py) to the executor's observers, the history recorder and the
telemetry observer among them (registry_service/domain/observers.py). What it keeps of
tracing is the call's context: the span that a tool body, and what it calls, continues.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, cast

from opentelemetry.util.types import AttributeValue

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue, JsonValueError
from registry_service.domain.approvals import ApprovalBroker, ApprovalOutcome, ApprovalRequest
from registry_service.domain.calls import Arguments, Execution, ExecutionInput, ToolCallFailure
from registry_service.domain.catalog import Catalog
from registry_service.domain.events import (
    ApprovalPending,
    ApprovalResolved,
    CallFailed,
    CallFinished,
    CallReceived,
    CallStarted,
    Emit,
    Event,
    NestedCallSettled,
    NestedCallStarted,
    ObservedCall,
    ProgramLog,
    StageTimed,
    ToolResolved,
    no_events,
)
from registry_service.domain.json_admission import DEFAULT_LIMITS, JsonLimits, off_loop
from registry_service.domain.jsonschema import format_invalid_args, validate
from registry_service.domain.observers import Observer, Observers
from registry_service.domain.policy import (
    Accept,
    Allow,
    AroundHook,
    Ask,
    Block,
    Deny,
    Guard,
    PostExecuteHook,
    PreDecision,
    PreExecuteHook,
    ResultObserver,
)
from registry_service.domain.results import (
    INVALID_ARGS,
    INVALID_TOOL_OUTPUT,
    UNKNOWN_TOOL,
    AdditionalContext,
    PrettyTextBlock,
    TextValuedResult,
    ToolResult,
    aborted,
    error_result,
    text_of,
)
from registry_service.domain.scopes import GLOBAL
from registry_service.domain.telemetry import (
    APPROVAL_WAIT,
    BODY,
    GUARDS,
    POST_EXECUTE,
    PRE_EXECUTE,
    CallTrace,
    RegistryTelemetry,
)
from registry_service.domain.telemetry_observer import TelemetryObserver
from registry_service.domain.tools import Invocation, ToolDefinition, is_parallel

# A call's types and its progress events are re-exported: callers name them where they call
# the pipeline.
__all__ = [
    "DIRECT",
    "ApprovalPending",
    "ApprovalResolved",
    "CallStarted",
    "Emit",
    "Event",
    "Execution",
    "ExecutionInput",
    "Executor",
    "Gate",
    "NestedCallSettled",
    "NestedCallStarted",
    "Plan",
    "ProgramLog",
    "ToolCallFailure",
    "no_events",
]

log = logging.getLogger(__name__)


class Gate:
    """Where a call's stages wait before they enter: the caller decides *when*, never *what*.

    The pipeline driver (`Executor.run`) awaits the gate at each boundary of the stage
    sequence. This base gate never waits: a model-direct call runs straight through. A
    `run_code` run's scheduler supplies a gate per nested call that keeps its ordered lane
    (starts and commits one at a time in submission order; only bodies overlap).
    """

    async def start(self) -> None:
        """Before create: the call's start section (create, pre-execute, approval, guards)."""

    async def dispatch(self) -> None:
        """Before around wrappers and the body, which may overlap other calls' bodies."""

    async def commit(self) -> None:
        """Before the commit section (post-execute, result observers), with or without a
        body having run."""

    async def done(self, result: ToolResult) -> ToolResult:
        """After the commit section: the call's final result, handed to the caller."""
        return result


DIRECT = Gate()  # a model-direct call's gate: no stage waits


@dataclass(frozen=True, slots=True)
class Plan:
    """What one call will run, resolved once at create: the tool as
    `resolve_execution` sees it, and the hooks of the agent's chain (global first, then
    farthest → nearest). Later registry changes do not reach a call already created."""

    definition: ToolDefinition | None
    pre_execute: tuple[PreExecuteHook, ...]
    guards: tuple[Guard, ...]
    around: tuple[AroundHook, ...]
    post_execute: tuple[PostExecuteHook, ...]
    observers: tuple[ResultObserver, ...]


@dataclass
class _Dispatch:
    body_invoked: bool = False
    deferred: list[AdditionalContext] = field(default_factory=list)
    # What `_body` returned: already normalized, so a wrapper passing it through costs nothing.
    body_result: ToolResult | None = None


# How a result leaves the start section or dispatch: run the body, go through post-execute,
# or skip post-execute (a throwing pre-execute hook, guard or around wrapper).
_Next = Literal["dispatch", "post", "final"]


class Executor:
    def __init__(
        self,
        catalog: Catalog,
        approvals: ApprovalBroker,
        telemetry: RegistryTelemetry | None = None,
        json_limits: JsonLimits = DEFAULT_LIMITS,
        observers: Sequence[Observer] = (),
    ) -> None:
        """`observers` see every call's events, outermost first (the history recorder), and
        the telemetry observer of `telemetry` innermost."""
        self.catalog = catalog
        self.approvals = approvals
        self.telemetry = telemetry or RegistryTelemetry()
        self.json_limits = json_limits
        self.observers = Observers((*observers, TelemetryObserver(self.telemetry)))

    async def execute(self, inp: ExecutionInput, emit: Emit = no_events) -> ToolResult:
        """A model-direct call, its observers around it: received (its `tool/call` record
        durable, its span open) → `run` → finished (span ended, `tool/result` durable). A
        record that cannot be written fails the call with the store's error: before the call
        ran, or with the result lost."""
        call = ObservedCall.direct(inp)
        await self.observers.begin(CallReceived(call))
        trace = call.trace
        if trace is not inp.trace:
            inp = replace(inp, trace=trace)
        try:
            with trace.activated():
                result = await self.run(inp, emit)
        except BaseException as exc:
            self.observers.tell(CallFailed(call, exc))
            raise
        await self.observers.end(CallFinished(call, result))
        return result

    def _announce(self, emit: Emit, event: Event) -> None:
        """A progress event: to the observers, then to the caller's stream."""
        self.observers.tell(event)
        emit(event)

    def _timed(
        self, trace: CallTrace, stage: str, started_ns: int, **attributes: AttributeValue
    ) -> None:
        self.observers.tell(StageTimed(trace, stage, started_ns, time.time_ns(), attributes))

    async def run(
        self, inp: ExecutionInput, emit: Emit = no_events, gate: Gate = DIRECT
    ) -> ToolResult:
        """The one driver of the stage sequence, for every call (model-direct or nested):
        create → pre-execute → approval → guards → around → body → post-execute → finish."""
        await gate.start()
        created = self.create(inp)
        if isinstance(created, ToolResult):  # refused at creation: no policy observes it
            await gate.commit()
            return await gate.done(created)
        plan = self.plan(created)
        if plan.definition is not None:
            self.observers.tell(ToolResolved(created.trace, plan.definition.description))
        if not created.nested:  # a nested call's start is announced by its run
            self._announce(emit, CallStarted(created.call_id, created.name))
        step, result = await self._prepare(created, plan, emit)
        if step == "dispatch":
            await gate.dispatch()
            try:
                result = await self._dispatch(created, plan, emit)
                step = "post"
            except Exception as exc:  # an around wrapper threw: final, no post-execute
                step, result = "final", _failure(exc)
        await gate.commit()
        assert result is not None
        if step == "post":
            result = await self._post_execute(created, plan, result)
        return await gate.done(self._finish(created, plan, result))

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
                INVALID_ARGS,
                "TypeError",
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
            held=Arguments(arguments),
            arguments_json=arguments_json,
            agent=inp.agent,
            agent_id=inp.agent_id,
            parent=inp.parent,
            signal=inp.signal,
            deadline=inp.deadline,
            traceparent=inp.traceparent,
            tracestate=inp.tracestate,
            trace=inp.trace,
            principal=inp.principal,
        )

    def plan(self, execution: Execution) -> Plan:
        chain = self.catalog.chain_hooks(execution.agent)
        return Plan(
            definition=self.catalog.resolve_execution(
                execution.name, execution.scope, execution.nested
            ),
            pre_execute=tuple(h for hooks in chain for h in hooks.pre_execute),
            guards=tuple(g for hooks in chain for g in hooks.guards),
            around=tuple(w for hooks in chain for w in hooks.around),
            post_execute=tuple(h for hooks in chain for h in hooks.post_execute),
            observers=tuple(o for hooks in chain for o in hooks.observers),
        )

    def execution_mode(self, execution: Execution) -> Literal["parallel", "exclusive"]:
        defn = self.catalog.resolve_execution(execution.name, execution.scope, execution.nested)
        return "parallel" if is_parallel(defn, execution.arguments) else "exclusive"

    # -- pre-execute, approval, guards -----------------------------------------------------------

    async def _prepare(
        self, execution: Execution, plan: Plan, emit: Emit
    ) -> tuple[_Next, ToolResult | None]:
        if execution.signal.aborted:
            return "final", aborted(before_dispatch=True)
        # A stage with nothing to run (no hooks, no guards) records no event.
        trace = execution.trace
        try:
            decision: PreDecision = Allow()
            if plan.pre_execute:
                started = time.time_ns()
                for hook in plan.pre_execute:
                    decision = await hook(execution, decision)
                if isinstance(decision, Allow):
                    self._timed(trace, PRE_EXECUTE, started)
                else:
                    kind = type(decision).__name__.lower()
                    self._timed(trace, PRE_EXECUTE, started, decision=kind)
            if isinstance(decision, Ask):
                approved = await self._approve(execution, decision, emit)
                if approved is None:  # approval cancelled because the caller went away
                    return "post", aborted(before_dispatch=True)
                decision = approved
            if isinstance(decision, Allow) and plan.guards:
                started = time.time_ns()
                for guard in plan.guards:
                    reason = guard(execution)
                    if reason is not None:
                        decision = Deny(reason)
                        break
                if isinstance(decision, Deny):
                    self._timed(trace, GUARDS, started, decision="deny")
                else:
                    self._timed(trace, GUARDS, started)
        except Exception as exc:
            return "final", _failure(exc)
        if isinstance(decision, Deny):
            return "post", error_result(decision.reason, "DENIED")
        if execution.signal.aborted:
            return "post", aborted(before_dispatch=True)
        return "dispatch", None

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
            principal=execution.principal.qualified,
        )
        self._announce(emit, ApprovalPending(request.approval_id, request.reason))
        started = time.time_ns()
        resolution = await self.approvals.request(
            request, execution.signal, expires_in_s=ask.expires_in_s
        )
        outcome = resolution.outcome
        self._timed(
            execution.trace,
            APPROVAL_WAIT,
            started,
            approval_id=request.approval_id,
            outcome=outcome.value,
        )
        self._announce(emit, ApprovalResolved(request.approval_id, outcome))
        if outcome is ApprovalOutcome.ALLOWED_ONCE:
            return Allow()
        if outcome is ApprovalOutcome.REJECTED:
            return Deny(f'the user rejected tool "{name}"')
        if outcome is ApprovalOutcome.EXPIRED:
            return Deny(f'the approval of tool "{name}" expired before anyone answered')
        if outcome is ApprovalOutcome.CANCELLED:
            if execution.signal.aborted:
                return None
            return Deny(f'approval for tool "{name}" was cancelled')
        return Deny(f'tool "{name}" requires approval, but {resolution.unavailable_because}')

    # -- around wrappers and the body ----------------------------------------------------------

    async def _dispatch(self, execution: Execution, plan: Plan, emit: Emit) -> ToolResult:
        """Around wrappers (outermost: global) then the body. A wrapper's throw propagates."""
        state = _Dispatch()
        wrappers = plan.around

        async def body() -> ToolResult:
            state.body_result = await self._body(execution, plan, state, emit)
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
                self._timed(execution.trace, BODY, started)
            else:  # refused before the tool ran (unknown tool, invalid arguments, aborted)
                self._timed(execution.trace, BODY, started, invoked=False)
        if wrappers:
            result = self._wrapper_result(execution, plan, state.body_result, result)
        if state.deferred:
            result = result.with_contexts((*state.deferred, *result.additional_contexts))
        if execution.signal.aborted and not result.is_error:
            return aborted(before_dispatch=not state.body_invoked).with_contexts(
                result.additional_contexts
            )
        return result

    async def _body(
        self, execution: Execution, plan: Plan, state: _Dispatch, emit: Emit
    ) -> ToolResult:
        if execution.signal.aborted:
            return aborted(before_dispatch=True)
        defn = plan.definition
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
        invocation = Invocation(
            emit=emit,
            observe=self.observers.tell,
            call_id=execution.call_id,
            root_call_id=execution.root_call_id,
            agent=execution.agent,
            agent_id=execution.agent_id,
            tool_name=execution.name,
            arguments_json=execution.arguments_json,
            # The call's own signal (a body only reads it): no derived signal per call.
            signal=execution.signal,
            deadline=execution.deadline,
            caller_traceparent=execution.traceparent,
            caller_tracestate=execution.tracestate,
            trace=trace,  # the call's own span: providers continue from it
            principal=execution.principal,
            decoded_arguments=execution.held.hand_off(),
        )
        try:
            with trace.activated():
                returned = await defn.body(invocation)
        except Exception as exc:
            return _failure(exc)
        finally:
            invocation.end_progress()  # the body's last progress, and none after its result
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
            # The value is written here, on the loop (C-speed), in the step the body returned
            # in: the text is the result, whatever the body does with its object later.
            if _accepts_anything(defn.output_schema):
                # Nothing to validate: no copy of the value; whoever reads it gets the text's.
                try:
                    return TextValuedResult.of_text(jsonvalue.dumps(returned))
                except JsonValueError as exc:
                    return _invalid_output(defn.name, [f"output is not lossless JSON: {exc}"])
            try:  # the schema is checked on a copy only the pipeline holds
                value, value_json = jsonvalue.snapshot_with_text(returned)
            except JsonValueError as exc:
                return _invalid_output(defn.name, [f"output is not lossless JSON: {exc}"])
            returned = ToolResult((), value=value, has_value=True, value_json=value_json)
        size = len(returned.value_json)
        return await off_loop(self.json_limits, size, self._normalize, defn, returned)

    def _wrapper_result(
        self,
        execution: Execution,
        plan: Plan,
        body_result: ToolResult | None,
        result: ToolResult,
    ) -> ToolResult:
        """A result an around wrapper wrote goes through the tool's output contract like a
        body's: it must be lossless JSON and match the output schema."""
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
        return self._normalize(
            plan.definition, cast("JsonValue | ToolResult", returned), name=execution.name
        )

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
        rendered = content or (PrettyTextBlock(value),)  # rendered only if read
        if not isinstance(returned, ToolResult):
            return ToolResult(rendered, value=value, has_value=True, value_json=value_json)
        return replace(
            returned, value=value, content=rendered, has_value=True, value_json=value_json
        )

    # -- post-execute, result observers ----------------------------------------------------------

    async def _post_execute(
        self, execution: Execution, plan: Plan, result: ToolResult
    ) -> ToolResult:
        """The post-execute waterfall (default accept)."""
        if plan.post_execute:  # a stage with no hooks records no event
            started = time.time_ns()
            try:
                decision: Accept | Block = Accept()
                for hook in plan.post_execute:
                    decision = await hook(execution, result, decision)
                result = self._apply_post(execution, plan, result, decision)
            except Exception as exc:
                result = _failure(exc)
            self._timed(execution.trace, POST_EXECUTE, started)
        if execution.signal.aborted and not result.is_error:
            result = aborted(before_dispatch=False).with_contexts(result.additional_contexts)
        return result

    def _apply_post(
        self, execution: Execution, plan: Plan, result: ToolResult, decision: Accept | Block
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
            defn = plan.definition
            if defn is None:
                raise TypeError(f'unknown tool "{execution.name}"')
            result = self._normalize(defn, decision.value)
        elif decision.content is not None:
            result = replace(result, content=decision.content)
        if decision.contexts:
            result = result.with_contexts((*result.additional_contexts, *decision.contexts))
        return result

    def _finish(self, execution: Execution, plan: Plan, result: ToolResult) -> ToolResult:
        """Notifies result observers; their failures are logged, never propagated."""
        for observer in plan.observers:
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
