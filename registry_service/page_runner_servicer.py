"""PageRunnerService: the `Attach` stream of Cordis page runners (translation only; the rules
live in `domain/cordis/client_runs.py`, `client_queries.py` and `page_runners.py`).

One reader task takes the page's messages; each is answered by one `reply` with its
`reply_to`. Messages that wait (a Host half's start, a handler call, a stop) run as their own
tasks so that the page can keep talking meanwhile (e.g. answer a query while a Host half
starts). Events for the page (requests, resolutions, queries) share the outgoing queue."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

from codemode_common.peer import current_principal
from codemode_common.request_parsing import Malformed, malformed_error
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import page_runner_pb2 as ppb
from codemode_wire.errors import CodemodeError, invalid_argument, unavailable
from codemode_wire.jsonvalue import JsonValue
from registry_service._errors import abort
from registry_service.domain.access import AccessPolicy, Permission, resource_of
from registry_service.domain.cordis.client_runs import Outcome
from registry_service.domain.cordis.page_runners import (
    Answer,
    Page,
    PageEvent,
    QueryRequested,
    QueryResolved,
    RunRequested,
    RunResolved,
    refused,
)
from registry_service.registry import Registry

Context: TypeAlias = Any
_END = object()
_SHUTTING_DOWN = unavailable(
    "REGISTRY_SHUTTING_DOWN", "the registry is shutting down; reconnect to continue"
)
_OUTCOMES: dict[int, Outcome] = {
    ppb.SETTLE_OUTCOME_SUCCESS: "success",
    ppb.SETTLE_OUTCOME_REJECTED: "rejected",
    ppb.SETTLE_OUTCOME_HOST_HALF_FAILED: "host-half-failed",
    ppb.SETTLE_OUTCOME_CLIENT_HALF_FAILED: "client-half-failed",
}


def _event(event: PageEvent) -> ppb.AttachResponse:
    if isinstance(event, RunRequested):
        return ppb.AttachResponse(
            run_requested=ppb.RunRequested(
                request_id=event.request_id,
                agent=event.agent,
                plugin_id=event.plugin_id,
                package_id=event.package_id,
                plugin_run_id=event.run_id,
                mode=event.mode,
                name=event.name,
                purpose=event.purpose,
                requires_approval=event.requires_approval,
                has_host_half=event.has_host,
                source=ppb.PackageSource(
                    host=event.source.host,
                    client=event.source.client,
                    truncated=event.source.truncated,
                ),
            )
        )
    if isinstance(event, RunResolved):
        return ppb.AttachResponse(
            run_resolved=ppb.RunRequestResolved(request_id=event.request_id, outcome=event.outcome)
        )
    if isinstance(event, QueryRequested):
        return ppb.AttachResponse(
            inspect_query=ppb.InspectQueryRequested(
                query_id=event.query_id,
                agent=event.agent,
                provider=event.provider,
                method=event.method,
                input_json=jsonvalue.dumps(event.input),
            )
        )
    assert isinstance(event, QueryResolved)
    return ppb.AttachResponse(
        inspect_query_resolved=ppb.InspectQueryResolved(
            query_id=event.query_id, outcome=event.outcome
        )
    )


def _reply(reply_to: int, answer: Answer) -> ppb.AttachResponse:
    reply = ppb.PageReply(
        reply_to=reply_to,
        accepted=answer.accepted,
        message=answer.message,
        code=answer.code,
        plugin_run_id=answer.run_id,
        started_here=answer.started_here,
        stack=answer.stack,
    )
    if answer.client_code is not None:
        c = answer.client_code
        reply.client_code.CopyFrom(
            ppb.ClientCode(
                code=c.code,
                name=c.name,
                plugin_id=c.plugin_id,
                package_id=c.package_id,
                plugin_run_id=c.run_id,
            )
        )
    if answer.accepted and answer.value is not None:
        reply.value_json = jsonvalue.dumps(answer.value)
    return ppb.AttachResponse(reply=reply)


def _json(text: str, what: str) -> JsonValue:
    """Empty text is null; anything else must be lossless JSON."""
    if not text:
        return None
    try:
        return jsonvalue.loads(text)
    except ValueError as exc:
        raise invalid_argument("INVALID_JSON", f"{what} is not valid JSON: {exc}") from None


class PageRunnerServicer:
    def __init__(self, registry: Registry, policy: AccessPolicy | None = None) -> None:
        self._registry = registry
        self._policy = policy
        self._queues: set[asyncio.Queue[Any]] = set()
        self._closing = False

    def drain(self) -> None:
        """Shutdown: every page stream ends with UNAVAILABLE (pages reattach to another)."""
        self._closing = True
        for queue in self._queues:
            queue.put_nowait(_SHUTTING_DOWN)

    async def Attach(
        self, requests: AsyncIterator[ppb.AttachRequest], context: Context
    ) -> AsyncIterator[ppb.AttachResponse]:
        try:
            agent = await self._open(requests)
            if self._policy is not None:  # the guard let it attach; now: this agent's plugins
                self._policy.require(
                    current_principal(), Permission.CORDIS, resource_of(agent.agent)
                )
        except CodemodeError as error:
            await abort(context, error)
            return
        out: asyncio.Queue[Any] = asyncio.Queue()
        cordis = self._registry.cordis
        page = cordis.pages.attach(
            agent.agent,
            agent.page_name,
            lambda e: out.put_nowait(_event(e)),
            current_principal(),
        )
        self._queues.add(out)
        if self._closing:
            out.put_nowait(_SHUTTING_DOWN)
        work: set[asyncio.Task[None]] = set()

        def answer_later(reply_to: int, pending: Awaitable[Answer]) -> None:
            async def run() -> None:
                out.put_nowait(_reply(reply_to, await pending))

            task = asyncio.ensure_future(run())
            work.add(task)
            task.add_done_callback(work.discard)

        async def read() -> None:
            try:
                async for message in requests:
                    if isinstance(message, Malformed):
                        out.put_nowait(malformed_error(message))
                        return
                    try:
                        self._dispatch(page, message, out, answer_later)
                    except CodemodeError as error:
                        out.put_nowait(error)
                        return
            finally:
                out.put_nowait(_END)

        reader = asyncio.ensure_future(read())
        try:
            yield ppb.AttachResponse(attached=ppb.Attached(agent=agent.agent))
            while (item := await out.get()) is not _END:
                if isinstance(item, CodemodeError):
                    await abort(context, item)
                    return
                yield item
        finally:
            cordis.pages.detach(page)
            self._queues.discard(out)
            reader.cancel()
            for task in (reader, *work):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _open(self, requests: AsyncIterator[ppb.AttachRequest]) -> ppb.AttachOpen:
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            raise invalid_argument(
                "STREAM_NOT_OPENED", "the page runner stream ended before `open`"
            ) from None
        if isinstance(first, Malformed):
            raise malformed_error(first)
        if first.WhichOneof("message") != "open":
            raise invalid_argument(
                "STREAM_NOT_OPENED", "the first page runner message must be `open`"
            )
        opened = ppb.AttachOpen()
        opened.CopyFrom(first.open)
        if "/" not in opened.agent:
            opened.agent = f"agents/{opened.agent}"
        self._registry.catalog.get_agent(opened.agent)  # NOT_FOUND for an unknown agent
        return opened

    def _dispatch(
        self,
        page: Page,
        message: ppb.AttachRequest,
        out: asyncio.Queue[Any],
        answer_later: Callable[[int, Awaitable[Answer]], None],
    ) -> None:
        cordis = self._registry.cordis
        runs = cordis.client_runs
        reply_to = message.reply_to
        kind = message.WhichOneof("message")
        if kind == "run_host_half":
            m = message.run_host_half
            answer_later(
                reply_to,
                runs.run_host_half(
                    page,
                    request_id=m.request_id,
                    plugin_id=m.plugin_id,
                    package_id=m.package_id,
                    mode=m.mode,
                    approve_future_versions=m.approve_future_versions,
                ),
            )
        elif kind == "get_client_code":
            m2 = message.get_client_code
            out.put_nowait(_reply(reply_to, runs.client_code(page, m2.plugin_id, m2.plugin_run_id)))
        elif kind == "settle":
            s = message.settle
            outcome = _OUTCOMES.get(s.outcome)
            if outcome is None:
                out.put_nowait(
                    _reply(reply_to, refused("settle needs an outcome", "invalid-outcome"))
                )
            else:  # a move in the store: answered once it is taken (or refused)
                answer_later(
                    reply_to,
                    runs.settle(
                        page,
                        request_id=s.request_id,
                        run_id=s.plugin_run_id,
                        outcome=outcome,
                        message=s.message,
                        stack=s.stack,
                        client_waiting_for=tuple(s.client_waiting_for),
                        plugin_id=s.plugin_id,
                    ),
                )
        elif kind == "stop":
            answer_later(reply_to, runs.panel_stop(page, message.stop.plugin_id))
        elif kind == "remove":
            answer_later(reply_to, runs.panel_remove(page, message.remove.plugin_id))
        elif kind == "invoke":
            i = message.invoke
            args = _json(i.args_json, "invoke.args_json")
            answer_later(reply_to, runs.invoke(page, i.plugin_id, i.plugin_run_id, i.method, args))
        elif kind == "render_failure":
            r = message.render_failure
            answer_later(  # carried to the run's owner when another registry holds it
                reply_to,
                runs.render_failure(page, r.plugin_id, r.plugin_run_id, r.message, r.stack),
            )
        elif kind == "sync_manifest":
            providers = _json(message.sync_manifest.providers_json, "providers_json")
            out.put_nowait(_reply(reply_to, cordis.sync_manifest(page, providers or [])))
        elif kind == "answer_query":
            a = message.answer_query
            data = _json(a.data_json, "data_json") if a.ok else None
            answer = cordis.client_queries.answer(page, a.query_id, a.ok, data, a.message)
            out.put_nowait(_reply(reply_to, answer))
        else:
            what = "a second `open`" if kind == "open" else "a message of no known kind"
            raise invalid_argument("UNEXPECTED_MESSAGE", f"{what} on the page runner stream")
