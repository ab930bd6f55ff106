"""The registry as an MCP client, with the official MCP Python SDK (`mcp`): the adapter behind
the `registry_service.domain.mcp_servers.McpConnector` port. Only this package imports the SDK.

- `stdio_transport`: a declared command as a supervised child (own process group, only the
  environment it is given, an unprivileged user when the registry is root, stderr logged within
  bounds, every message line bounded);
- `http_transport`: streamable HTTP with the attachment's headers and bearer token, response
  bodies bounded;
- `mapping`: MCP tools and results to the catalog's `ToolSpec` and the pipeline's `ToolResult`;
- `connector`: one `ClientSession` per connection, in a task of its own, taking the
  transport's messages at a bounded rate.
"""
