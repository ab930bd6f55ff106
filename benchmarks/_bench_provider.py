"""A tool provider process for benchmarks: serves a concurrency-safe `echo` tool."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc

from codemode_client import ToolProvider


async def main(address: str) -> None:
    channel = grpc.aio.insecure_channel(address)
    provider = ToolProvider(channel, "bench")

    @provider.tool(concurrency_safe=True, description="Echo the arguments")
    async def echo(args: Any, ctx: Any) -> Any:
        return args

    async with provider:
        print("ready", flush=True)
        await provider.closed()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
