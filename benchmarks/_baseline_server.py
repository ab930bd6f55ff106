"""A bare grpc.aio server for same-run baselines: unary echo, bidi ping-pong, and a reference
relay (the registry's message pattern with no registry logic).

Relay: a caller's server-streaming `RelayCall` is forwarded as one message on a provider's
`RelayConnect` bidi stream and the provider's answer comes back as the call's one response;
`python -m benchmarks._baseline_server --provider PORT` runs that provider in its own process.

Run as a subprocess: prints `port <n>` (or `ready` for the provider) and serves until killed.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc

SERVICE = "bench.Baseline"
_ID_BYTES = 8


def _identity(data: bytes) -> bytes:
    return data


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _ping_pong(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


class _Relay:
    """One connected provider; each call is an id-prefixed message out and the answer back."""

    def __init__(self) -> None:
        self.outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self.ids = itertools.count()

    async def connect(self, answers: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async def read() -> None:
            async for answer in answers:
                self.waiting.pop(answer[:_ID_BYTES]).set_result(answer[_ID_BYTES:])

        reader = asyncio.ensure_future(read())
        try:
            while True:
                yield await self.outbox.get()
        finally:
            reader.cancel()

    async def call(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        key = next(self.ids).to_bytes(_ID_BYTES, "big")
        answer = self.waiting[key] = asyncio.get_running_loop().create_future()
        self.outbox.put_nowait(key + request)
        yield await answer


def handler() -> grpc.GenericRpcHandler:
    relay = _Relay()
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo, _identity, _identity),
            "PingPong": grpc.stream_stream_rpc_method_handler(_ping_pong, _identity, _identity),
            "RelayConnect": grpc.stream_stream_rpc_method_handler(
                relay.connect, _identity, _identity
            ),
            "RelayCall": grpc.unary_stream_rpc_method_handler(relay.call, _identity, _identity),
        },
    )


async def main() -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"port {port}", flush=True)
    await server.wait_for_termination()


async def provider(port: int) -> None:
    """Answers every relayed message with itself (read, write: one task, no registry logic)."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stream = channel.stream_stream(f"/{SERVICE}/RelayConnect", _identity, _identity)()
    print("ready", flush=True)
    while (message := await stream.read()) is not grpc.aio.EOF:
        await stream.write(message)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--provider"]:
        asyncio.run(provider(int(sys.argv[2])))
    else:
        asyncio.run(main())
