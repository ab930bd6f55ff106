"""Demo tools served from a separate provider process: `python -m codemode_client.demo_tools ADDR`.

Prints `ready` once its tools are registered, then serves until killed: when the registry goes
away (a restart) it says so on stderr and registers the tools again once a registry is back.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

import grpc

from codemode_client.channel import open_channel
from codemode_client.provider import InvocationContext, ToolFailed, ToolProvider

FILES = {
    "README.md": "# Demo\nTODO: write docs\n",
    "src/app.py": "print('hi')  # TODO: greet properly\n# TODO: add tests\n",
    "src/util.py": "def add(a, b):\n    return a + b\n",
}


def build(channel: grpc.aio.Channel) -> ToolProvider:
    provider = ToolProvider(channel, "demo-files")

    @provider.tool(
        description="List the files of the demo workspace",
        output_schema={"type": "array", "items": {"type": "string"}},
        concurrency_safe=True,
        guidance="Use list_files before reading so you know what exists.",
    )
    async def list_files(args: Any, ctx: InvocationContext) -> Any:
        return sorted(FILES)

    @provider.tool(
        description="Read one file of the demo workspace",
        input_schema={
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Workspace-relative path"}},
            "required": ["path"],
            "additionalProperties": False,
        },
        output_schema={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        concurrency_safe=True,
    )
    async def read_file(args: Any, ctx: InvocationContext) -> Any:
        if args["path"] not in FILES:
            raise ToolFailed(f"no such file: {args['path']}", "ENOENT")
        await asyncio.sleep(0.01)  # pretend to do I/O
        return {"text": FILES[args["path"]]}

    @provider.tool(
        description="Overwrite a file of the demo workspace",
        input_schema={
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
            "required": ["path", "text"],
        },
    )
    async def write_file(args: Any, ctx: InvocationContext) -> Any:
        FILES[args["path"]] = args["text"]
        return {"written": len(args["text"])}

    return provider


async def serve(address: str) -> None:
    """Serves the demo tools at `address` until cancelled, across registry restarts."""
    ready = False

    def serving() -> None:
        nonlocal ready
        if not ready:
            print("ready", flush=True)
            ready = True

    provider = build(open_channel(address))
    try:
        await provider.serve(on_serving=serving)
    finally:
        await provider.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codemode_client.demo_tools",
        description="Serve the demo workspace's tools (list_files, read_file, write_file) to a "
        "registry until killed, registering them again after a registry restart.",
    )
    parser.add_argument("address", help="the registry's address, e.g. 127.0.0.1:50051")
    address = parser.parse_args(argv).address
    logging.basicConfig(level=logging.INFO, format="demo_tools: %(message)s", stream=sys.stderr)
    try:
        asyncio.run(serve(address))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
