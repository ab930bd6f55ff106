"""The long-lived bidi streams: tool providers (Connect) and approvers (Approve).

Each stream runs a reader task over the client's messages and yields from one outgoing queue,
so replies to the client (acks) and work pushed by the domain (invocations, approval requests)
interleave in order. The domain session is closed in `finally`, whatever ended the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeAlias, TypeVar

from google.protobuf.duration_pb2 import Duration

from codemode_common.request_parsing import Malformed, malformed_error
from codemode_wire.api.common.v1 import trace_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.errors import CodemodeError, invalid_argument
from codemode_wire.grpc_status import ok_status_proto, to_status_proto
from registry_service import convert
from registry_service._errors import DOMAIN, abort
from registry_service.domain.json_admission import off_loop
from registry_service.domain.providers import CancellationMessage, ProviderMessage
from registry_service.domain.results import error_result
from registry_service.registry import Registry

log = logging.getLogger(__name__)

# grpc is untyped (see pyproject); the alias documents intent.
Context: TypeAlias = Any
Out = TypeVar("Out")
_END = object()


async def _duplex(
    reader: Callable[[asyncio.Queue[Any]], Coroutine[Any, Any, None]],
    pump: Callable[[asyncio.Queue[Any]], Coroutine[Any, Any, None]] | None,
    out: asyncio.Queue[Any],
) -> AsyncIterator[Any]:
    """Runs `reader` (and `pump`, if any) feeding `out`; yields until the reader ends."""

    async def read_then_end() -> None:
        try:
            await reader(out)
        finally:
            out.put_nowait(_END)

    tasks = [asyncio.create_task(read_then_end())]
    if pump is not None:
        tasks.append(asyncio.create_task(pump(out)))
    try:
        while (item := await out.get()) is not _END:
            if isinstance(item, CodemodeError):
                raise item
            yield item
        tasks[0].result()  # surface a reader failure (CodemodeError) to the caller
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class OpenStreams:
    """The outgoing queues of the open provider and approver streams, so that a shutting-down
    registry can end them (they never end on their own and would hold the server to its
    grace period)."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[Any]] = set()
        self._closing: CodemodeError | None = None

    @contextlib.contextmanager
    def track(self, queue: asyncio.Queue[Any]) -> Iterator[None]:
        if self._closing is not None:
            queue.put_nowait(self._closing)
        self._queues.add(queue)
        try:
            yield
        finally:
            self._queues.discard(queue)

    def end_all(self, error: CodemodeError) -> None:
        """Each stream ends with `error` once it has sent what was queued before it."""
        self._closing = error
        for queue in self._queues:
            queue.put_nowait(error)


async def _first(requests: AsyncIterator[Any], field: str, what: str) -> Any:
    try:
        first = await anext(requests)
    except StopAsyncIteration:
        raise invalid_argument(
            "STREAM_NOT_OPENED", f"the {what} stream ended before `{field}`"
        ) from None
    if isinstance(first, Malformed):
        raise malformed_error(first)
    if first.WhichOneof("message") != field:
        raise invalid_argument("STREAM_NOT_OPENED", f"the first {what} message must be `{field}`")
    return getattr(first, field)


# -- providers ------------------------------------------------------------------------------


def _provider_message(message: ProviderMessage) -> rpb.ConnectResponse:
    if isinstance(message, CancellationMessage):
        return rpb.ConnectResponse(
            cancelled=rpb.InvocationCancelled(
                invocation_id=message.invocation_id, reason=message.reason
            )
        )
    inv = message.invocation
    invocation = rpb.Invocation(
        invocation_id=message.invocation_id,
        call_id=inv.call_id,
        root_call_id=inv.root_call_id,
        agent=inv.agent or "",
        tool_name=inv.tool_name,
        arguments_json=inv.arguments_json,
        trace_context=trace_pb2.TraceContext(
            traceparent=inv.traceparent, tracestate=inv.tracestate
        ),
    )
    if message.timeout is not None:
        timeout = Duration()
        timeout.FromNanoseconds(int(message.timeout * 1e9))
        invocation.timeout.CopyFrom(timeout)
    return rpb.ConnectResponse(invocation=invocation)


async def provider_stream(
    registry: Registry,
    requests: AsyncIterator[rpb.ConnectRequest],
    context: Context,
    streams: OpenStreams,
    may_register: Callable[[str], None] = lambda _scope: None,
) -> AsyncIterator[rpb.ConnectResponse]:
    """`may_register(scope)` raises CodemodeError when this stream's principal may not
    register into `scope`: that registration is refused in its ack, the stream goes on."""
    try:
        opened = await _first(requests, "open", "provider")
    except CodemodeError as error:
        await abort(context, error)
        return
    session = registry.providers.open(
        opened.provider_name or "provider", opened.max_receive_message_bytes
    )
    limits = registry.settings.json_limits()

    # The session's outbox is the stream's only outgoing queue (invocations, cancellations,
    # and the acks the reader adds): one hand-off per message on the hot path.
    async def reader(out: asyncio.Queue[Any]) -> None:
        async for message in requests:
            if isinstance(message, Malformed):
                out.put_nowait(malformed_error(message))
                return
            kind = message.WhichOneof("message")
            if kind == "register":
                # An agent made on another replica a moment ago is known here first.
                await registry.catalog.hear_of(message.register.scope)
                out.put_nowait(_register(session, message.register, may_register))
            elif kind == "result":
                returned = message.result.result
                try:
                    # Bounded in depth like arguments; a large one is decoded off the loop (this
                    # provider's next messages wait, in order).
                    result = await off_loop(
                        limits,
                        returned.ByteSize(),
                        convert.result_from_proto,
                        returned,
                        max_depth=limits.max_depth,
                    )
                except CodemodeError as error:
                    result = error_result(
                        f"tool provider returned an invalid result: {error.message}",
                        "INVALID_TOOL_OUTPUT",
                    )
                session.resolve(message.result.invocation_id, result)
            else:
                out.put_nowait(
                    invalid_argument("UNEXPECTED_MESSAGE", f"unexpected provider message `{kind}`")
                )
                return

    try:
        yield rpb.ConnectResponse(opened=rpb.ProviderOpened(provider_id=session.provider_id))
        with streams.track(session.outbox):
            async for item in _duplex(reader, None, session.outbox):
                if isinstance(item, rpb.ConnectResponse):
                    yield item
                    continue
                message = _provider_message(item)
                # An invocation the provider cannot receive would end its stream there.
                if isinstance(item, CancellationMessage) or session.deliverable(
                    item.invocation_id, message.ByteSize()
                ):
                    yield message
    except CodemodeError as error:
        await abort(context, error)
    finally:
        registry.providers.close(session)


def _register(
    session: Any, message: rpb.RegisterTools, may_register: Callable[[str], None]
) -> rpb.ConnectResponse:
    try:
        may_register(message.scope)
        specs = [convert.tool_spec_from_proto(tool) for tool in message.tools]
        session.register(message.scope, specs)
        status = ok_status_proto()
    except CodemodeError as error:
        status = to_status_proto(error, DOMAIN)
    return rpb.ConnectResponse(
        registered=rpb.RegistrationAck(request_id=message.request_id, status=status)
    )


# -- approvers ------------------------------------------------------------------------------


async def approver_stream(
    registry: Registry,
    requests: AsyncIterator[rpb.ApproveRequest],
    context: Context,
    streams: OpenStreams,
    may_approve: Callable[[str], bool] = lambda _agent: True,
) -> AsyncIterator[rpb.ApproveResponse]:
    """`may_approve(agent)`: whether this stream's principal may see and answer that agent's
    requests; others are never sent, and answers to them are ignored like late ones."""
    try:
        opened = await _first(requests, "open", "approver")
    except CodemodeError as error:
        await abort(context, error)
        return
    session = registry.approvals.connect(
        opened.approver_name or "approver", may_approve, opened.max_receive_message_bytes
    )

    async def reader(out: asyncio.Queue[Any]) -> None:
        async for message in requests:
            if isinstance(message, Malformed):
                out.put_nowait(malformed_error(message))
                return
            if message.WhichOneof("message") != "decision":
                out.put_nowait(
                    invalid_argument("UNEXPECTED_MESSAGE", "only `decision` may follow `open`")
                )
                return
            outcome = convert.outcome_from_proto(message.decision.outcome)
            if outcome is None or outcome.value not in ("allowed-once", "rejected"):
                out.put_nowait(
                    invalid_argument(
                        "INVALID_DECISION", "a decision must be ALLOWED_ONCE or REJECTED"
                    )
                )
                return
            # A late answer (already decided elsewhere, or withdrawn) is ignored: first wins.
            # So is one this approver may not give: it learns nothing about the request.
            try:
                await registry.approvals.answer(message.decision.approval_id, outcome, session)
            except CodemodeError as error:  # the store failed: the request stays pending
                log.warning("approver %s: answer not recorded: %s", session.name, error.message)

    async def pump(out: asyncio.Queue[Any]) -> None:
        while True:
            out.put_nowait(convert.approver_message(await session.outbox.get()))

    try:
        yield rpb.ApproveResponse(opened=rpb.ApproverOpened(approver_id=session.approver_id))
        out: asyncio.Queue[Any] = asyncio.Queue()
        with streams.track(out):
            async for response in _duplex(reader, pump, out):
                yield response
    except CodemodeError as error:
        await abort(context, error)
    finally:
        registry.approvals.disconnect(session)
