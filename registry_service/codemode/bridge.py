"""The `run_code` transport: runs a program on a runtime and dispatches its binding calls.

The body of `run_code`: validate the description, mint the parent token,
enumerate once as bindings the agent's visible tools that the caller's principal may call
(`run_code` excluded), open a run, turn every binding call into a nested call (acting as that
principal, admitted by the rule of the direct call) through the per-run scheduler, and, when
the run ends,
reach quiescence (queued calls abandoned, in-flight ones settled, every record written) before
the outer result exists.

A nested call's record the history store fails ends the run with the store's error (as the
outer result's code, and as the call's status). A code runtime that cannot be reached, or is
lost mid-run, is the service's failure, not the program's: the outer result (recorded like
any other) carries an UNAVAILABLE CODE_RUNTIME_UNAVAILABLE error that ends the call's RPC (see
`ToolResult.rpc_error`), with `phase: connect` and a retry delay when nothing ran,
`phase: running` and none when the program may have run in part. A runtime with no sandbox
free for the run (RESOURCE_EXHAUSTED) is capacity, not the program's failure either: the outer
result carries a RESOURCE_EXHAUSTED CODE_RUNTIME_EXHAUSTED error with the runtime's retry
delay; nothing ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any

from codemode_wire import jsonvalue, shared_logs
from codemode_wire.errors import CodemodeError, resource_exhausted, unavailable
from codemode_wire.jsonvalue import JsonTooDeep, JsonValue, JsonValueError
from codemode_wire.text import utf8_exceeds
from registry_service.codemode.runtime_port import (
    BindingCall,
    LimitedRuntime,
    RunLog,
    RunRefused,
    RunSpec,
    RunStream,
    RunTerminal,
    RuntimeExhausted,
    RuntimeLimits,
    RuntimeLost,
    RuntimePort,
    RuntimeUnavailable,
    RuntimeUnreachable,
    tenant_key,
)
from registry_service.codemode.scheduler import NestedCall, RunHooks, RunScheduler
from registry_service.codemode.token import TokenError, TokenMinter
from registry_service.domain.access import AccessPolicy
from registry_service.domain.admission import Admission, Slot
from registry_service.domain.events import (
    NestedCallAbandoned,
    NestedCallReceived,
    NestedCallRefused,
    NestedCallSettled,
    NestedCallStarted,
    Observed,
    ObservedCall,
    ProgramLog,
    RunEnded,
    RunStarted,
)
from registry_service.domain.execution import ExecutionInput, Executor, ToolCallFailure
from registry_service.domain.json_admission import decode_text, off_loop
from registry_service.domain.observers import Write
from registry_service.domain.results import (
    ABORTED_BEFORE_DISPATCH,
    AdditionalContext,
    ImageBlock,
    TextBlock,
    ToolResult,
    aborted,
    error_result,
)
from registry_service.domain.scopes import GLOBAL
from registry_service.domain.signals import AbortController
from registry_service.domain.tool_access import ToolAccess, ToolAuthority
from registry_service.domain.tools import RUN_CODE, Invocation

CODE_RUN_FAILED = "CODE_RUN_FAILED"
CODE_RUNTIME_UNAVAILABLE = "CODE_RUNTIME_UNAVAILABLE"
CODE_RUNTIME_EXHAUSTED = "CODE_RUNTIME_EXHAUSTED"
# Binding-call arguments that cannot be dispatched, as the program sees them (the worker checks
# first, with the same texts: runtime_service/worker/program.py).
LOSSY_ARGUMENTS = "tool arguments must be lossless JSON"
NO_ARGUMENTS = f"{LOSSY_ARGUMENTS} (call the tool with an arguments object, e.g. `{{}}`)"
SETTLED = "run_code settled"
# A binding call its run's principal may not make, as the program sees it: the code is stable
# (the text after it names the principal, the missing permission and the resource).
NESTED_DENIED = "nested call refused: PERMISSION_DENIED"
HISTORY_FAILED = "the history store failed"
NO_OUTPUT = "(run_code completed with no output)"


# How long a parent token outlives its run's allowed time. The runtime starts a run's wall
# clock only once the worker has the program (after the pool hand-off, or a spawn), so the run
# may end a little after `mint + allowed`; the margin covers that hand-off.
TOKEN_MARGIN_S = 60.0
# The longest wall-clock ceiling any runtime accepts (`RunBudgets.wall_ms` is capped at int32
# milliseconds): a run's allowed time when neither a deadline nor the runtime's limits are known.
_LONGEST_RUN_S = (2**31 - 1) / 1000


@dataclass
class CodeModeConfig:
    max_parallel_sub_calls: int = 10
    retry_delay_s: float = 1.0  # suggested to callers when no runtime took a run


def token_lifetime(timeout: float | None, limits: RuntimeLimits) -> float:
    """Seconds a run's parent token stays valid: the run's allowed time plus `TOKEN_MARGIN_S`.

    A run may last until the outer call's deadline (`timeout` is the time left), and never
    longer than the runtime's wall ceiling, whichever comes first: the runtime lowers the run's
    ceiling to the deadline it is sent. So a binding call the run can still make always
    carries a valid token, and a token stops verifying soon after its run can be alive.
    """
    bounds = [b for b in (timeout, limits.max_wall_s) if b is not None]
    return (min(bounds) if bounds else _LONGEST_RUN_S) + TOKEN_MARGIN_S


class RunCodeTransport:
    """The `run_code` tool body, bound to a runtime and the registry it dispatches into."""

    def __init__(
        self,
        executor: Executor,
        runtime: RuntimePort | None,
        config: CodeModeConfig,
        minter: TokenMinter,
        *,
        admission: Admission | None = None,
        authority: ToolAuthority | None = None,
    ) -> None:
        """`authority`: who may call which tool (None: everyone everything, the open default).
        A run acts as the principal of its `run_code` call: its bindings are the tools that
        principal may call, and each binding call is admitted by the same rule as the direct
        call (domain/tool_access.py)."""
        if config.max_parallel_sub_calls < 1:
            raise ValueError("maxParallelSubCalls must be a positive integer")
        self.executor = executor
        self.runtime = runtime
        self.config = config
        self.minter = minter
        self.admission = admission or Admission()
        self.authority = authority or ToolAuthority(AccessPolicy((), enforced=False))
        self._closing: set[asyncio.Task[None]] = set()

    def close_later(self, stream: RunStream) -> None:
        """Closes a finished run's stream off the result path: after the terminal the close
        only waits for the RPC's end (a round trip), which the caller need not wait for."""
        task = asyncio.ensure_future(_close_quietly(stream))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def __call__(self, invocation: Invocation) -> ToolResult:
        args = invocation.arguments
        assert isinstance(args, dict)  # the input schema requires an object
        code, description = args.get("code"), args.get("description")
        if not isinstance(description, str) or not description.strip():
            raise ToolCallFailure(
                "invalid description: expected a non-empty string", "INVALID_ARGS"
            )
        if self.runtime is None:
            raise ToolCallFailure(
                "run_code requires a code runtime, and none is configured for this registry",
                CODE_RUNTIME_UNAVAILABLE,
            )
        assert isinstance(code, str)
        return await _Run(self, invocation, code).run()


@dataclass(eq=False)
class _Run(RunHooks):
    transport: RunCodeTransport
    outer: Invocation
    code: str
    controller: AbortController = field(default_factory=AbortController)
    deferred: list[AdditionalContext] = field(default_factory=list)
    concluded: bool = False
    counter: int = 0
    stream: RunStream | None = None
    limits: RuntimeLimits = field(default_factory=RuntimeLimits)
    # Admission slots of this run's nested calls in flight, by binding call id: released
    # when each is answered, and whatever is left when the run ends.
    nested_slots: dict[int, Slot] = field(default_factory=dict)
    access: ToolAccess = field(init=False)  # what the run's principal may call (set in `run`)

    def _tell(self, event: Observed) -> None:
        self.transport.executor.observers.tell(event)

    def _refused(self, reason: str, name: str) -> None:
        self._tell(NestedCallRefused(reason, name))

    async def run(self) -> ToolResult:
        t = self.transport
        outer = self.outer
        scope = outer.agent or GLOBAL
        # The principal is the registry's record of who called run_code (the guard's); asked
        # once per run, and never taken from anything the runtime sends.
        self.access = t.authority.access(outer.principal, outer.agent or "")
        visible = t.executor.catalog.view(scope).visible
        bindings = tuple(sorted(n for n in self.access.callable(visible) if n != RUN_CODE))
        self.bindings = frozenset(bindings)
        remove = outer.signal.add_listener(self.controller.abort)
        self.scheduler = RunScheduler(
            t.executor, self.controller.signal, t.config.max_parallel_sub_calls, self, outer.emit
        )
        runtime = t.runtime
        assert runtime is not None
        terminal: RunTerminal | RuntimeUnavailable | RuntimeExhausted | None = None
        stream: RunStream | None = None
        self._tell(RunStarted(outer.call_id))
        try:
            if isinstance(runtime, LimitedRuntime):
                self.limits = limits = await runtime.limits()
            else:
                limits = self.limits
            loop = asyncio.get_running_loop()
            timeout = None if outer.deadline is None else max(0.0, outer.deadline - loop.time())
            token = t.minter.mint(outer.call_id, outer.agent or "", token_lifetime(timeout, limits))
            spec = RunSpec(
                program=self.code,
                language=t.executor.catalog.language_for(scope),
                binding_names=bindings,
                token=token,
                timeout=timeout,
                traceparent=outer.traceparent,  # the run_code call's span
                tracestate=outer.tracestate,
                # An output the registry could not carry on would fail the run's stream
                # instead of ending it with `output-limit`.
                max_output_bytes=limits.max_output_bytes,
                tenant=tenant_key(outer.agent_id or outer.agent or "", outer.principal.qualified),
            )
            stream = self.stream = await runtime.open_run(spec)
            terminal = await self._pump(stream)
        except (RuntimeUnavailable, RuntimeExhausted) as exc:
            terminal = exc
        except RunRefused as exc:
            terminal = RunTerminal(
                logs=(), kind="worker-exit", message=f"the runtime ended the run: {exc}"
            )
        finally:
            remove()
            self.controller.abort(SETTLED)
            try:
                await self.scheduler.quiesce()
            except CodemodeError as exc:  # a nested call's record could not be written
                history_error: CodemodeError | None = exc
            else:
                history_error = None
            finally:
                for slot in self.nested_slots.values():
                    slot.release()
                if stream is not None:
                    self.transport.close_later(stream)
                self._tell(RunEnded(outer.call_id))
        if history_error is not None:
            return self._history_failed(history_error)
        return self._outer_result(terminal)

    async def _pump(self, stream: RunStream) -> RunTerminal:
        cancel_sent = False

        def on_abort(reason: str) -> None:
            nonlocal cancel_sent
            if not cancel_sent and reason != SETTLED:
                cancel_sent = True
                stream.cancel(reason)

        remove = self.controller.signal.add_listener(on_abort)
        try:
            async for event in stream.events():
                if isinstance(event, RunTerminal):
                    return event
                if isinstance(event, RunLog):
                    line = ProgramLog(event.text)
                    self._tell(line)
                    self.outer.emit(line)
                else:
                    await self._binding_call(stream, event)
        finally:
            remove()
        raise RuntimeLost("the run stream ended without a terminal message")

    # -- binding calls -------------------------------------------------------------------------

    async def _binding_call(self, stream: RunStream, call: BindingCall) -> None:
        name = call.name
        if self.controller.signal.aborted:
            return self._refuse_over(stream, call)
        try:
            verified = self.transport.minter.verify(call.token, agent=self.outer.agent or "")
            if verified.execution_id != self.outer.call_id:
                raise TokenError("parent token belongs to another run")
        except TokenError as exc:
            self._refused("invalid_token", name)
            return stream.reply(call.call_id, False, f"nested call refused: {exc}")
        try:
            # Before the binding check: refused as the same direct call is, and audited.
            await self.transport.authority.check(
                self.access,
                self.outer.agent or "",
                name,
                call_id="",  # refused before it had a sub-call id, as every refusal here
                via="run_code",
                parent_call_id=self.outer.call_id,
            )
        except CodemodeError as exc:
            self._refused("permission_denied", name)
            return stream.reply(call.call_id, False, f"{NESTED_DENIED}: {exc.message}")
        if name not in self.bindings:
            self._refused("unknown_binding", name)
            return stream.reply(call.call_id, False, f'unknown binding "tools.{name}"')
        json_limits = self.transport.executor.json_limits
        limit = self.limits.max_payload_bytes
        if limit is None or limit > json_limits.max_argument_bytes:
            limit = json_limits.max_argument_bytes
        if utf8_exceeds(call.arguments_json, limit):
            # It arrived, but could not go on to a tool provider (nor come back): refused
            # like lossy arguments, so the program can catch it and carry on.
            self._refused("arguments_too_large", name)
            return stream.reply(
                call.call_id, False, f"tool arguments too large: over {limit} bytes of JSON"
            )
        if not call.arguments_json.strip():
            self._refused("invalid_arguments", name)
            return stream.reply(call.call_id, False, NO_ARGUMENTS)
        try:
            # A large text is decoded off the loop; this run's later messages wait (in order).
            arguments, arguments_json = await off_loop(
                json_limits,
                len(call.arguments_json),
                decode_text,
                call.arguments_json,
                json_limits,
            )
        except JsonTooDeep as exc:
            self._refused("arguments_too_deep", name)
            return stream.reply(
                call.call_id,
                False,
                f"tool arguments too deep: nested deeper than {exc.max_depth} levels",
            )
        except JsonValueError as exc:
            self._refused("invalid_arguments", name)
            return stream.reply(call.call_id, False, f"{LOSSY_ARGUMENTS}: {exc}")
        if self.controller.signal.aborted:  # while the arguments were decoded
            return self._refuse_over(stream, call)
        try:
            self.nested_slots[call.call_id] = self.transport.admission.nested(
                self.outer.agent or GLOBAL
            )
        except CodemodeError as exc:
            # Not dispatched, nothing recorded: the program sees a failed call it may retry.
            self._refused("admission_limit", name)
            return stream.reply(call.call_id, False, f"nested call refused: {exc.message}")
        self.counter += 1
        sub_call_id = f"{self.outer.call_id}:code:{self.counter}"
        # The nested call's span starts now (it includes the queue wait), as a child of the
        # runtime's run span named in the binding call, else of the run_code call's span.
        traceparent, tracestate = call.traceparent, call.tracestate
        if not traceparent:
            traceparent, tracestate = self.outer.traceparent, self.outer.tracestate
        observed = ObservedCall(
            call_id=sub_call_id,
            root_call_id=self.outer.root_call_id,
            name=name,
            agent=self.outer.agent or "",
            agent_id=self.outer.agent_id,
            parent_call_id=self.outer.call_id,
            arguments_json=arguments_json,  # the dispatched arguments, for both records
            traceparent=traceparent,
            tracestate=tracestate,
        )
        self._tell(NestedCallReceived(observed))  # its span opens here
        nested = NestedCall(
            n=self.counter,
            sub_call_id=sub_call_id,
            name=name,
            observed=observed,
            submitted_at=observed.received_at,
            inp=ExecutionInput(
                call_id=sub_call_id,
                root_call_id=self.outer.root_call_id,
                name=name,
                arguments=arguments,
                arguments_json=arguments_json,
                signal=self.controller.signal,
                agent=self.outer.agent,
                agent_id=self.outer.agent_id,
                parent=verified,
                deadline=self.outer.deadline,
                traceparent=traceparent,
                tracestate=tracestate,
                trace=observed.trace,
                principal=self.outer.principal,  # the run's: what it calls acts as it
            ),
            binding_call_id=call.call_id,
        )
        self.scheduler.submit(nested)
        return None

    def _refuse_over(self, stream: RunStream, call: BindingCall) -> None:
        reason = self.controller.signal.reason
        self._refused("run_over", call.name)
        stream.reply(
            call.call_id, False, f"run_code run is over ({reason}); {call.name} not dispatched"
        )

    def answer(self, call: NestedCall, result: ToolResult) -> None:
        slot = self.nested_slots.pop(call.binding_call_id, None)
        if slot is not None:
            slot.release()
        # Queued on the stream in this very step: no task or loop turn per nested call.
        assert self.stream is not None
        limit = self.limits.max_payload_bytes
        if result.is_error:
            message = result.error.message if result.error else "tool call failed"
            if limit is not None and utf8_exceeds(message, limit):
                message = _cut(message, limit)
            self.stream.reply(call.binding_call_id, False, message)
            return
        payload = result.value_json or jsonvalue.dumps(result.value)
        if limit is not None and utf8_exceeds(payload, limit):
            # Sent as it is, the answer would exceed the message limit and fail the whole run.
            message = f"tool result too large for the program: over {limit} bytes of JSON"
            self.stream.reply(call.binding_call_id, False, message)
        else:
            self.stream.reply(call.binding_call_id, True, payload)

    # -- scheduler hooks -----------------------------------------------------------------------

    async def started(self, call: NestedCall) -> None:
        waited = call.started_at - call.submitted_at
        event = NestedCallStarted(
            call.sub_call_id,
            call.name,
            round(waited * 1000, 3),
            call=call.observed,
            started_at=call.started_at,
        )
        # The start record is not awaited here: it is queued ahead of the call's body, which
        # the gate starts once it is durable (scheduler `dispatch`), and `committed` checks it.
        writes = self.transport.executor.observers.notify(event)
        if writes:
            call.start_record = _joined(writes)
            call.start_record.add_done_callback(_retrieve)
        self.outer.emit(event)

    async def committed(self, call: NestedCall, result: ToolResult) -> asyncio.Future[Any] | None:
        start_failed: BaseException | None = None
        if call.start_record is not None:
            try:
                await call.start_record
            except Exception as exc:
                start_failed = exc
        if not result.is_error:
            if any(isinstance(b, ImageBlock) for b in result.content):
                self.deferred.append(AdditionalContext(result.content, "tools-code-mode"))
            self.concluded = self.concluded or result.concludes_turn
        self.deferred.extend(result.additional_contexts)
        event = NestedCallSettled(
            call.sub_call_id,
            call.name,
            result.is_error,
            result.error.code if result.error else "",
            round((time.time() - call.started_at) * 1000, 3),
            call=call.observed,
            result=result,
            exclusive=call.exclusive,
        )
        writes = self.transport.executor.observers.notify(event)  # the settle record
        self.outer.emit(event)
        if start_failed is not None:
            # A failed start record fails the run, as it always did, and ends it now: else the
            # program waits for this call's answer until its deadline, and the run_code call
            # hangs with it. (Its call gets no settle record: the recorder writes none.)
            for write in writes:
                asyncio.ensure_future(write).add_done_callback(_retrieve)
            self.controller.abort(HISTORY_FAILED)
            raise start_failed
        return _joined(writes) if writes else None

    def abandoned(self, call: NestedCall) -> None:
        reason = self.controller.signal.reason or SETTLED
        result = error_result(
            f"run_code run is over ({reason}); {call.name} tool call abandoned",
            ABORTED_BEFORE_DISPATCH,
            "AbortError",
        )
        self._tell(NestedCallAbandoned(call.observed, result))
        self.answer(call, result)

    # -- the outer result ----------------------------------------------------------------------

    def _outer_result(
        self, terminal: RunTerminal | RuntimeUnavailable | RuntimeExhausted | None
    ) -> ToolResult:
        contexts = tuple(self.deferred)
        assert terminal is not None
        if self._caller_gone():
            # Whichever outcome raced the caller's cancel or deadline (the runtime's `abort`,
            # or its `timeout` at the deadline it was given), the call was aborted, as any
            # tool's call is: one code for it, whatever the race.
            return aborted(before_dispatch=False).with_contexts(contexts)
        if isinstance(terminal, RuntimeUnavailable):
            return self._runtime_unavailable(terminal).with_contexts(contexts)
        if isinstance(terminal, RuntimeExhausted):
            return self._runtime_exhausted(terminal).with_contexts(contexts)
        if not terminal.ok:
            message = f"code run failed ({terminal.kind}): {terminal.message}"
            if terminal.logs:
                message += shared_logs.CAPTURED + "\n".join(terminal.logs)
            failed = error_result(message, CODE_RUN_FAILED, "CodeRunFailedError")
            return failed.with_contexts(contexts)
        logs: list[JsonValue] = list(terminal.logs)
        value: dict[str, JsonValue] = {"logs": logs}
        value_json = '{"logs":' + jsonvalue.dumps(logs)
        if terminal.value_json is not None:
            # Decoded and written canonical in one pass; the outer value's text is composed
            # around it (as `dumps(value)` writes it) instead of encoding the value again.
            value["result"], result_json = jsonvalue.loads_canonical(terminal.value_json)
            value_json += ',"result":' + result_json
        content = (TextBlock(render_output(value)),)
        result = ToolResult(content, value=value, has_value=True, value_json=value_json + "}")
        result = result.with_contexts(contexts)
        if self.concluded:
            result = replace(result, concludes_turn=True)
        return result

    def _runtime_unavailable(self, lost: RuntimeUnavailable) -> ToolResult:
        """The outer result when no runtime took the run, or the one that had it was lost."""
        if isinstance(lost, RuntimeUnreachable):
            message = (
                f"the code runtime is unavailable: {lost}; the program did not run, so the "
                "call is safe to repeat"
            )
            delay: float | None = self.transport.config.retry_delay_s
        else:
            message = (
                f"the code runtime was lost while the program was running: {lost}; the "
                "program may have run in part (its tool calls are in history), so do not "
                "repeat the call blindly"
            )
            delay = None
        error = unavailable(CODE_RUNTIME_UNAVAILABLE, message, retry_delay=delay, phase=lost.phase)
        failed = error_result(message, CODE_RUNTIME_UNAVAILABLE, "CodeRuntimeUnavailableError")
        return replace(failed, rpc_error=error)

    def _runtime_exhausted(self, full: RuntimeExhausted) -> ToolResult:
        """The outer result when the runtime had no sandbox free: capacity, retryable."""
        delay = full.retry_delay_s
        if delay is None:
            delay = self.transport.config.retry_delay_s
        message = (
            f"the code runtime is at capacity: {full}; the program did not run, so the call is "
            f"safe to repeat after {delay:.3g} s"
        )
        error = resource_exhausted(CODE_RUNTIME_EXHAUSTED, message, retry_delay=delay)
        failed = error_result(message, CODE_RUNTIME_EXHAUSTED, "CodeRuntimeExhaustedError")
        return replace(failed, rpc_error=error)

    def _history_failed(self, error: CodemodeError) -> ToolResult:
        """The outer result when the history store failed a nested call's record: the store's
        error, in the result (recorded, if the store takes it) and as the call's status, as a
        direct call whose record fails ends with it."""
        message = f"code run failed: {error.message}"
        failed = error_result(message, error.reason, "HistoryError")
        return replace(failed, rpc_error=error).with_contexts(tuple(self.deferred))

    def _caller_gone(self) -> bool:
        deadline = self.outer.deadline
        if self.outer.signal.aborted:
            return True
        return deadline is not None and asyncio.get_running_loop().time() >= deadline


def render_output(value: dict[str, JsonValue]) -> str:
    """Logs joined by newlines, then the result (strings raw, others pretty JSON)."""
    logs = value.get("logs")
    parts = ["\n".join(logs)] if isinstance(logs, list) and logs else []  # type: ignore[arg-type]
    if "result" in value:
        parts.append(jsonvalue.render_pretty(value["result"]))
    text = "\n".join(p for p in parts if p)
    return text or NO_OUTPUT


async def _close_quietly(stream: RunStream) -> None:
    with contextlib.suppress(Exception):  # the run is over: nothing depends on a clean close
        await stream.close()


def _cut(text: str, limit: int) -> str:
    """The longest prefix of `text` that is at most `limit` bytes of UTF-8."""
    return text.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")


def _joined(writes: list[Write]) -> asyncio.Future[Any]:
    """One future for an event's writes (there is one, the history record's, or none)."""
    if len(writes) == 1:
        return asyncio.ensure_future(writes[0])
    return asyncio.gather(*writes)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Marks a write's failure as seen when no commit will await it (the run was aborted)."""
    if not future.cancelled():
        future.exception()
