"""A bare MCP server over stdio (the official SDK's lowlevel `Server`, the same the adapter
uses) whose one tool `echo` answers at once: the MCP SDKs' own round trip, with no registry
behind it, as `benchmarks.mcp_serve`'s reference."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

TOOL = types.Tool(name="echo", description="Echo the arguments", input_schema={"type": "object"})


async def _list(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[TOOL])


async def _call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text="echo")], structured_content=params.arguments or {}
    )


async def main() -> None:
    server: Server[Any] = Server("echo", on_list_tools=_list, on_call_tool=_call)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
