"""An MCP server for benchmarks (official SDK, stdio): a read-only `mcp_echo` that answers
the benchmark's arguments as structured content, like `_bench_provider`'s `echo`."""

from __future__ import annotations

import mcp_types
from mcp.server.mcpserver import MCPServer

server = MCPServer("codemode-bench")


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
def mcp_echo(path: str, limit: int) -> dict[str, object]:
    """Echo the arguments."""
    return {"path": path, "limit": limit}


if __name__ == "__main__":
    server.run()
