// An MCP server written with the official TypeScript SDK (`McpServer`), which tests/mcp attaches
// to a scope as a tool provider: `node tool_server.mjs stdio` serves over stdio (a supervised
// child of the registry), `node tool_server.mjs http PORT` over streamable HTTP on 127.0.0.1.
// Its tools: `add` (read-only, with an output schema), `picture` (text and an image), `quote`
// (an embedded resource and a resource link) and `fail` (isError). A value breaking its own
// output schema is not among them: this SDK checks its tools' answers itself (isError).
import http from "node:http";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

// A 1x1 PNG (the same as tests/mcp/mcp_test_server.py's).
const PNG =
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

function build() {
  const server = new McpServer({ name: "codemode-ts-test", version: "0.0.0" });
  server.registerTool(
    "add",
    {
      description: "Adds two integers.",
      inputSchema: { a: z.number().int(), b: z.number().int() },
      outputSchema: { sum: z.number().int() },
      annotations: { readOnlyHint: true },
    },
    async ({ a, b }) => {
      const value = { sum: a + b };
      return { content: [{ type: "text", text: JSON.stringify(value) }], structuredContent: value };
    },
  );
  server.registerTool("picture", { description: "A picture and a caption." }, async () => ({
    content: [
      { type: "text", text: "a red dot" },
      { type: "image", data: PNG, mimeType: "image/png" },
    ],
  }));
  server.registerTool("quote", { description: "A quoted file and a link to it." }, async () => ({
    content: [
      { type: "resource", resource: { uri: "file:///notes.txt", mimeType: "text/plain", text: "hello" } },
      { type: "resource_link", uri: "file:///notes.txt", name: "notes" },
    ],
  }));
  server.registerTool(
    "fail",
    { description: "Always fails.", inputSchema: { why: z.string() } },
    async ({ why }) => ({ content: [{ type: "text", text: `refused: ${why}` }], isError: true }),
  );
  return server;
}

const [mode, port] = process.argv.slice(2);
if (mode === "stdio") {
  await build().connect(new StdioServerTransport());
} else if (mode === "http") {
  // Stateless: a server and a transport per request, as the SDK's examples do.
  const listener = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const text = Buffer.concat(chunks).toString();
    const server = build();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    res.on("close", () => {
      transport.close();
      server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req, res, text ? JSON.parse(text) : undefined);
  });
  listener.listen(Number(port), "127.0.0.1", () => console.log("listening"));
} else {
  console.error("usage: node tool_server.mjs stdio | http PORT");
  process.exit(2);
}
