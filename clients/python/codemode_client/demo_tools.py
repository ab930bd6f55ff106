"""Demo tools served from a separate provider process: `python -m codemode_client.demo_tools ADDR`.

Prints `ready` once its tools are registered, then serves until killed.
"""

from __future__ import annotations

import asyncio
import sys
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


async def main(address: str) -> None:
    provider = build(open_channel(address))
    async with provider:
        print("ready", flush=True)
        await provider.closed()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
