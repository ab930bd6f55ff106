"""A bare grpc.aio server for same-run baselines: unary echo and bidi ping-pong on raw bytes.

Run as a subprocess: prints `port <n>` and serves until killed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

SERVICE = "bench.Baseline"


def _identity(data: bytes) -> bytes:
    return data


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _ping_pong(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


def handler() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo, _identity, _identity),
            "PingPong": grpc.stream_stream_rpc_method_handler(_ping_pong, _identity, _identity),
        },
    )


async def main() -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"port {port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
