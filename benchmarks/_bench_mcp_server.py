"""An MCP server for benchmarks (official SDK, stdio): a read-only `mcp_echo` that answers
the benchmark's arguments as structured content, like `_bench_provider`'s `echo`.

Configured as a production server would be, so that the figure is the registry's and not an
idle cost of the server's:

- the tool is a coroutine, as `_bench_provider`'s `echo` is: `MCPServer` runs a plain
  function in a worker thread for every call (`anyio.to_thread`, the right choice only for a
  tool that blocks), a thread hop this tool has no reason to pay;
- its arguments are validated once, by the model `MCPServer` derives from the signature
  (`func_metadata`). The SDK pinned here (mcp 2.3.0) has no `validate_input` switch on the
  lowlevel `Server.call_tool` and checks a call's arguments nowhere else over stdio, so
  there is no second input validation to turn off;
- the return type declares the output schema, which the registry's pipeline checks each
  result against (what an MCP tool with an `outputSchema` costs, as it should be measured).
"""

from __future__ import annotations

import mcp_types
from mcp.server.mcpserver import MCPServer

server = MCPServer("codemode-bench")


@server.tool(annotations=mcp_types.ToolAnnotations(read_only_hint=True))
async def mcp_echo(path: str, limit: int) -> dict[str, object]:
    """Echo the arguments."""
    return {"path": path, "limit": limit}


if __name__ == "__main__":
    server.run()
