"""The registry's side of `RuntimeService.Run`: implements `RuntimePort` over gRPC.

Runs are spread over the configured runtime targets by gRPC client-side load balancing
(round_robin over an address list, or over DNS records with `dns:///name:port`).

Outages: a run waits up to the start timeout for a runtime to be connected and to accept it,
trying again (on the next runtime in the rotation) whenever a runtime is unreachable or refuses
the run because it is shutting down; only then is the runtime unreachable. A runtime says it
has taken a run with its initial metadata (`codemode_common.run_acceptance`): a connection lost
before that cost nothing, one lost after it may have cost a partial run. Reconnect backoff is
kept short, so a restarted runtime is connected again well inside the start timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from grpc_status import rpc_status
from opentelemetry.trace import TracerProvider

from codemode_common.run_acceptance import accepted
from codemode_common.telemetry.interceptors import client_interceptors
from codemode_common.tls import ClientTls
from codemode_wire.api.common.v1 import trace_pb2
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc as pb_grpc
from codemode_wire.grpc_status import retry_delay
from registry_service.codemode.runtime_port import (
    BindingCall,
    RunEvent,
    RunLog,
    RunRefused,
    RunSpec,
    RunTerminal,
    RuntimeExhausted,
    RuntimeLimits,
    RuntimeLost,
    RuntimeUnreachable,
)
from registry_service.domain.cordis.source_checks import CheckUnavailable, HalfKind, SourceProblem

log = logging.getLogger(__name__)

# Names of pb.FailureKind values, as the bridge reports them in `code run failed (<kind>)`.
_KINDS = {
    pb.FAILURE_KIND_EXCEPTION: "exception",
    pb.FAILURE_KIND_TIMEOUT: "timeout",
    pb.FAILURE_KIND_ABORT: "abort",
    pb.FAILURE_KIND_WORKER_EXIT: "worker-exit",
    pb.FAILURE_KIND_INVALID_OUTPUT: "invalid-output",
    pb.FAILURE_KIND_OUTPUT_LIMIT: "output-limit",
}
# A run's RPC deadline is its own timeout plus this grace, so a hung runtime cannot hang us.
_DEADLINE_GRACE_S = 5.0
# After the terminal, how long `close` waits for the RPC's end (so its client span ends cleanly).
_CLOSE_DRAIN_S = 1.0
# How long a keepalive ping may go unanswered before its connection counts as dead.
_KEEPALIVE_TIMEOUT_MS = 10_000
# The runtime's capabilities (its limits) are read once, then refreshed in the background at
# most this often, so a redeployed runtime's new limits are picked up without a per-run cost.
_CAPABILITIES_REFRESH_S = 60.0
_CAPABILITIES_TIMEOUT_S = 10.0
# A source check takes at most 10 s of the runtime's own wall budget, plus a worker's start.
_CHECK_TIMEOUT_S = 30.0
_HALF_KINDS = {"host": pb.SOURCE_KIND_HOST_HALF, "client": pb.SOURCE_KIND_CLIENT_HALF}
# Reconnecting to a runtime that went away: the first attempt this soon, then growing (gRPC's
# 1.6x with 20 % jitter) up to the configured maximum; gRPC's own defaults (1 s up to 120 s)
# left a restarted runtime unused for 10-25 s.
_INITIAL_RECONNECT_BACKOFF_MS = 100
# gRPC core reads `grpc.min_reconnect_backoff_ms` as the shortest time it gives one connection
# attempt (default 20 s): a runtime host that drops SYNs is given up on, and tried again, after
# this instead.
_MIN_CONNECT_TIMEOUT_MS = 1000
DEFAULT_RECONNECT_BACKOFF_MAX_S = 0.5
DEFAULT_START_TIMEOUT_S = 1.0
# Between two tries of a run that a connected runtime refused (it is shutting down), so a lone
# draining runtime is not hammered: the pause starts here and doubles up to the cap.
_RETRY_PAUSE_S = 0.02
_RETRY_PAUSE_MAX_S = 0.2


def channel_target(targets: list[str]) -> str:
    """One gRPC target for a list of runtime addresses (`host:port` or a full target URI)."""
    if len(targets) == 1:
        return targets[0]
    return "ipv4:" + ",".join(targets)


def payload_limit(max_message_bytes: int) -> int:
    """The largest JSON text (a run's output, a binding call's arguments, a call's value) whose
    message still fits in `max_message_bytes`.

    The headroom covers the rest of the message. A run's output is measured by the runtime's
    ledger as JSON (each log entry its JSON-string size plus a comma), which is never smaller
    than the entry's protobuf framing except for entries of 16 KiB or more, whose length
    prefix can be up to 2 bytes longer: at most `max_message_bytes / 8192` bytes in all,
    plus a few dozen bytes of fixed framing. Twice that, plus 1 KiB, is ample.
    """
    return max_message_bytes - (1024 + max_message_bytes // 4096)


def channel_options(
    max_message_bytes: int,
    keepalive_s: float | None = None,
    reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
) -> list[tuple[str, str | int]]:
    """The runtime channel's arguments."""
    backoff_max_ms = max(1, math.ceil(reconnect_backoff_max_s * 1000))
    options: list[tuple[str, str | int]] = [
        ("grpc.lb_policy_name", "round_robin"),
        ("grpc.initial_reconnect_backoff_ms", min(_INITIAL_RECONNECT_BACKOFF_MS, backoff_max_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_max_ms),
        ("grpc.min_reconnect_backoff_ms", _MIN_CONNECT_TIMEOUT_MS),
        # No receive limit of our own: a runtime sends nothing larger than its own
        # max_message_bytes allows; a run's output is held within our limit by the output
        # budget we ask for; and a binding call too large to forward must still arrive, so
        # that the bridge refuses that one call (the program sees a ToolCallError) instead
        # of the oversized message failing the whole run.
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    if keepalive_s is not None:
        # A runtime that vanished without closing its connections (node lost, network cut)
        # fails its runs and leaves the round_robin rotation after one unanswered ping,
        # instead of at TCP timeout. Idle connections are pinged too, so no run is ever
        # sent to a dead one; any number of pings may go out between runs' messages.
        options += [
            ("grpc.keepalive_time_ms", max(1, math.ceil(keepalive_s * 1000))),
            ("grpc.keepalive_timeout_ms", _KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    return options


class GrpcRunStream:
    """One run's stream. Outgoing messages (the start, call results, a cancel) go through
    `outbox` to the request iterator the call was opened with: answering a binding call is a
    synchronous enqueue, so no task is needed per nested call, and an intercepted (traced)
    channel does not proxy every `write` through its own queue, task and `asyncio.wait`."""

    def __init__(self, call: Any, outbox: asyncio.Queue[pb.RunRequest | None]) -> None:
        self._call = call
        self._outbox = outbox
        self._done = False

    def _send(self, message: pb.RunRequest) -> None:
        if not self._done:
            self._outbox.put_nowait(message)

    async def events(self) -> AsyncIterator[RunEvent]:
        try:
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    raise RuntimeLost("the runtime closed the run without an outcome")
                kind = message.WhichOneof("kind")
                if kind == "binding_call":
                    call = message.binding_call
                    yield BindingCall(
                        call.call_id,
                        call.binding_name,
                        call.arguments_json,
                        call.token,
                        call.trace_context.traceparent,
                        call.trace_context.tracestate,
                    )
                elif kind == "log":
                    yield RunLog(message.log.text)
                elif kind == "terminal":
                    self._done = True
                    yield _terminal(message.terminal)
                    return
        except grpc.aio.AioRpcError as exc:
            detail = f"{exc.code().name}: {exc.details()}"
            if exhausted := runtime_exhausted(exc):
                raise exhausted from exc
            if exc.code() is grpc.StatusCode.UNAVAILABLE or (
                exc.code() in _BROKEN_CONNECTION and not _from_the_runtime(exc)
            ):
                # The transport failed (the runtime died, its connection was cut): an outage.
                raise RuntimeLost(detail) from exc
            raise RunRefused(detail) from exc  # the runtime's own error, or a local one

    def reply(self, call_id: int, ok: bool, payload: str) -> None:
        result = (
            pb.CallResult(call_id=call_id, value_json=payload)
            if ok
            else pb.CallResult(call_id=call_id, error_message=payload)
        )
        self._send(pb.RunRequest(call_result=result))

    def cancel(self, reason: str) -> None:
        self._send(pb.RunRequest(cancel=pb.RunCancel(reason=reason)))

    async def close(self) -> None:
        if self._done:
            # The runtime ends the RPC right after the terminal: half-close and read its
            # end-of-stream, so the call (and its transport span, when traced) completes
            # rather than being cancelled.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_DRAIN_S):
                    self._outbox.put_nowait(None)
                    await self._call.read()
        self._done = True
        self._outbox.put_nowait(None)
        self._call.cancel()


async def _requests(outbox: asyncio.Queue[pb.RunRequest | None]) -> AsyncIterator[pb.RunRequest]:
    while (message := await outbox.get()) is not None:
        yield message


# Besides UNAVAILABLE, the codes gRPC gives a call whose connection broke (a reset stream, a
# hung runtime past the run's deadline) when no service set them.
_BROKEN_CONNECTION = frozenset(
    {
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)


def runtime_exhausted(exc: grpc.aio.AioRpcError) -> RuntimeExhausted | None:
    """The runtime's RESOURCE_EXHAUSTED (no sandbox free: nothing ran), with its RetryInfo."""
    if exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED or not _from_the_runtime(exc):
        return None
    status = rpc_status.from_call(exc)
    delay = retry_delay(status) if status is not None else None
    return RuntimeExhausted(exc.details() or "the code runtime is at capacity", delay)


def _from_the_runtime(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a failed call's status was set by the runtime (it carries a rich status, as
    every error a service raises does), rather than by the transport."""
    return any(key == "grpc-status-details-bin" for key, _ in exc.trailing_metadata() or ())


def _terminal(message: pb.RunTerminal) -> RunTerminal:
    logs = tuple(message.logs)
    if message.WhichOneof("outcome") == "failure":
        kind = _KINDS.get(message.failure.kind, "worker-exit")
        return RunTerminal(logs=logs, kind=kind, message=message.failure.message)
    value = message.success.value_json if message.success.HasField("value_json") else None
    return RunTerminal(logs=logs, value_json=value)


class GrpcRuntime:
    def __init__(
        self,
        targets: list[str],
        max_message_bytes: int,
        *,
        tracer_provider: TracerProvider | None = None,
        keepalive_s: float | None = None,
        tls: ClientTls | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S,
    ) -> None:
        """`tracer_provider`: adds gRPC client spans (None: no interceptor at all).
        `keepalive_s`: ping interval of every runtime connection (None: no pings).
        `tls`: TLS (mutual when it holds a client certificate) instead of plaintext.
        `start_timeout_s`: how long a run waits for a runtime to take it.
        `reconnect_backoff_max_s`: the longest pause between reconnection attempts."""
        interceptors = client_interceptors(tracer_provider) or None
        target = channel_target(targets)
        self._targets = ", ".join(targets)
        self._start_timeout = start_timeout_s
        options = channel_options(max_message_bytes, keepalive_s, reconnect_backoff_max_s)
        if tls is None:
            self._channel = grpc.aio.insecure_channel(
                target, options=options, interceptors=interceptors
            )
        else:
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            credentials = grpc.ssl_channel_credentials(
                tls.root_ca, tls.private_key, tls.certificate_chain
            )
            self._channel = grpc.aio.secure_channel(
                target, credentials, options=options, interceptors=interceptors
            )
        self._stub = pb_grpc.RuntimeServiceStub(self._channel)
        self._payload_limit = payload_limit(max_message_bytes)
        self._capabilities: pb.GetCapabilitiesResponse | None = None
        self._capabilities_at = 0.0
        self._fetching: asyncio.Task[pb.GetCapabilitiesResponse] | None = None

    async def limits(self) -> RuntimeLimits:
        """The runtime's limits, from its `GetCapabilities` (0 there means "not reported")."""
        if self._capabilities is None:  # nothing known yet: a runtime must answer first
            await self._wait_connected(asyncio.get_running_loop().time() + self._start_timeout)
        caps = await self._read_capabilities()
        wall_ms = caps.max_budgets.wall_ms
        # Left to the runtime's default (64 MiB), a run's output could be more than our
        # max_message_bytes can carry on; so a run asks for what fits, unless the runtime
        # gives it less anyway (its default), and never above its maximum (that is refused).
        output = self._payload_limit
        for known in (caps.default_budgets.max_output_bytes, caps.max_budgets.max_output_bytes):
            if known:  # 0: not reported
                output = min(output, known)
        return RuntimeLimits(
            max_wall_s=wall_ms / 1000 if wall_ms else None,
            max_output_bytes=output,
            max_payload_bytes=self._payload_limit,
        )

    def served_languages(self) -> tuple[str, ...] | None:
        """What the runtime last reported serving; None before it has answered."""
        caps = self._capabilities
        if caps is None:
            return None
        if caps.language_capabilities:
            return tuple(e.name for e in caps.language_capabilities if e.served)
        return tuple(caps.languages)  # a runtime from before per-language entries

    async def learn_languages(self) -> None:
        """Ask the runtime now when it has not answered yet (bounded by the start timeout)."""
        with contextlib.suppress(Exception):
            await self.limits()

    async def _read_capabilities(self) -> pb.GetCapabilitiesResponse:
        stale = time.monotonic() - self._capabilities_at > _CAPABILITIES_REFRESH_S
        if self._capabilities is not None and not stale:
            return self._capabilities
        if self._fetching is None:
            self._capabilities_at = time.monotonic()  # one attempt per period, even a failed one
            # In an empty context: the read belongs to no run's trace (it serves them all), and
            # a cancelled run does not cancel it for the others waiting on it.
            self._fetching = asyncio.get_running_loop().create_task(
                self._get_capabilities(), context=contextvars.Context()
            )
            self._fetching.add_done_callback(self._fetched)
        if self._capabilities is not None:
            return self._capabilities  # refreshing in the background
        try:
            return await asyncio.shield(self._fetching)
        except grpc.aio.AioRpcError as exc:
            why = f"reading its capabilities failed: {exc.code().name}: {exc.details()}"
            raise RuntimeUnreachable(self._unreachable(why)) from exc

    async def _get_capabilities(self) -> pb.GetCapabilitiesResponse:
        request = pb.GetCapabilitiesRequest()
        response: pb.GetCapabilitiesResponse = await self._stub.GetCapabilities(
            request, timeout=_CAPABILITIES_TIMEOUT_S
        )
        return response

    def _fetched(self, task: asyncio.Task[pb.GetCapabilitiesResponse]) -> None:
        self._fetching = None
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            if self._capabilities is None:
                self._capabilities_at = 0.0  # nothing known yet: the next run asks again
            log.warning("reading the runtime's capabilities failed: %s", exc)
            return
        self._capabilities = task.result()

    async def open_run(self, spec: RunSpec) -> GrpcRunStream:
        loop = asyncio.get_running_loop()
        wait = (
            self._start_timeout if spec.timeout is None else min(self._start_timeout, spec.timeout)
        )
        deadline = loop.time() + wait
        ends = None if spec.timeout is None else loop.time() + spec.timeout
        pause = _RETRY_PAUSE_S
        while True:
            await self._wait_connected(deadline)
            # The time spent waiting for a runtime comes off the run's own.
            left = None if ends is None else max(0.0, ends - loop.time())
            timeout = None if left is None else left + _DEADLINE_GRACE_S
            # Queued before the call opens: the start goes out as soon as the call has started.
            outbox: asyncio.Queue[pb.RunRequest | None] = asyncio.Queue()
            outbox.put_nowait(pb.RunRequest(start=_start_message(spec, left)))
            # Still not connected at the deadline, the call fails at once (nothing is sent),
            # with gRPC's account of the last connection failure.
            call = self._stub.Run(_requests(outbox), timeout=timeout)
            try:
                metadata = await call.initial_metadata()
            except BaseException:
                call.cancel()  # our caller went away while the runtime was taking the run
                raise
            if accepted(metadata) or not call.done():
                # Taken (or a runtime that does not say so has begun to answer): from here a
                # lost connection is a lost run.
                return GrpcRunStream(call, outbox)
            code = await call.code()
            detail = f"{code.name}: {await call.details()}"
            if code is not grpc.StatusCode.UNAVAILABLE:
                raise RunRefused(detail)
            # Not taken: the connection failed first, or the runtime is shutting down. Nothing
            # ran; the next try goes to the next runtime in the rotation that is connected.
            if loop.time() + pause >= deadline:
                raise RuntimeUnreachable(self._unreachable(detail))
            await asyncio.sleep(pause)
            pause = min(pause * 2, _RETRY_PAUSE_MAX_S)

    async def _wait_connected(self, deadline: float) -> None:
        """Returns once the channel has a connected runtime, or at `deadline`. Waiting, not
        failing at once, is what lets a run use a runtime that is restarting (the channel
        reconnects within its reconnect backoff)."""
        loop = asyncio.get_running_loop()
        state = self._channel.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.READY:
            if state is grpc.ChannelConnectivity.SHUTDOWN:
                raise RuntimeUnreachable("the registry is closing its runtime channel")
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._channel.wait_for_state_change(state)
            state = self._channel.get_state(try_to_connect=True)

    async def open_host(self, start: pb.HostStart) -> Any:
        """Open a plugin host's `Host` stream (waiting for a connected runtime like a run
        does) and send its start; returns the call. `RuntimeUnreachable` when none is."""
        loop = asyncio.get_running_loop()
        await self._wait_connected(loop.time() + self._start_timeout)
        if self._channel.get_state() is not grpc.ChannelConnectivity.READY:
            raise RuntimeUnreachable(self._unreachable("not connected"))
        call = self._stub.Host()
        await call.write(pb.HostRequest(start=start))
        return call

    async def check_source(
        self, language: str, kind: HalfKind, source: str
    ) -> tuple[SourceProblem, ...]:
        """`SourceChecks`: a Cordis half parsed in a runtime's sandboxed worker (waiting for a
        connected runtime as a run does)."""
        loop = asyncio.get_running_loop()
        await self._wait_connected(loop.time() + self._start_timeout)
        request = pb.CheckSourceRequest(language=language, kind=_HALF_KINDS[kind], source=source)
        try:
            response = await self._stub.CheckSource(request, timeout=_CHECK_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise _check_unavailable(exc, language or "JavaScript") from exc
        return tuple(SourceProblem(p.line, p.column, p.message, p.hint) for p in response.problems)

    def _unreachable(self, why: str) -> str:
        wait = f"{self._start_timeout:g} s"
        return f"no code runtime took the run within {wait} ({self._targets}: {why})"

    async def close(self) -> None:
        if self._fetching is not None:
            self._fetching.cancel()
        await self._channel.close()


def _check_unavailable(exc: grpc.aio.AioRpcError, language: str) -> CheckUnavailable:
    code, detail = exc.code(), exc.details() or ""
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        return CheckUnavailable(
            "language-not-served", f"no code runtime here checks {language} ({detail})"
        )
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return CheckUnavailable(
            "resource-exhausted", f"the code runtime is at capacity ({detail}); try again"
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return CheckUnavailable(
            "runtime-unavailable", f"no code runtime answered ({code.name}: {detail}); try again"
        )
    return CheckUnavailable(
        "check-failed", f"the code runtime refused the check ({code.name}: {detail})"
    )


def _start_message(spec: RunSpec, timeout: float | None) -> pb.RunStart:
    """The run's start message; `timeout`: the time the run has left when it is sent."""
    start = pb.RunStart(
        program=spec.program,
        language=spec.language,
        binding_names=list(spec.binding_names),
        token=spec.token,
        budgets=pb.RunBudgets(max_output_bytes=spec.max_output_bytes or 0),
        trace_context=trace_pb2.TraceContext(
            traceparent=spec.traceparent, tracestate=spec.tracestate
        ),
    )
    if timeout is not None:
        remaining = Duration()
        remaining.FromNanoseconds(int(max(0.0, timeout) * 1e9))
        start.timeout.CopyFrom(remaining)
    return start
