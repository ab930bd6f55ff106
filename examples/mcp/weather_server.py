"""An MCP server you already have: one tool, written with the official MCP Python SDK.

    python examples/mcp/weather_server.py 8765      # streamable HTTP on 127.0.0.1:8765/mcp

The registry connects to it as a tool provider (examples/mcp/registry.yaml declares it), so
its tool reaches a `code` agent's programs as a typed binding, through the same pipeline as
any other tool.
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

FORECASTS = {"paris": "sunny, 21 °C", "oslo": "snow, -3 °C"}


def build() -> MCPServer:
    server = MCPServer("weather")

    @server.tool()
    def forecast(city: str) -> dict[str, str]:
        """Tomorrow's weather for a city."""
        return {"city": city, "weather": FORECASTS.get(city.lower(), "no forecast")}

    return server


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    build().run(transport="streamable-http", host="127.0.0.1", port=port)
