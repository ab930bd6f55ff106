"""The README's Python client example: serve a tool, approve calls, run a program, read history.

    python examples/python_client.py 127.0.0.1:50051

Safe to run again and again against the same registry: the agent is created once and reused.
It prints (tests/examples/test_examples.py checks these lines):

    result: {'logs': [], 'result': 11}
    history: 1 nested call in this run
    refused: AGENT_NOT_FOUND codemode.registry
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

from typing_extensions import TypedDict  # pydantic derives schemas from these on 3.11

from codemode_client import (
    AlreadyExists,
    Approver,
    NotFound,
    RegistryClient,
    ToolProvider,
    open_channel,
)

HERE = Path(__file__).resolve().parent


class ReadArgs(TypedDict):
    path: str


class ReadResult(TypedDict):
    text: str


async def main(address: str) -> None:
    async with RegistryClient(address) as client, open_channel(address) as channel:
        provider = ToolProvider(channel, "example-files")

        @provider.tool(concurrency_safe=True)  # schemas from the type hints
        async def read_example(args: ReadArgs, ctx: Any) -> ReadResult:
            """Read a file of the examples folder."""  # the description, from the docstring
            return {"text": (HERE / "programs" / Path(args["path"]).name).read_text()}

        async with provider, Approver(channel, "oncall", lambda request: True):
            try:
                agent = (await client.create_agent("example-coder", mode="code")).name
            except AlreadyExists:
                agent = "agents/example-coder"  # a second run reuses it
            call_id = f"count-lines-{uuid.uuid4().hex[:8]}"
            result = await client.run_code(
                "r = await tools.read_example({'path': 'count_todos.py'})\n"
                "return len(r['text'].splitlines())",
                "Count the lines of an example",
                agent=agent,
                call_id=call_id,
            )
            print("result:", result.value)  # the lines of examples/programs/count_todos.py
            records = await client.history(agent, call_id=call_id)  # the call and its nested ones
            nested = [r for r in records if r.kind == "tool/code-dispatch"]
            print("history:", len(nested), "nested call in this run")
        try:
            await client.get_agent("agents/nope")
        except NotFound as exc:
            print("refused:", exc.reason, exc.domain)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"))
