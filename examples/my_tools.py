"""Your own tools, served to a registry from this process (the README's quick start).

    .venv/bin/python examples/my_tools.py 127.0.0.1:50051

Prints `ready` once the registry has the tools, then serves them until Ctrl-C. A `run_code`
program of any agent that can see them calls them as `await tools.add({"a": 2, "b": 3})`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from typing_extensions import TypedDict  # pydantic derives schemas from these on 3.11

from codemode_client import ToolProvider, open_channel


class AddArgs(TypedDict):
    a: int
    b: int


class GreetArgs(TypedDict):
    name: str


async def main(address: str) -> None:
    async with open_channel(address) as channel:
        provider = ToolProvider(channel, "my-tools")

        @provider.tool(concurrency_safe=True)  # schemas from the type hints
        async def add(args: AddArgs, ctx: Any) -> int:
            """Add two integers."""  # the description, from the docstring
            return args["a"] + args["b"]

        @provider.tool(concurrency_safe=True)
        async def greet(args: GreetArgs, ctx: Any) -> str:
            """Greet someone by name."""
            return f"Hello, {args['name']}!"

        async with provider:
            print("ready", flush=True)
            await provider.closed()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"))
