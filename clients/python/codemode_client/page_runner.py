"""A Cordis page runner over the `PageRunnerService.Attach` stream (minimal: the verbs and
the events; what a page *does* with a Client half is up to the caller).

    async with PageRunner(channel, "agents/coder") as page:
        request = (await page.next_event("run_requested")).run_requested
        started = await page.run_host_half(request)            # approves it (records the grant)
        code = await page.client_code(request.plugin_id, started.plugin_run_id)
        ...                                                    # run code.client_code.code
        await page.settle(request.request_id, started.plugin_run_id)  # success

Every verb returns the registry's `PageReply`; `accepted` False means it changed nothing
(an unknown, duplicate or stale answer). Events (`run_requested`, `run_resolved`,
`inspect_query`, `inspect_query_resolved`) queue up until read with `next_event`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import grpc

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import page_runner_pb2 as ppb
from codemode_wire.api.registry.v1 import page_runner_pb2_grpc as ppb_grpc
from codemode_wire.jsonvalue import JsonValue

OUTCOMES = {
    "success": ppb.SETTLE_OUTCOME_SUCCESS,
    "rejected": ppb.SETTLE_OUTCOME_REJECTED,
    "host-half-failed": ppb.SETTLE_OUTCOME_HOST_HALF_FAILED,
    "client-half-failed": ppb.SETTLE_OUTCOME_CLIENT_HALF_FAILED,
}


class PageRunner:
    def __init__(self, channel: grpc.aio.Channel, agent: str, name: str = "page") -> None:
        self._stub = ppb_grpc.PageRunnerServiceStub(channel)
        self._agent = agent
        self._name = name
        self._call: Any = None
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[ppb.PageReply]] = {}
        self._events: asyncio.Queue[ppb.AttachResponse | None] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self.agent = ""

    async def __aenter__(self) -> PageRunner:
        await self.attach()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def attach(self) -> None:
        self._call = self._stub.Attach()
        await self._call.write(
            ppb.AttachRequest(open=ppb.AttachOpen(agent=self._agent, page_name=self._name))
        )
        first = await self._call.read()
        if first is grpc.aio.EOF or first.WhichOneof("message") != "attached":
            raise RuntimeError("the registry did not attach the page runner")
        self.agent = first.attached.agent
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while (message := await self._call.read()) is not grpc.aio.EOF:
                if message.WhichOneof("message") == "reply":
                    future = self._replies.pop(message.reply.reply_to, None)
                    if future is not None and not future.done():
                        future.set_result(message.reply)
                else:
                    self._events.put_nowait(message)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            for future in self._replies.values():
                if not future.done():
                    future.set_exception(ConnectionError("the page runner stream ended"))
            self._events.put_nowait(None)

    async def next_event(self, kind: str = "") -> ppb.AttachResponse:
        """The next event (of `kind`, dropping others); raises when the stream has ended."""
        while True:
            event = await self._events.get()
            if event is None:
                self._events.put_nowait(None)
                raise ConnectionError("the page runner stream ended")
            if not kind or event.WhichOneof("message") == kind:
                return event

    async def _ask(self, **message: Any) -> ppb.PageReply:
        reply_to = next(self._ids)
        future: asyncio.Future[ppb.PageReply] = asyncio.get_running_loop().create_future()
        self._replies[reply_to] = future
        await self._call.write(ppb.AttachRequest(reply_to=reply_to, **message))
        return await future

    async def run_host_half(
        self, request: ppb.RunRequested, *, approve_future_versions: bool = False
    ) -> ppb.PageReply:
        """Runs the Host half for a request (approving it)."""
        return await self._ask(
            run_host_half=ppb.RunHostHalf(
                request_id=request.request_id,
                plugin_id=request.plugin_id,
                package_id=request.package_id,
                mode=request.mode,
                approve_future_versions=approve_future_versions,
            )
        )

    async def panel_run(
        self, plugin_id: str, package_id: str, mode: str = "run", *, approve_future: bool = False
    ) -> ppb.PageReply:
        """A direct panel gesture: runs the Host half without a request (granting it)."""
        return await self._ask(
            run_host_half=ppb.RunHostHalf(
                plugin_id=plugin_id,
                package_id=package_id,
                mode=mode,
                approve_future_versions=approve_future,
            )
        )

    async def client_code(self, plugin_id: str, run_id: str) -> ppb.PageReply:
        return await self._ask(
            get_client_code=ppb.GetClientCode(plugin_id=plugin_id, plugin_run_id=run_id)
        )

    async def settle(
        self,
        request_id: str,
        run_id: str = "",
        outcome: str = "success",
        *,
        message: str = "",
        stack: str = "",
        plugin_id: str = "",
        client_waiting_for: tuple[str, ...] = (),
    ) -> ppb.PageReply:
        """Settles a request (or, with `request_id` empty and `plugin_id`, a panel run)."""
        return await self._ask(
            settle=ppb.SettleRun(
                request_id=request_id,
                plugin_run_id=run_id,
                outcome=OUTCOMES[outcome],
                message=message,
                stack=stack,
                plugin_id=plugin_id,
                client_waiting_for=client_waiting_for,
            )
        )

    async def stop(self, plugin_id: str) -> ppb.PageReply:
        return await self._ask(stop=ppb.PanelStop(plugin_id=plugin_id))

    async def remove(self, plugin_id: str) -> ppb.PageReply:
        return await self._ask(remove=ppb.PanelRemove(plugin_id=plugin_id))

    async def invoke(
        self, plugin_id: str, run_id: str, method: str, args: JsonValue = None
    ) -> ppb.PageReply:
        return await self._ask(
            invoke=ppb.InvokeHandler(
                plugin_id=plugin_id,
                plugin_run_id=run_id,
                method=method,
                args_json=jsonvalue.dumps(args),
            )
        )

    async def render_failure(
        self, plugin_id: str, run_id: str, message: str, stack: str = ""
    ) -> ppb.PageReply:
        return await self._ask(
            render_failure=ppb.RenderFailure(
                plugin_id=plugin_id, plugin_run_id=run_id, message=message, stack=stack
            )
        )

    async def sync_manifest(self, providers: JsonValue) -> ppb.PageReply:
        return await self._ask(
            sync_manifest=ppb.SyncInspectManifest(providers_json=jsonvalue.dumps(providers))
        )

    async def answer_query(
        self, query_id: str, data: JsonValue = None, *, ok: bool = True, message: str = ""
    ) -> ppb.PageReply:
        return await self._ask(
            answer_query=ppb.AnswerInspectQuery(
                query_id=query_id,
                ok=ok,
                data_json=jsonvalue.dumps(data) if ok else "",
                message=message,
            )
        )

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
