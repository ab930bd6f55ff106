"""The RuntimeService servicer: translates messages and calls the domain, nothing else."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc

from codemode_common.request_parsing import Malformed, malformed_error
from codemode_common.run_acceptance import ACCEPTED
from codemode_wire import jsonvalue
from codemode_wire.api.common.v1 import trace_pb2
from codemode_wire.api.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from codemode_wire.errors import (
    CodemodeError,
    failed_precondition,
    invalid_argument,
    resource_exhausted,
    unavailable,
)
from codemode_wire.grpc_status import abort_rpc
from codemode_wire.text import utf8_exceeds, utf8_len
from runtime_service.budgets import Budgets
from runtime_service.capabilities import Capabilities, Isolation
from runtime_service.errors import RunRequestError, RuntimeDisposedError, RuntimeExhaustedError
from runtime_service.languages import DEFAULT_LANGUAGE
from runtime_service.multiplex import Outgoing, RunEnded, RunFeed, RunStreams, log_message
from runtime_service.outcome import BindingCall, BindingResult, PendingCall, RunResult
from runtime_service.plugin_host import (
    HostEvent,
    HostFailed,
    HostLog,
    HostRegistrations,
    HostResult,
    HostRetracted,
    HostServiceCall,
    HostServiceCallCancel,
    PluginHost,
)
from runtime_service.run import Run
from runtime_service.runtime import Runtime
from runtime_service.source_check import SourceChecker, SourceCheckRefused
from runtime_service.telemetry import RuntimeTelemetry

__all__ = ["DOMAIN", "RuntimeServicer"]

DOMAIN = "codemode.runtime"
_KINDS = {
    "exception": runtime_pb2.FAILURE_KIND_EXCEPTION,
    "timeout": runtime_pb2.FAILURE_KIND_TIMEOUT,
    "abort": runtime_pb2.FAILURE_KIND_ABORT,
    "worker-exit": runtime_pb2.FAILURE_KIND_WORKER_EXIT,
    "invalid-output": runtime_pb2.FAILURE_KIND_INVALID_OUTPUT,
    "output-limit": runtime_pb2.FAILURE_KIND_OUTPUT_LIMIT,
}
_BUDGET_FIELDS = ("compute_ms", "wall_ms", "max_output_bytes", "memory_bytes")
_CANCELLED_REASON = "run cancelled by the caller"
_MAX_DURATION_S = 315_576_000_000  # google.protobuf.Duration's range, about 10,000 years
_NO_OUTCOME = "the call result carried neither value_json nor error_message"
_FRAMING_BYTES = 4096  # a BindingCall's field tags and lengths, generously
_HALF_CLOSED = "no result can arrive: the caller half-closed the Run stream"
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
_SOURCE_KINDS = {
    "program": runtime_pb2.SOURCE_KIND_PROGRAM,
    "host": runtime_pb2.SOURCE_KIND_HOST_HALF,
    "client": runtime_pb2.SOURCE_KIND_CLIENT_HALF,
}
# An unspecified or unknown kind maps to "" (refused by the checker, naming the known ones).
_KIND_NAMES = {value: name for name, value in _SOURCE_KINDS.items()}
_SCOPES = {
    "per-run": runtime_pb2.ISOLATION_SCOPE_PER_RUN,
    "per-process": runtime_pb2.ISOLATION_SCOPE_PER_PROCESS,
    "": runtime_pb2.ISOLATION_SCOPE_UNSPECIFIED,
}


class RuntimeServicer(runtime_pb2_grpc.RuntimeServiceServicer):
    def __init__(
        self,
        runtime: Runtime,
        capabilities: Capabilities,
        telemetry: RuntimeTelemetry | None = None,
        *,
        max_message_bytes: int | None = None,
        checker: SourceChecker | None = None,
    ) -> None:
        self._runtime = runtime
        self._checker = checker or SourceChecker(runtime)
        self._capabilities = capabilities
        self._telemetry = telemetry or RuntimeTelemetry()
        self._max_message_bytes = max_message_bytes

    async def GetCapabilities(
        self, request: runtime_pb2.GetCapabilitiesRequest | Malformed, context: Context
    ) -> runtime_pb2.GetCapabilitiesResponse:
        if isinstance(request, Malformed):
            await _abort(context, malformed_error(request))
        caps = self._capabilities
        return runtime_pb2.GetCapabilitiesResponse(
            languages=list(caps.languages),
            isolation=_isolation_proto(caps.isolation),
            default_budgets=_budgets_proto(caps.defaults),
            max_budgets=_budgets_proto(caps.maxima),
            pool_size=caps.pool_size,
            language_isolation={
                language: _isolation_proto(isolation)
                for language, isolation in caps.by_language.items()
            },
            language_capabilities=[
                runtime_pb2.LanguageCapability(
                    name=entry.name,
                    served=entry.served,
                    reason=entry.reason,
                    program_wire_version=entry.program_wire_version,
                    host_facade_version=entry.host_facade_version,
                    default_budgets=_budgets_proto(entry.defaults),
                    max_budgets=_budgets_proto(entry.maxima),
                    max_source_bytes=entry.max_source_bytes,
                    checked_kinds=[_SOURCE_KINDS[kind] for kind in entry.checked_kinds],
                )
                for entry in caps.per_language
            ],
        )

    async def CheckSource(
        self, request: runtime_pb2.CheckSourceRequest | Malformed, context: Context
    ) -> runtime_pb2.CheckSourceResponse:
        if isinstance(request, Malformed):
            await _abort(context, malformed_error(request))
            return runtime_pb2.CheckSourceResponse()  # not reached: the abort raises
        kind = _KIND_NAMES.get(request.kind, "")
        try:
            outcome = await self._checker.check(request.language, kind, request.source)
        except SourceCheckRefused as exc:
            make = invalid_argument if exc.served else failed_precondition
            await _abort(context, make(exc.reason, str(exc)))
        except RuntimeDisposedError as exc:
            await _abort(context, unavailable("RUNTIME_SHUTTING_DOWN", str(exc)))
        except RuntimeExhaustedError as exc:
            await _abort(
                context,
                resource_exhausted(
                    "RUNTIME_AT_CAPACITY",
                    str(exc),
                    retry_delay=exc.retry_delay_s,
                    resource="sandbox-uids",
                ),
            )
        return runtime_pb2.CheckSourceResponse(
            ok=outcome.ok,
            checked_by=outcome.checked_by,
            problems=[
                runtime_pb2.SourceProblem(
                    line=p.line, column=p.column, message=p.message, hint=p.hint
                )
                for p in outcome.problems
            ],
        )

    async def Run(
        self,
        request_iterator: AsyncIterator[runtime_pb2.RunRequest | Malformed],
        context: Context,
    ) -> AsyncIterator[runtime_pb2.RunResponse]:
        start = await _first_start(request_iterator, context, "Run")
        if start is None:
            return

        async def accept() -> None:
            # Tells the caller the program is taken: a connection lost from now on may have
            # cost a partial run, one lost before it cost nothing (codemode_common.run_acceptance).
            await context.send_initial_metadata((ACCEPTED,))

        try:
            async with contextlib.aclosing(self.serve_run(start, request_iterator, accept)) as run:
                async for message in run:
                    yield message
        except RunEnded as ended:
            await _abort(context, ended.error)

    async def Multiplex(
        self,
        request_iterator: AsyncIterator[runtime_pb2.MultiplexRequest | Malformed],
        context: Context,
    ) -> AsyncIterator[runtime_pb2.MultiplexResponse]:
        streams = RunStreams(self.serve_run, DOMAIN, self._max_message_bytes)
        reader = asyncio.ensure_future(streams.read(request_iterator))
        try:
            while (batch := await streams.next_batch()) is not None:
                yield batch
            malformed = reader.result() if reader.done() and not reader.cancelled() else None
            if malformed is not None:
                await _abort(context, malformed_error(malformed))
        finally:
            reader.cancel()
            await streams.close()

    async def serve_run(
        self,
        start: runtime_pb2.RunStart,
        requests: AsyncIterator[runtime_pb2.RunRequest | Malformed] | RunFeed,
        accept: Callable[[], Awaitable[None]],
        outgoing: Outgoing | None = None,
    ) -> AsyncGenerator[runtime_pb2.RunResponse, None]:
        """One run, whichever stream carries it (`Run`, or one run of `Multiplex`): its
        messages out, until its terminal; `accept` is awaited once the run is taken. Raises
        `RunEnded` with the error the run ends with instead of a terminal.

        `requests`: the caller's messages after the start, read by a task of the run's own;
        or, on `Multiplex`, handed over as the stream's reader routes them (`RunFeed`).
        `outgoing`: where the run's messages wait to be yielded (None: a queue); on
        `Multiplex` one that sends them itself while the stream has room for them."""
        # The run's span continues the caller's context; every binding call names it as parent.
        traced = self._telemetry.start_run(
            start.trace_context.traceparent,
            start.trace_context.tracestate,
            language=start.language or DEFAULT_LANGUAGE,
            bindings=len(start.binding_names),
        )
        # Log lines wait as their text, and become stream messages only as they are sent: a
        # message object costs several times a short line's text (ledger.LOG_LINE_OVERHEAD).
        if outgoing is None:
            outgoing = asyncio.Queue()
        relay = _CallRelay(
            outgoing,
            start.token,
            trace_pb2.TraceContext(traceparent=traced.traceparent, tracestate=traced.tracestate),
            self._max_message_bytes,
        )
        try:
            run = self._runtime.create_run(
                program=start.program,
                language=start.language or DEFAULT_LANGUAGE,
                bindings=list(start.binding_names),
                handler=relay.call,
                budgets=_budgets_request(start.budgets),
                deadline_ms=_deadline_ms(start),
                on_log=outgoing.put_nowait,
                tenant=start.tenant,
            )
        except RunRequestError as exc:
            traced.refused("invalid-run", str(exc))
            raise RunEnded(invalid_argument("INVALID_RUN", str(exc))) from None
        except RuntimeDisposedError as exc:
            traced.refused("shutting-down", str(exc))
            raise RunEnded(unavailable("RUNTIME_SHUTTING_DOWN", str(exc))) from None
        with traced.activated():  # the execution task (and the worker hand-off) run inside it
            execution = asyncio.ensure_future(self._runtime.execute(run))
        execution.add_done_callback(traced.finish)
        execution.add_done_callback(lambda _: outgoing.put_nowait(None))
        messages = _ClientMessages(run, relay)
        reader = None
        if isinstance(requests, RunFeed):
            requests.attach(messages.take, messages.end)
        else:
            reader = asyncio.ensure_future(_read_client(requests, messages))
        try:
            await accept()
            while (message := await outgoing.get()) is not None:
                yield log_message(message) if isinstance(message, str) else message
            refusal = messages.refusal
            if refusal is not None:  # the run was aborted for it: the status says why instead
                raise RunEnded(refusal)
            exhausted = _exhausted(execution)
            if exhausted is not None:  # no sandbox was free: nothing ran
                raise RunEnded(exhausted)
            response = runtime_pb2.RunResponse()
            _fill_terminal(response.terminal, execution.result())  # a large value: one copy
            yield response
        finally:
            if reader is not None:
                reader.cancel()
            elif isinstance(requests, RunFeed):
                requests.detach()
            if not execution.done():
                # The caller went away: abort, and let the worker die before we return.
                run.abort(_CANCELLED_REASON)
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(execution)

    async def Host(
        self,
        request_iterator: AsyncIterator[runtime_pb2.HostRequest | Malformed],
        context: Context,
    ) -> AsyncIterator[runtime_pb2.HostResponse]:
        start = await _first_start(request_iterator, context, "Host")
        if start is None:
            return
        outgoing: asyncio.Queue[runtime_pb2.HostResponse | None] = asyncio.Queue()
        try:
            visible = jsonvalue.loads(start.visible_tools_json) if start.visible_tools_json else []
            if type(visible) is not list:
                raise RunRequestError("visible_tools_json must be a JSON array")
            timeout_s = 5.0
            if start.HasField("start_timeout"):
                timeout_s = start.start_timeout.ToMilliseconds() / 1000
            host = self._runtime.create_plugin_host(
                source=start.source,
                plugin_id=start.plugin_id,
                package_id=start.package_id,
                run_id=start.run_id,
                language=start.language or DEFAULT_LANGUAGE,
                budgets=_budgets_request(start.budgets),
                start_timeout_s=timeout_s,
                visible_tools=visible,
                services=[_service_contract(service) for service in start.services],
                emit=lambda event: outgoing.put_nowait(_host_response(event)),
            )
        except ValueError as exc:  # RunRequestError, or visible_tools_json not lossless JSON
            await _abort(context, invalid_argument("INVALID_HOST", str(exc)))
            return
        except RuntimeDisposedError as exc:
            await _abort(context, unavailable("RUNTIME_SHUTTING_DOWN", str(exc)))
            return
        hosting = asyncio.ensure_future(self._runtime.run_host(host))
        hosting.add_done_callback(lambda _: outgoing.put_nowait(None))
        reader = asyncio.ensure_future(_read_host_client(request_iterator, host))
        try:
            await context.send_initial_metadata((ACCEPTED,))
            while (message := await outgoing.get()) is not None:
                yield message
            refusal = _refusal(reader)
            if refusal is not None:
                await _abort(context, refusal)
            exhausted = _exhausted(hosting)
            if exhausted is not None:  # no sandbox was free: the host never started
                await _abort(context, exhausted)
        finally:
            reader.cancel()
            if not hosting.done():
                host.kill()  # the caller went away: closing the stream retracts
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(hosting)


def _exhausted(task: asyncio.Future[Any]) -> CodemodeError | None:
    """RESOURCE_EXHAUSTED (with RetryInfo) when ``task`` found no sandbox free."""
    if not task.done() or task.cancelled():
        return None
    exc = task.exception()
    if not isinstance(exc, RuntimeExhaustedError):
        return None
    return resource_exhausted(
        "RUNTIME_AT_CAPACITY", str(exc), retry_delay=exc.retry_delay_s, resource="sandbox-uids"
    )


async def _first_start(requests: AsyncIterator[Any], context: Context, rpc: str) -> Any:
    """The `start` of a stream's first message (RunStart or HostStart), or None once the RPC is
    aborted: undecodable bytes are MALFORMED_MESSAGE, anything else START_REQUIRED."""
    first = await anext(aiter(requests), None)
    if isinstance(first, Malformed):
        await _abort(context, malformed_error(first))
        return None
    if first is None or first.WhichOneof("kind") != "start":
        message = f"the first {rpc} message must be a start message"
        await _abort(context, invalid_argument("START_REQUIRED", message))
        return None
    return first.start


def _service_contract(service: runtime_pb2.HostService) -> dict[str, object]:
    """A service of the owner's other plugins, in the worker's format."""
    return {"name": service.name, "methods": list(service.methods), "data": service.data_json}


def _host_response(event: HostEvent) -> runtime_pb2.HostResponse:
    if isinstance(event, HostServiceCallCancel):
        return runtime_pb2.HostResponse(
            service_call_cancel=runtime_pb2.HostServiceCallCancel(call_id=event.call_id)
        )
    if isinstance(event, HostServiceCall):
        return runtime_pb2.HostResponse(
            service_call=runtime_pb2.HostServiceCall(
                call_id=event.call_id,
                service=event.service,
                method=event.method,
                arguments_json=event.arguments_json,
            )
        )
    if isinstance(event, HostRegistrations):
        regs = runtime_pb2.HostRegistrations(
            tools=[
                runtime_pb2.DynamicTool(
                    name=tool.name,
                    description=tool.description,
                    input_schema_json=tool.input_schema_json,
                    output_schema_json=tool.output_schema_json,
                )
                for tool in event.tools
            ],
            handlers=event.handlers,
            provides=event.provides,
            waiting_for=event.waiting_for,
            services=[
                runtime_pb2.HostService(
                    name=service.name, methods=service.methods, data_json=service.data_json
                )
                for service in event.services
            ],
            events=event.events,
        )
        if event.changed:
            return runtime_pb2.HostResponse(changed=regs)
        return runtime_pb2.HostResponse(started=regs)
    if isinstance(event, HostFailed):
        failure = runtime_pb2.HostFailure(
            phase=event.phase, message=event.message, stack=event.stack
        )
        if event.phase == "host-lost":
            return runtime_pb2.HostResponse(lost=failure)
        return runtime_pb2.HostResponse(failed=failure)
    if isinstance(event, HostResult):
        result = runtime_pb2.HostInvokeResult(invocation_id=event.invocation_id)
        if event.value_json is not None:
            result.value_json = event.value_json
            result.presentation_meta_json = event.presentation_meta_json
        else:
            result.error_message = event.error_message
            result.error_stack = event.error_stack
            result.method_not_found = event.method_not_found
            result.cancelled = event.cancelled
        return runtime_pb2.HostResponse(result=result)
    if isinstance(event, HostLog):
        return runtime_pb2.HostResponse(log=runtime_pb2.LogLine(text=event.text))
    assert isinstance(event, HostRetracted)
    return runtime_pb2.HostResponse(retracted=runtime_pb2.HostRetracted())


async def _read_host_client(
    requests: AsyncIterator[runtime_pb2.HostRequest | Malformed], host: PluginHost
) -> CodemodeError | None:
    """Invocations, cancels and the retract to the host; any other message ends the host."""
    async for message in requests:
        if isinstance(message, Malformed):
            error = malformed_error(message)
        else:
            kind = message.WhichOneof("kind")
            if kind == "invoke":
                invoke = message.invoke
                host.invoke(
                    invoke.invocation_id,
                    invoke.tool_name,
                    invoke.arguments_json,
                    service=invoke.service,
                    event=invoke.event,
                    handler_method=invoke.handler_method,
                )
                continue
            if kind == "services":
                host.update_services([_service_contract(s) for s in message.services.services])
                continue
            if kind == "service_result":
                result = message.service_result
                value = result.value_json if result.WhichOneof("outcome") == "value_json" else None
                host.service_result(result.invocation_id, value, result.error_message)
                continue
            if kind == "cancel":
                host.cancel(message.cancel.invocation_id)
                continue
            if kind == "retract":
                await host.retract()
                return None
            what = "a second start message" if kind == "start" else "a message of no known kind"
            error = invalid_argument(
                "UNEXPECTED_MESSAGE",
                f"{what}: only invoke, cancel, services, service_result and retract may "
                "follow the start",
            )
        host.kill()
        return error
    # Half-closed by the caller: that retracts as well (cordis.md: closing from either side).
    await host.retract()
    return None


class _CallRelay:
    """Binding calls out as stream messages, client results back to the waiting run."""

    def __init__(
        self,
        outgoing: Outgoing,
        token: bytes,
        trace: trace_pb2.TraceContext,
        max_message_bytes: int | None = None,
    ) -> None:
        self._outgoing = outgoing
        self._token = token
        self._trace = trace
        self._pending: dict[int, PendingCall] = {}
        self._closed = False
        # Arguments that cannot fit in one stream message fail their call, not the stream.
        # Room is kept for the message's other fields: the token and trace context (as long
        # as the caller made them), the binding name (per call) and the framing.
        self._max_message_bytes = max_message_bytes
        self._max_arguments = None
        if max_message_bytes is not None:
            others = len(token) + utf8_len(trace.traceparent) + utf8_len(trace.tracestate)
            self._max_arguments = max_message_bytes - _FRAMING_BYTES - others

    def call(self, call: BindingCall) -> PendingCall:
        """Send the call on the stream; the client's result resolves the returned call (and
        so answers the worker) synchronously, from the stream reader."""
        pending = PendingCall()
        if self._closed:
            pending.resolve(BindingResult.failure(_HALF_CLOSED))
            return pending
        try:
            arguments = call.arguments_json
            if arguments is None:
                arguments = jsonvalue.dumps(call.arguments)
        except jsonvalue.JsonValueError:
            pending.resolve(BindingResult.failure("tool arguments must be lossless JSON"))
            return pending
        if self._max_arguments is not None:
            limit = max(self._max_arguments - utf8_len(call.name), 0)
            if utf8_exceeds(arguments, limit):
                pending.resolve(
                    BindingResult.failure(
                        f"binding arguments are too large to send: {utf8_len(arguments)} "
                        f"bytes of JSON, over the runtime's limit of {limit} bytes for this call "
                        f"(max_message_bytes {self._max_message_bytes}, less the binding name, "
                        "the run's token and trace context, and framing)"
                    )
                )
                return pending
        self._pending[call.seq] = pending
        self._outgoing.put_nowait(
            runtime_pb2.RunResponse(
                binding_call=runtime_pb2.BindingCall(
                    call_id=call.seq,
                    binding_name=call.name,
                    arguments_json=arguments,
                    token=self._token,
                    trace_context=self._trace,
                )
            )
        )
        return pending

    def close(self) -> None:
        """The client half-closed: no result can come, so waiting calls fail now (rather
        than at the wall-clock ceiling) and later ones at once."""
        self._closed = True
        pending, self._pending = self._pending, {}
        for call in pending.values():
            call.resolve(BindingResult.failure(_HALF_CLOSED))

    def resolve(self, result: runtime_pb2.CallResult) -> None:
        pending = self._pending.pop(result.call_id, None)
        if pending is None or pending.done:
            return  # unknown or already answered: each call is answered at most once
        outcome = result.WhichOneof("outcome")
        if outcome == "value_json":
            # Read by the run, or left for the worker to read (``Run._reply``).
            pending.resolve(BindingResult.success_json(result.value_json))
        elif outcome == "error_message":
            pending.resolve(BindingResult.failure(result.error_message))
        else:  # unset (or an outcome this runtime does not know): fail the call, saying so
            pending.resolve(BindingResult.failure(_NO_OUTCOME))


class _ClientMessages:
    """What the caller sends after the start: call results and cancels to the run. Any other
    message breaks the protocol: it aborts the run (unless it is already over) and is kept as
    `refusal`, to end the stream with; nothing is taken after it."""

    def __init__(self, run: Run, relay: _CallRelay) -> None:
        self._run = run
        self._relay = relay
        self.refusal: CodemodeError | None = None
        self._over = False

    def take(self, message: runtime_pb2.RunRequest | Malformed) -> bool:
        """Hands one message to the run; False once no more are taken."""
        if self._over:
            return False
        if isinstance(message, Malformed):
            error = malformed_error(message)
        else:
            kind = message.WhichOneof("kind")
            if kind == "call_result":
                self._relay.resolve(message.call_result)
                return True
            if kind == "cancel":
                self._run.abort(message.cancel.reason or _CANCELLED_REASON)
                return True
            what = "a second start message" if kind == "start" else "a message of no known kind"
            error = invalid_argument(
                "UNEXPECTED_MESSAGE", f"{what}: only call_result and cancel may follow the start"
            )
        self._over = True
        if not self._run.settled:  # else the outcome came first and stands
            self._run.abort(error.message)
            self.refusal = error
        return False

    def end(self) -> None:
        """The caller half-closed: no result can come for the calls still waiting."""
        if not self._over:
            self._over = True
            self._relay.close()


async def _read_client(
    requests: AsyncIterator[runtime_pb2.RunRequest | Malformed], messages: _ClientMessages
) -> None:
    """A `Run` stream's messages after the start, to the run until one breaks the protocol."""
    async for message in requests:
        if not messages.take(message):
            return
    messages.end()


def _refusal(reader: asyncio.Future[CodemodeError | None]) -> CodemodeError | None:
    """The protocol error a stream reader ended with, if any."""
    if not reader.done() or reader.cancelled() or reader.exception() is not None:
        return None
    return reader.result()


def _isolation_proto(isolation: Isolation) -> runtime_pb2.Isolation:
    return runtime_pb2.Isolation(
        mechanism=isolation.mechanism,
        enforced=isolation.enforced,
        not_enforced=isolation.not_enforced,
        mechanisms=[
            runtime_pb2.IsolationMechanism(
                name=item.name,
                enforced=item.enforced,
                scope=_SCOPES[item.scope],
                detail=item.detail,
            )
            for item in isolation.mechanisms
        ],
    )


def _budgets_proto(budgets: Budgets) -> runtime_pb2.RunBudgets:
    return runtime_pb2.RunBudgets(
        compute_ms=budgets.compute_ms,
        wall_ms=budgets.wall_ms,
        max_output_bytes=budgets.max_output_bytes,
        memory_bytes=budgets.memory_bytes,
        max_outstanding_calls=budgets.max_outstanding_calls,
    )


def _budgets_request(budgets: runtime_pb2.RunBudgets) -> dict[str, int | None]:
    requested: dict[str, int | None] = {name: getattr(budgets, name) for name in _BUDGET_FIELDS}
    requested["max_outstanding_calls"] = budgets.max_outstanding_calls
    return requested


def _deadline_ms(start: runtime_pb2.RunStart) -> int | None:
    if not start.HasField("timeout"):
        return None
    seconds, nanos = start.timeout.seconds, start.timeout.nanos
    if (
        abs(seconds) > _MAX_DURATION_S
        or abs(nanos) >= 1_000_000_000
        or (seconds < 0 < nanos)
        or (nanos < 0 < seconds)
    ):
        # protobuf would read such a value anyway (nanos=2e9 as two more seconds)
        raise RunRequestError(
            f"timeout is not a valid Duration (seconds {seconds}, nanos {nanos}): seconds "
            f"must be within +-{_MAX_DURATION_S}, nanos within +-999999999 with the same sign"
        )
    # Less than a millisecond left counts as none: the run times out without a worker.
    return start.timeout.ToMilliseconds()


def _fill_terminal(terminal: runtime_pb2.RunTerminal, result: RunResult) -> None:
    terminal.logs.extend(result.logs)
    if result.error is not None:
        terminal.failure.kind = _KINDS[result.error.kind]
        terminal.failure.message = result.error.message
    elif result.has_value:
        text = result.value_json
        terminal.success.value_json = jsonvalue.dumps(result.value) if text is None else text
    else:
        terminal.success.SetInParent()


async def _abort(context: Context, error: CodemodeError) -> None:
    await abort_rpc(context, error, DOMAIN)
