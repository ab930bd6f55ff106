"""A tool provider in its own process whose spans go to a JSON-lines file.

    python -m tests.telemetry.provider_process REGISTRY_ADDRESS TRACE_FILE

Prints `ready` once its tools are registered, then serves until terminated. Every span is
written when it ends (SimpleSpanProcessor), so the test can read the file while it runs.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from codemode_client.provider import InvocationContext, ToolFailed, ToolProvider
from codemode_common.telemetry.jsonl import JsonLinesSpanExporter
from codemode_wire.jsonvalue import JsonValue

SERVICE = "telemetry-tools"
LOOKUP_S = 0.05


def build(channel: grpc.aio.Channel, tracer_provider: TracerProvider) -> ToolProvider:
    provider = ToolProvider(channel, SERVICE, tracer_provider=tracer_provider)
    anything: JsonValue = {"type": "object"}

    @provider.tool(input_schema=anything, output_schema=anything, concurrency_safe=True)
    async def lookup(args: Any, ctx: InvocationContext) -> Any:
        """A concurrency-safe read that takes a moment."""
        await asyncio.sleep(LOOKUP_S)
        return {"key": args.get("key")}

    @provider.tool(input_schema=anything, output_schema=anything)
    async def write_note(args: Any, ctx: InvocationContext) -> Any:
        """An exclusive write."""
        await asyncio.sleep(0.01)
        return {"written": True}

    @provider.tool(input_schema=anything, output_schema=anything)
    async def forbidden(args: Any, ctx: InvocationContext) -> Any:
        """Denied by policy: never runs."""
        return {}

    @provider.tool(input_schema=anything, output_schema=anything)
    async def fail_tool(args: Any, ctx: InvocationContext) -> Any:
        """Always fails with a stable code."""
        raise ToolFailed("the tool failed on purpose", "BOOM")

    @provider.tool(input_schema=anything, output_schema=anything)
    async def secret(args: Any, ctx: InvocationContext) -> Any:
        """Needs an approval."""
        return {"secret": 42}

    return provider


async def main(address: str, trace_file: str) -> None:
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    tracer_provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(trace_file)))
    provider = build(grpc.aio.insecure_channel(address), tracer_provider)
    async with provider:
        print("ready", flush=True)
        await provider.closed()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
