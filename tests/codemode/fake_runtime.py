"""A scripted `RuntimeService` over real gRPC on loopback, for what a real runtime never does:
binding calls with forged, foreign or expired parent tokens, at chosen (fake) times.

The registry under test talks to it exactly as to a real runtime (`runtime_targets`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc as pb_grpc
from registry_service.config import RegistrySettings
from registry_service.domain.scopes import Mode
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from tests.registry.conftest import CODE, Harness, echo_tool

# Both ways a registry reaches a runtime (`runtime_channel`): a hostile runtime is checked
# on each.
CHANNELS = ("multiplexed", "per-run")


@dataclass
class Step:
    """One binding call: `before` runs first (advance a fake clock, say), then the call goes
    out with the token `token(start_token)` returns, and the registry's answer is awaited."""

    token: Callable[[bytes], bytes] = lambda own: own
    before: Callable[[], None] = lambda: None
    name: str = "echo"
    arguments_json: str = "{}"


@dataclass
class FakeRuntime(pb_grpc.RuntimeServiceServicer):
    steps: list[Step] = field(default_factory=list)
    max_wall_ms: int = 600_000
    default_output_bytes: int = 64 << 20
    max_output_bytes: int = 64 << 20
    starts: list[pb.RunStart] = field(default_factory=list)
    results: list[pb.CallResult] = field(default_factory=list)

    async def GetCapabilities(
        self, request: pb.GetCapabilitiesRequest, context: object
    ) -> pb.GetCapabilitiesResponse:
        return pb.GetCapabilitiesResponse(
            languages=["python"],
            default_budgets=pb.RunBudgets(
                wall_ms=self.max_wall_ms, max_output_bytes=self.default_output_bytes
            ),
            max_budgets=pb.RunBudgets(
                wall_ms=self.max_wall_ms, max_output_bytes=self.max_output_bytes
            ),
        )

    async def Host(
        self, request_iterator: AsyncIterator[pb.HostRequest], context: Any
    ) -> AsyncIterator[pb.HostResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no plugin hosts here")
        yield pb.HostResponse()  # unreachable: makes this an async generator

    async def Multiplex(
        self, request_iterator: AsyncIterator[pb.MultiplexRequest], context: Any
    ) -> AsyncIterator[pb.MultiplexResponse]:
        """Each run's frames through `Run`'s script: the same hostile steps on either channel
        (one frame a message: this peer batches nothing)."""
        outgoing: asyncio.Queue[pb.RunResponseFrame] = asyncio.Queue()
        inboxes: dict[int, asyncio.Queue[pb.RunRequest]] = {}
        tasks: set[asyncio.Task[None]] = set()

        async def requests(inbox: asyncio.Queue[pb.RunRequest]) -> AsyncIterator[pb.RunRequest]:
            while True:
                yield await inbox.get()

        async def drive(run_id: int, inbox: asyncio.Queue[pb.RunRequest]) -> None:
            outgoing.put_nowait(pb.RunResponseFrame(run_id=run_id, accepted=True))
            async for response in self.Run(requests(inbox), context):
                outgoing.put_nowait(pb.RunResponseFrame(run_id=run_id, response=response))

        async def read() -> None:
            async for message in request_iterator:
                for frame in message.frames:
                    if frame.run_id not in inboxes:
                        inboxes[frame.run_id] = asyncio.Queue()
                        task = asyncio.ensure_future(drive(frame.run_id, inboxes[frame.run_id]))
                        tasks.add(task)
                    inboxes[frame.run_id].put_nowait(frame.request)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                yield pb.MultiplexResponse(frames=[await outgoing.get()])
        finally:
            reader.cancel()
            for task in tasks:
                task.cancel()

    async def CheckSource(
        self, request: pb.CheckSourceRequest, context: Any
    ) -> pb.CheckSourceResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no source checks here")
        raise AssertionError("unreachable")

    async def Run(
        self, request_iterator: AsyncIterator[pb.RunRequest], context: object
    ) -> AsyncIterator[pb.RunResponse]:
        first = await anext(aiter(request_iterator))
        start = first.start
        self.starts.append(start)
        for n, step in enumerate(self.steps, start=1):
            step.before()
            yield pb.RunResponse(
                binding_call=pb.BindingCall(
                    call_id=n,
                    binding_name=step.name,
                    arguments_json=step.arguments_json,
                    token=step.token(start.token),
                )
            )
            reply = await anext(aiter(request_iterator))
            assert reply.WhichOneof("kind") == "call_result", reply
            self.results.append(reply.call_result)
        yield pb.RunResponse(terminal=pb.RunTerminal(success=pb.RunSuccess()))


@contextlib.asynccontextmanager
async def serve(runtime: FakeRuntime) -> AsyncIterator[str]:
    """Serves `runtime` on 127.0.0.1:0; yields its address."""
    server = grpc.aio.server()
    pb_grpc.add_RuntimeServiceServicer_to_server(runtime, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> Callable[[], None]:
        def step() -> None:
            self.now += seconds

        return step


@contextlib.asynccontextmanager
async def registry_on(
    runtime: FakeRuntime, **settings: Any
) -> AsyncIterator[tuple[Harness, FakeClock, str]]:
    """A registry whose runtime is `runtime`, its token clock faked, an `echo` tool; and a
    code agent."""
    async with serve(runtime) as address:
        config = RegistrySettings(
            **{
                "listen": "127.0.0.1:0",
                "history_path": ":memory:",
                "default_mode": Mode.CODE,
                "runtime_targets": [address],
                **settings,
            }
        )
        running = await start_registry(config, build_registry(config))
        channel = grpc.aio.insecure_channel(running.address)
        harness = Harness(running, channel)
        clock = FakeClock()
        running.registry.transport.minter.clock = clock
        echo_tool(running.registry, "echo")
        try:
            yield harness, clock, await harness.agent("coder", mode=CODE)
        finally:
            await channel.close()
            await running.stop(0)
