"""The registry's side of `RuntimeService.Run`: implements `RuntimePort` over gRPC.

Runs, plugin hosts and define-time source checks are spread over the configured runtime
targets in rotation, each going only to a target that serves its language
(`runtime_targets.py`: one channel per target). A target that may name several runtimes
(`dns:///name:port`, an address list) is, on the multiplexed channel, one target per runtime it
resolves to (`runtime_resolution.py`); with per-run streams its channel balances over them
(round_robin).

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
import functools
import itertools
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc import status_pb2
from grpc_status import rpc_status
from opentelemetry.trace import TracerProvider

from codemode_common.run_acceptance import accepted
from codemode_common.telemetry.interceptors import client_interceptors
from codemode_common.tls import ClientTls
from codemode_wire.api.common.v1 import trace_pb2
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.grpc_status import retry_delay
from registry_service.codemode.runtime_port import (
    BindingCall,
    RunEvent,
    RunLog,
    RunRefused,
    RunSpec,
    RunTerminal,
    RuntimeChannel,
    RuntimeExhausted,
    RuntimeLimits,
    RuntimeLost,
    RuntimeUnreachable,
)
from registry_service.domain.cordis.source_checks import CheckUnavailable, HalfKind, SourceProblem
from registry_service.runtime_mux import (
    PAST_DEADLINE,
    Incoming,
    Multiplexer,
    MuxRun,
    PastDeadline,
    StreamBroken,
)
from registry_service.runtime_resolution import ResolvedTarget, authority_of, listed_addresses
from registry_service.runtime_targets import (
    Choose,
    RuntimeTarget,
    first_connected,
    names_one_runtime,
)

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
# While no runtime of a target that may name several is connected, how often it is looked up
# again (its runtimes may have been replaced).
_RESOLVE_WAIT_S = 0.25


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
                event = _event(message)
                if event is not None:
                    if isinstance(event, RunTerminal):
                        self._done = True
                    yield event
                    if self._done:
                        return
        except grpc.aio.AioRpcError as exc:
            raise _call_failed(exc) from exc

    def reply(self, call_id: int, ok: bool, payload: str) -> None:
        self._send(_call_result(call_id, ok, payload))

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


class MuxRunStream:
    """One run on a target's multiplexed stream (`runtime_mux.py`): the same events, errors
    and outage contract as a `GrpcRunStream`. `deadline`: the loop time past which a runtime
    that has sent nothing more counts as lost (the run's timeout plus the grace)."""

    def __init__(
        self, run: MuxRun, deadline: float | None, first: pb.RunResponse | None = None
    ) -> None:
        self._run = run
        self._first = first
        self._done = False
        # One timer for the run, not one per event: at the deadline it queues `PAST_DEADLINE`
        # behind whatever the runtime has sent.
        self._timer = None
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_at(
                deadline, run.incoming.put_nowait, PAST_DEADLINE
            )

    async def events(self) -> AsyncIterator[RunEvent]:
        while True:
            item: Incoming
            if self._first is not None:
                item, self._first = self._first, None
            else:
                item = await self._run.incoming.get()
            if isinstance(item, PastDeadline):
                self._end()
                raise RuntimeLost(
                    "DEADLINE_EXCEEDED: the runtime sent nothing before the run's deadline"
                )
            if isinstance(item, pb.RunResponse):
                event = _event(item)
                if event is None:
                    continue
                if isinstance(event, RunTerminal):
                    self._end()
                yield event
                if self._done:
                    return
            elif isinstance(item, StreamBroken):
                self._end()
                if item.error is None:
                    raise RuntimeLost("the runtime closed the run without an outcome")
                raise _call_failed(item.error) from item.error
            elif isinstance(item, status_pb2.Status):
                self._end()
                raise _status_failed(item)

    def _end(self) -> None:
        self._done = True
        self._run.end()
        if self._timer is not None:
            self._timer.cancel()

    def reply(self, call_id: int, ok: bool, payload: str) -> None:
        if not self._done:
            self._run.send(_call_result(call_id, ok, payload))

    def cancel(self, reason: str) -> None:
        if not self._done:
            self._run.send(pb.RunRequest(cancel=pb.RunCancel(reason=reason)))

    async def close(self) -> None:
        if not self._done:
            # What cancelling a `Run` call does: the runtime aborts the run.
            self.cancel(_CLOSED_REASON)
        self._end()


def _call_result(call_id: int, ok: bool, payload: str) -> pb.RunRequest:
    result = (
        pb.CallResult(call_id=call_id, value_json=payload)
        if ok
        else pb.CallResult(call_id=call_id, error_message=payload)
    )
    return pb.RunRequest(call_result=result)


def _event(message: pb.RunResponse) -> RunEvent | None:
    """The event a run's message carries (None: a kind this registry does not know)."""
    kind = message.WhichOneof("kind")
    if kind == "binding_call":
        call = message.binding_call
        return BindingCall(
            call.call_id,
            call.binding_name,
            call.arguments_json,
            call.token,
            call.trace_context.traceparent,
            call.trace_context.tracestate,
        )
    if kind == "log":
        return RunLog(message.log.text)
    if kind == "terminal":
        return _terminal(message.terminal)
    return None


def _call_failed(exc: grpc.aio.AioRpcError) -> Exception:
    """What a run's failed call means: the runtime at capacity, an outage, or a refusal."""
    detail = f"{exc.code().name}: {exc.details()}"
    if exhausted := runtime_exhausted(exc):
        return exhausted
    if exc.code() is grpc.StatusCode.UNAVAILABLE or (
        exc.code() in _BROKEN_CONNECTION and not _from_the_runtime(exc)
    ):
        # The transport failed (the runtime died, its connection was cut): an outage.
        return RuntimeLost(detail)
    return RunRefused(detail)  # the runtime's own error, or a local one


def _status_failed(status: status_pb2.Status) -> Exception:
    """What a run's error status on a multiplexed stream means (always the runtime's own),
    exactly as `_call_failed` reads the same status ending a `Run` call."""
    code = _STATUS_CODES.get(status.code, grpc.StatusCode.UNKNOWN)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RuntimeExhausted(status.message or _AT_CAPACITY, retry_delay(status))
    detail = f"{code.name}: {status.message}"
    if code is grpc.StatusCode.UNAVAILABLE:
        return RuntimeLost(detail)
    return RunRefused(detail)


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
_AT_CAPACITY = "the code runtime is at capacity"
_CLOSED_REASON = "run cancelled by the caller"


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
    return RuntimeExhausted(exc.details() or _AT_CAPACITY, delay)


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
        channel: RuntimeChannel = "multiplexed",
    ) -> None:
        """`targets`: one channel each (`runtime_targets.py`: work goes to a target that
        serves its language). `tracer_provider`: adds gRPC client spans (None: no
        interceptor at all). `keepalive_s`: ping interval of every runtime connection (None:
        no pings). `tls`: TLS (mutual when it holds a client certificate) instead of
        plaintext. `start_timeout_s`: how long a run waits for a runtime to take it.
        `reconnect_backoff_max_s`: the longest pause between reconnection attempts.
        `channel`: every run to a runtime over its one `Multiplex` stream
        (`runtime_mux.py`; a target that may name several runtimes, `dns:///`, a stream to
        each one it resolves to), or a `Run` stream per run (deprecated)."""
        if not targets:
            raise ValueError("a gRPC runtime needs at least one target")
        interceptors = client_interceptors(tracer_provider) or None
        self._start_timeout = start_timeout_s
        options = channel_options(max_message_bytes, keepalive_s, reconnect_backoff_max_s)
        if tls is not None and tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        self._max_message_bytes = max_message_bytes
        self._multiplexed = channel == "multiplexed"
        self._addresses = tuple(targets)
        # A target that may name several runtimes is, on the multiplexed channel, resolved
        # to one target (channel, stream) per runtime (`runtime_resolution.py`), so that runs
        # balance over them: one stream over a balancing channel would pin every run to
        # whichever runtime it reached. Per-run streams balance on the one channel instead.
        self._fixed: dict[str, RuntimeTarget] = {}
        self._resolved: dict[str, ResolvedTarget] = {}
        for address in targets:
            if self._multiplexed and not names_one_runtime(address):
                listed_addresses(address)  # a malformed address list fails here, at start
                connect = functools.partial(
                    _backend, options=_backend_options(options, address, tls),
                    interceptors=interceptors, tls=tls,
                )  # fmt: skip
                self._resolved[address] = ResolvedTarget(address, connect)
            else:
                self._fixed[address] = RuntimeTarget(
                    address, _channel(address, options, interceptors, tls)
                )
        self._targets: tuple[RuntimeTarget, ...] = ()
        self._rebuild()
        self._turn = itertools.count()
        self._payload_limit = payload_limit(max_message_bytes)
        self._multiplexers: dict[RuntimeTarget, Multiplexer] = {}
        if self._multiplexed:
            self._multiplexers = {
                t: Multiplexer(t.stub, max_message_bytes) for t in self._fixed.values()
            }
        # Backends that went away with runs on them: closed once those have ended.
        self._draining: list[RuntimeTarget] = []
        # The lookup being applied, per target that may name several runtimes.
        self._applying: dict[ResolvedTarget, asyncio.Task[None]] = {}

    def _rebuild(self) -> None:
        """Every target runs go to, in configuration order (a resolved one's backends in its
        place)."""
        found: list[RuntimeTarget] = []
        for address in self._addresses:
            if (fixed := self._fixed.get(address)) is not None:
                found.append(fixed)
            else:
                found.extend(self._resolved[address].backends.values())
        self._targets = tuple(found)

    async def _resolve(self, deadline: float) -> None:
        """Resolves the targets that are due, in the background; one never resolved yet is
        waited for (up to `deadline`). Closes the runtimes that went away once idle."""
        loop = asyncio.get_running_loop()
        for resolved in self._resolved.values():
            if resolved.due():
                resolved.begin()
                task = loop.create_task(self._apply(resolved), context=contextvars.Context())
                self._applying[resolved] = task
                task.add_done_callback(functools.partial(self._applied, resolved))
            pending = self._applying.get(resolved)
            if not resolved.resolved and pending is not None:
                left = max(0.0, deadline - loop.time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(pending), left)
        if self._draining:
            await self._close_drained()

    def _applied(self, resolved: ResolvedTarget, task: asyncio.Task[None]) -> None:
        if self._applying.get(resolved) is task:
            del self._applying[resolved]

    async def _apply(self, resolved: ResolvedTarget) -> None:
        added, removed = await resolved.refresh()
        if not added and not removed:
            return
        for target in added:
            self._multiplexers[target] = Multiplexer(target.stub, self._max_message_bytes)
        for target in removed:
            self._multiplexers[target].retire()
            self._draining.append(target)
        self._rebuild()
        await self._close_drained()

    async def _close_drained(self) -> None:
        idle = [t for t in self._draining if self._multiplexers[t].idle()]
        self._draining = [t for t in self._draining if t not in idle]
        for target in idle:
            await self._multiplexers.pop(target).close()
            await target.close()

    def _backend_away(self, target: RuntimeTarget) -> None:
        """A resolved target's backend is not connected: look its target up again soon."""
        for resolved in self._resolved.values():
            if resolved.backends.get(target.address) is target:
                resolved.soon()

    def _unresolved(self) -> bool:
        """Whether a target that may name several runtimes has no backend now."""
        return any(not r.backends for r in self._resolved.values())

    async def limits(self) -> RuntimeLimits:
        """The runtime's limits, from its `GetCapabilities` (0 there means "not reported");
        with several targets, what every one of them that has answered allows."""
        known = [t.capabilities for t in self._targets if t.capabilities is not None]
        if not known:  # nothing known yet: a runtime must answer first
            loop = asyncio.get_running_loop()
            target = await self._connected(lambda _target: True, loop.time() + self._start_timeout)
            if target is None:
                raise RuntimeUnreachable(self._unreachable("none is connected"))
            try:
                known = [await target.read_capabilities()]
            except grpc.aio.AioRpcError as exc:
                why = f"reading its capabilities failed: {exc.code().name}: {exc.details()}"
                raise RuntimeUnreachable(self._unreachable(why)) from exc
        for target in self._targets:
            if target.connected():
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await target.read_capabilities()  # refreshes in the background once stale
        walls = [c.max_budgets.wall_ms for c in known if c.max_budgets.wall_ms]
        # Left to the runtime's default (64 MiB), a run's output could be more than our
        # max_message_bytes can carry on; so a run asks for what fits, unless the runtime
        # gives it less anyway (its default), and never above its maximum (that is refused).
        output = self._payload_limit
        for caps in known:
            for reported in (
                caps.default_budgets.max_output_bytes,
                caps.max_budgets.max_output_bytes,
            ):
                if reported:  # 0: not reported
                    output = min(output, reported)
        return RuntimeLimits(
            max_wall_s=min(walls) / 1000 if walls else None,
            max_output_bytes=output,
            max_payload_bytes=self._payload_limit,
        )

    def served_languages(self) -> tuple[str, ...] | None:
        """What the targets last reported serving, together; None before any has answered."""
        answers = [served for t in self._targets if (served := t.served()) is not None]
        if not answers:
            return None
        return tuple(dict.fromkeys(language for served in answers for language in served))

    async def learn_languages(self) -> None:
        """Ask every target now that has not answered yet (bounded by the start timeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_timeout
        await self._resolve(deadline)

        async def learn(target: RuntimeTarget) -> None:
            if await first_connected((target,), deadline, 0) is not None:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await target.read_capabilities()

        await asyncio.gather(*(learn(t) for t in self._targets if t.capabilities is None))

    async def _target(
        self, fits: Choose, deadline: float, what: str, work: str = "the run"
    ) -> RuntimeTarget:
        """The next connected target that can take the work (`fits`), in rotation; one not
        heard from yet is asked first. `RuntimeUnreachable` when none is connected by
        `deadline`; `RunRefused` when every target has answered and none takes it."""
        start = next(self._turn)
        while True:
            target = await self._connected(fits, deadline, start, what)
            if target is None:
                raise RuntimeUnreachable(
                    self._unreachable("none that serves it is connected", work)
                )
            if fits(target) is None:
                try:
                    await target.read_capabilities()
                except grpc.aio.AioRpcError as exc:
                    why = f"reading its capabilities failed: {exc.code().name}: {exc.details()}"
                    if asyncio.get_running_loop().time() >= deadline:
                        raise RuntimeUnreachable(self._unreachable(why, work)) from exc
                    await asyncio.sleep(_RETRY_PAUSE_S)
                continue  # now known: serves it or not
            return target

    async def _connected(
        self, fits: Choose, deadline: float, start: int = 0, what: str = ""
    ) -> RuntimeTarget | None:
        """The first connected target that may take the work (`fits` not False), in rotation
        from `start`, waiting for one until `deadline` (None then); meanwhile a target that
        may name several runtimes is looked up again whenever one of its runtimes is not
        connected, so that replaced runtimes are found. `RunRefused` when every target has
        answered and none takes the work."""
        loop = asyncio.get_running_loop()
        while True:
            await self._resolve(deadline)
            candidates = [t for t in self._targets if fits(t) is not False]
            if not candidates and not self._unresolved():
                served = self.served_languages() or ()
                raise RunRefused(
                    f"FAILED_PRECONDITION: no runtime target serves {what} "
                    f"(served: {', '.join(served) or 'none'})"
                )
            until = deadline if not self._resolved else min(deadline, loop.time() + _RESOLVE_WAIT_S)
            target = await first_connected(candidates, until, start) if candidates else None
            if self._resolved and candidates:
                first = candidates[start % len(candidates)]
                if target is not first:  # skipped: not connected
                    self._backend_away(first)
            if target is not None:
                return target
            if loop.time() >= deadline:
                return None
            if not candidates:  # nothing resolved yet: pause before looking again
                await asyncio.sleep(min(_RESOLVE_WAIT_S, max(0.0, deadline - loop.time())))

    async def open_run(self, spec: RunSpec) -> GrpcRunStream | MuxRunStream:
        loop = asyncio.get_running_loop()
        wait = (
            self._start_timeout if spec.timeout is None else min(self._start_timeout, spec.timeout)
        )
        deadline = loop.time() + wait
        ends = None if spec.timeout is None else loop.time() + spec.timeout
        pause = _RETRY_PAUSE_S
        fits = _serving(spec.language)
        refused = 0  # targets in a row that did not take the run
        while True:
            target = await self._target(fits, deadline, f"the {spec.language} language")
            # The time spent waiting for a runtime comes off the run's own.
            left = None if ends is None else max(0.0, ends - loop.time())
            timeout = None if left is None else left + _DEADLINE_GRACE_S
            start = _start_message(spec, left)
            taken: GrpcRunStream | MuxRunStream | str
            if (multiplexer := self._multiplexers.get(target)) is not None:
                taken = await _open_multiplexed(multiplexer, start, timeout)
            else:
                taken = await _open_per_run(target, start, timeout)
            if not isinstance(taken, str):
                return taken
            detail = taken
            self._backend_away(target)
            # Not taken: the connection failed first, or the runtime is shutting down. Nothing
            # ran; the next try goes to the next target in the rotation that is connected,
            # after a pause once every target has been tried.
            if loop.time() + pause >= deadline:
                raise RuntimeUnreachable(self._unreachable(detail))
            refused += 1
            if refused >= max(1, len(self._targets)):
                refused = 0
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_PAUSE_MAX_S)

    async def open_host(self, start: pb.HostStart) -> Any:
        """Open a plugin host's `Host` stream on a target that serves its language (waiting
        for a connected one like a run does) and send its start; returns the call.
        `RuntimeUnreachable` when none is connected."""
        loop = asyncio.get_running_loop()
        target = await self._target(
            _serving(start.language),
            loop.time() + self._start_timeout,
            f"the {start.language} language",
            "the plugin host",
        )
        call = target.stub.Host()
        await call.write(pb.HostRequest(start=start))
        return call

    async def check_source(
        self, language: str, kind: HalfKind, source: str
    ) -> tuple[SourceProblem, ...]:
        """`SourceChecks`: a Cordis half parsed in a sandboxed worker of a target that
        serves its language (a client half: one whose languages check JavaScript)."""
        loop = asyncio.get_running_loop()
        fits = RuntimeTarget.checks_client_halves if kind == "client" else _serving(language)
        what = "client half checks" if kind == "client" else f"the {language} language"
        try:
            target = await self._target(fits, loop.time() + self._start_timeout, what, "the check")
        except RunRefused as exc:
            raise CheckUnavailable(
                "language-not-served",
                f"no code runtime here checks {language or 'JavaScript'} ({exc})",
            ) from None
        except RuntimeUnreachable as exc:
            raise CheckUnavailable("runtime-unavailable", f"{exc}; try again") from None
        request = pb.CheckSourceRequest(language=language, kind=_HALF_KINDS[kind], source=source)
        try:
            response = await target.stub.CheckSource(request, timeout=_CHECK_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise _check_unavailable(exc, language or "JavaScript") from exc
        return tuple(SourceProblem(p.line, p.column, p.message, p.hint) for p in response.problems)

    def _unreachable(self, why: str, work: str = "the run") -> str:
        wait = f"{self._start_timeout:g} s"
        addresses = ", ".join(self._addresses)
        return f"no code runtime took {work} within {wait} ({addresses}: {why})"

    async def close(self) -> None:
        for resolved in self._resolved.values():
            resolved.cancel()
        for task in list(self._applying.values()):
            task.cancel()
        for multiplexer in self._multiplexers.values():
            await multiplexer.close()
        await asyncio.gather(*(t.close() for t in (*self._targets, *self._draining)))


async def _open_per_run(
    target: RuntimeTarget, start: pb.RunStart, lasts_s: float | None
) -> GrpcRunStream | str:
    """The run on a `Run` stream of its own once the runtime has taken it; or why it was not
    taken (the connection failed first, or the runtime is shutting down: nothing ran), as
    `open_run` tries the next target. `RunRefused` for any other refusal. `lasts_s`: the
    call's deadline from now (None: none)."""
    # Queued before the call opens: the start goes out as soon as the call has started.
    outbox: asyncio.Queue[pb.RunRequest | None] = asyncio.Queue()
    outbox.put_nowait(pb.RunRequest(start=start))
    call = target.stub.Run(_requests(outbox), timeout=lasts_s)
    try:
        metadata = await call.initial_metadata()
    except BaseException:
        call.cancel()  # our caller went away while the runtime was taking the run
        raise
    if accepted(metadata) or not call.done():
        # Taken (or a runtime that does not say so has begun to answer): from here a lost
        # connection is a lost run.
        return GrpcRunStream(call, outbox)
    code = await call.code()
    detail = f"{code.name}: {await call.details()}"
    if code is not grpc.StatusCode.UNAVAILABLE:
        raise RunRefused(detail)
    return detail


async def _open_multiplexed(
    multiplexer: Multiplexer, start: pb.RunStart, lasts_s: float | None
) -> MuxRunStream | str:
    """The run on the target's multiplexed stream once the runtime has taken it; or, when it
    was not taken because the stream failed first or the runtime is shutting down (nothing
    ran), why, as `open_run` tries the next target. `RunRefused` for any other refusal.
    `lasts_s`: the run's deadline from now (its timeout plus the grace; None: none)."""
    loop = asyncio.get_running_loop()
    ends = None if lasts_s is None else loop.time() + lasts_s
    run = multiplexer.open(start)
    try:
        async with asyncio.timeout_at(ends):
            first = await run.incoming.get()
    except BaseException:
        # Our caller went away (or the runtime hung) while the runtime was taking the run.
        run.send(pb.RunRequest(cancel=pb.RunCancel(reason=_CLOSED_REASON)))
        run.end()
        raise
    if first is True:
        return MuxRunStream(run, ends)
    if isinstance(first, pb.RunResponse):  # a runtime that does not say so has begun to answer
        return MuxRunStream(run, ends, first)
    run.end()
    if isinstance(first, StreamBroken):
        error = first.error
        if error is None:
            return "UNAVAILABLE: the runtime's stream ended"
        if error.code() is not grpc.StatusCode.UNAVAILABLE:
            raise RunRefused(f"{error.code().name}: {error.details()}")
        return f"UNAVAILABLE: {error.details()}"
    if isinstance(first, status_pb2.Status):
        failed = _status_failed(first)
        if isinstance(failed, RuntimeLost):  # the runtime's UNAVAILABLE: it is shutting down
            return str(failed)
        raise failed
    raise RunRefused("UNKNOWN: the runtime answered the run's start with nothing known")


def _serving(language: str) -> Choose:
    """Targets that serve `language` ("": the runtime's default, which every one serves)."""
    if not language:
        return lambda _target: True
    return lambda target: target.serves(language)


def _backend_options(
    options: list[tuple[str, str | int]], target: str, tls: ClientTls | None
) -> list[tuple[str, str | int]]:
    """The channel arguments of a backend of `target`: a `dns:` name's backends present the
    name (`:authority`, and the name TLS checks the certificate for), as its channel did."""
    authority = authority_of(target)
    if authority is None:
        return options
    backend = [*options, ("grpc.default_authority", authority)]
    if tls is not None and not tls.server_name:
        backend.append(("grpc.ssl_target_name_override", authority.rpartition(":")[0]))
    return backend


def _backend(
    address: str,
    *,
    options: list[tuple[str, str | int]],
    interceptors: Any,
    tls: ClientTls | None,
) -> RuntimeTarget:
    return RuntimeTarget(address, _channel(address, options, interceptors, tls))


def _channel(
    address: str,
    options: list[tuple[str, str | int]],
    interceptors: Any,
    tls: ClientTls | None,
) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    credentials = grpc.ssl_channel_credentials(tls.root_ca, tls.private_key, tls.certificate_chain)
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


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
        tenant=spec.tenant,
        trace_context=trace_pb2.TraceContext(
            traceparent=spec.traceparent, tracestate=spec.tracestate
        ),
    )
    if timeout is not None:
        remaining = Duration()
        remaining.FromNanoseconds(int(max(0.0, timeout) * 1e9))
        start.timeout.CopyFrom(remaining)
    return start
