// The official TypeScript MCP client against `codemode mcp serve` over stdio, driven by
// tests/mcp_serve/test_typescript_client.py: it lists the tools, runs one program with progress,
// makes one failing call, and prints what it saw as one JSON object.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = JSON.parse(process.env.MCP_SERVE_ARGV);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
const client = new Client({ name: "codemode-ts-test", version: "0.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
const progress = [];
const result = await client.callTool(
  { name: "run_code", arguments: { code: process.env.MCP_PROGRAM, description: "from TypeScript" } },
  undefined,
  { onprogress: (p) => progress.push(p) },
);
const failed = await client.callTool({ name: "double", arguments: { n: 1 } });
await client.close();
console.log(
  JSON.stringify({
    instructions: client.getInstructions() ?? null,
    tools: tools.map((t) => ({ name: t.name, description: t.description })),
    result,
    failed,
    progress,
  }),
);
