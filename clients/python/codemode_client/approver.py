"""Answer approval requests from a Python function.

    async def decide(request) -> bool:
        return request.tool_name != "delete_everything"

    async with Approver(channel, "ops-oncall", decide):
        ...  # requests are answered while the block runs

    await approver.serve()  # or: answer until close(), reconnecting whenever the stream is
                            # lost (a registry restart or shutdown)

Every connected approver receives every request it may answer and its channel can receive
(`open_channel` receives 64 MiB, a plain channel 4 MiB); the first answer wins.

`decide` may return None to abstain: no answer is sent, so another approver's decides (or, with
none, the request stays pending until the call ends). With `concurrent=True` each request is
decided in a task of its own, so a slow decision (a person asked elsewhere) holds up no other
request, and a request withdrawn while it is being decided cancels its task.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from codemode_client._reconnect import serve_until_closed
from codemode_client.channel import receive_limit
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc

Decide = Callable[[rpb.ApprovalRequest], "bool | Awaitable[bool | None] | None"]


class Approver:
    def __init__(
        self, channel: grpc.aio.Channel, name: str, decide: Decide, *, concurrent: bool = False
    ) -> None:
        self._stub = rpb_grpc.RegistryServiceStub(channel)
        # Declared when the stream opens: the registry sends no request larger than this, which
        # the channel would refuse by ending the stream (and every agent's approvals on it).
        self._receives = receive_limit(channel)
        self._name = name
        self._decide = decide
        self._concurrent = concurrent
        self._deciding: dict[str, asyncio.Task[None]] = {}  # approval id -> its decision
        self._call: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.withdrawn: list[rpb.ApprovalWithdrawn] = []

    async def __aenter__(self) -> Approver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, *, wait_for_ready: bool = False) -> None:
        """Opens the stream. `wait_for_ready` waits for the registry to be reachable instead of
        failing at once with UNAVAILABLE."""
        self._closing = False
        self._call = self._stub.Approve(wait_for_ready=wait_for_ready)
        opening = rpb.OpenApprover(
            approver_name=self._name, max_receive_message_bytes=self._receives
        )
        await self._call.write(rpb.ApproveRequest(open=opening))
        opened = await self._call.read()
        if opened is grpc.aio.EOF or opened.WhichOneof("message") != "opened":
            raise RuntimeError("the registry did not open the approver stream")
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        try:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                while (message := await self._call.read()) is not grpc.aio.EOF:
                    await self._on_message(message)
        finally:
            for task in list(self._deciding.values()):
                task.cancel()

    async def _on_message(self, message: rpb.ApproveResponse) -> None:
        kind = message.WhichOneof("message")
        if kind == "withdrawn":
            self.withdrawn.append(message.withdrawn)
            task = self._deciding.pop(message.withdrawn.approval_id, None)
            if task is not None:
                task.cancel()
        elif kind == "request" and self._concurrent:
            approval_id = message.request.approval_id
            task = asyncio.create_task(self._answer(message.request))
            self._deciding[approval_id] = task
            task.add_done_callback(lambda _: self._deciding.pop(approval_id, None))
        elif kind == "request":
            await self._answer(message.request)

    async def _answer(self, request: rpb.ApprovalRequest) -> None:
        verdict = self._decide(request)
        allowed = await verdict if inspect.isawaitable(verdict) else verdict
        # Decided: a withdrawal from now on must not cancel the write (a cancelled write
        # cancels the whole stream, and every other request on it).
        self._deciding.pop(request.approval_id, None)
        if allowed is None:
            return  # abstained
        outcome = rpb.APPROVAL_OUTCOME_ALLOWED_ONCE if allowed else rpb.APPROVAL_OUTCOME_REJECTED
        decision = rpb.ApprovalDecision(approval_id=request.approval_id, outcome=outcome)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._call.write(rpb.ApproveRequest(decision=decision))

    async def closed(self) -> None:
        """Waits until the stream ends (however it ends, `close()` included)."""
        if self._task is not None:
            await asyncio.wait({self._task})

    async def serve(self, *, max_delay: float = 10.0) -> None:
        """Answers requests until `close()`, across registry restarts and shutdowns: a lost
        stream is opened again as soon as a registry is reachable (the channel waits)."""
        await serve_until_closed(
            open_stream=lambda: self.start(wait_for_ready=True),
            stream_ended=self.closed,
            drop_stream=self._drop_call,
            closing=lambda: self._closing,
            transient=(grpc.aio.AioRpcError, RuntimeError),
            max_delay=max_delay,
        )

    def _drop_call(self) -> None:
        if self._call is not None:
            self._call.cancel()

    async def close(self) -> None:
        self._closing = True
        if self._call is not None:
            self._call.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
