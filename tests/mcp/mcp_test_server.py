"""The MCP server of the tests, written with the official MCP Python SDK (`MCPServer`).

Run as `python mcp_test_server.py MODE [PORT]`: `tools` serves the tool set over stdio; `http`
serves it over streamable HTTP on 127.0.0.1:PORT (the misbehaving servers are
mcp_raw_server.py). `MCP_TEST_DIR` (in the environment the registry gives the server) is where tools
leave marks the tests read (a cancellation, a start).
"""

from __future__ import annotations

import base64
import os
import sys
import time
from pathlib import Path

import anyio
import mcp_types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def _mark(name: str, text: str = "") -> None:
    where = os.environ.get("MCP_TEST_DIR")
    if where:
        Path(where, name).write_text(text)


def build() -> MCPServer:
    server = MCPServer("codemode-test")

    @server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
    def add(a: int, b: int) -> dict[str, int]:
        """Adds two integers."""
        return {"sum": a + b}

    @server.tool()
    def echo(text: str) -> str:
        """Echoes its text."""
        return text

    @server.tool()
    def picture() -> list[mcp_types.ContentBlock]:
        """A picture and a caption."""
        return [
            mcp_types.TextContent(type="text", text="a red dot"),
            mcp_types.ImageContent(
                type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png"
            ),
        ]

    @server.tool()
    def fail(why: str) -> str:
        """Always fails."""
        raise ToolError(f"refused: {why}")

    @server.tool()
    async def slow(marker: str) -> str:
        """Waits until cancelled."""
        _mark(f"started-{marker}")
        try:
            await anyio.sleep(3600)
        except anyio.get_cancelled_exc_class():
            _mark(f"cancelled-{marker}")
            raise
        return "never"

    @server.tool()
    def crash() -> str:
        """Exits the server process."""
        os._exit(3)

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Adds the tool `extra` and says the tool list changed."""

        def extra() -> str:
            return "extra here"

        server.add_tool(extra, name="extra", description="Appears after grow.")
        server.remove_tool("grow")
        await ctx.session.send_tool_list_changed()
        return "grown"

    @server.tool()
    def huge(size: int) -> str:
        """A text of `size` bytes."""
        return "x" * size

    @server.tool()
    async def flood(ctx: Context) -> str:
        """Sends log notifications until cancelled."""
        _mark("flooding")
        while True:
            await ctx.info("flood " * 20)

    @server.tool()
    async def progress(ctx: Context, values: list[str], total: float | None = None) -> str:
        """Reports each of `values` (`float()` of it: "nan" too) as progress, then returns."""
        for i, v in enumerate(values):
            await ctx.report_progress(float(v), total, f"step {i}")
        return "reported"

    @server.tool()
    async def progress_flood(ctx: Context, count: int) -> str:
        """Reports progress 1..`count` as fast as it can, then returns."""
        for i in range(1, count + 1):
            await ctx.report_progress(i, count, "x" * 2000)
        return "flooded"

    @server.tool()
    def lie() -> dict[str, int]:
        """Declares {count: integer} but returns a string there (see below)."""
        return {"count": 1}

    @server.tool()
    def unexpressible(x: str) -> str:
        """Its input schema uses `not`, which the catalog cannot express (see below)."""
        return x

    @server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
    def pid() -> dict[str, int]:
        """The server's pid, uid and process group."""
        return {"pid": os.getpid(), "uid": os.getuid(), "pgid": os.getpgid(0)}

    @server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
    def cwd_args() -> dict[str, object]:
        """The server's working directory and the arguments it was started with."""
        return {"cwd": os.getcwd(), "args": sys.argv[1:]}

    @server.tool()
    def whoami(ctx: Context) -> dict[str, str]:
        """The HTTP headers this call came with that the tests set."""
        headers = ctx.headers or {}
        return {k: v for k, v in headers.items() if k.lower() in {"authorization", "x-tenant"}}

    @server.tool()
    def shout(text: str) -> str:
        """Writes `text` and a 5,000-character line to stderr."""
        print(text, file=sys.stderr, flush=True)
        print("y" * 5000, file=sys.stderr, flush=True)
        return "shouted"

    @server.tool()
    def env() -> dict[str, str]:
        """The server's environment."""
        return dict(os.environ)

    tools = server._tool_manager._tools
    tools["unexpressible"].parameters = {
        "type": "object",
        "properties": {"x": {"type": "string"}},
        "not": {"required": ["y"]},
    }
    lying = tools["lie"]
    lying.output_schema = {
        "type": "object",
        "properties": {"count": {"type": "string"}},
        "required": ["count"],
    }
    where = os.environ.get("MCP_TEST_DIR")
    while where and Path(where, "hold").exists():  # a test holds the (re)start here
        time.sleep(0.02)
    return server


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "tools"
    if mode == "tools":
        build().run()
    else:
        build().run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
