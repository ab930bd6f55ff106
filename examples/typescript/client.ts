// The TypeScript client example: serve a tool, approve calls, run a program, read errors.
// It compiles as a plain `.ts` file of an ordinary CommonJS npm project (no top-level await):
//
//   npm init -y && npm install typescript @types/node /path/to/codemode-client-0.1.0.tgz
//   npx tsc --strict --module node16 --target es2022 --types node client.ts && node client.js 127.0.0.1:50051
//
// Safe to run again against the same registry: the agent is created once and reused.
// It prints (tests/examples/test_examples.py checks these lines):
//
//   nested: read_ts_example ok
//   log: contents of a.txt
//   result: 9007199254740993
//   refused: NOT_FOUND AGENT_NOT_FOUND codemode.registry
import { Approver, CodemodeError, RegistryClient, ToolProvider, type RunCodeValue } from "@codemode/client";

async function main(address: string): Promise<void> {
  const client = new RegistryClient(address, { timeoutMs: 10_000 }); // a deadline on every call

  // Serve tools from plain async functions; closing the provider revokes them.
  const provider = new ToolProvider(client, "example-ts-files").tool(
    {
      name: "read_ts_example",
      description: "Read a file",
      concurrencySafe: true,
      inputSchema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
    },
    async ({ path }: { path: string }, ctx) => {
      ctx.signal.throwIfAborted(); // aborted when the registry cancels the invocation
      return { text: `contents of ${path}`, size: 2n ** 53n + 1n }; // bigint is carried exactly
    },
  );
  await provider.start();
  // Answer approval requests (policy rules with `action: ask`).
  const approver = new Approver(client, "ops", (req) => (req.toolName.startsWith("read_") ? "allow" : "reject"));
  await approver.start();
  try {
    try {
      await client.createAgent("example-ts", { mode: "code" });
    } catch (e) {
      if (!(e instanceof CodemodeError && e.codeName === "ALREADY_EXISTS")) throw e; // a second run
    }
    const call = client.runCode(
      "agents/example-ts",
      "r = await tools.read_ts_example({'path': 'a.txt'})\nprint(r['text'])\nreturn r['size']",
      "Read a.txt",
    );
    for await (const event of call) {
      if (event.type === "nestedSettled") console.log(`nested: ${event.toolName} ${event.isError ? event.errorCode : "ok"}`);
      if (event.type === "log") console.log(`log: ${event.text}`);
    }
    const result = await call.result;
    console.log(`result: ${(result.value as unknown as RunCodeValue).result}`); // a bigint, exact
    try {
      await client.getAgent("agents/missing");
    } catch (e) {
      if (e instanceof CodemodeError) console.log(`refused: ${e.codeName} ${e.reason} ${e.domain}`);
    }
  } finally {
    await approver.close();
    await provider.close();
    client.close();
  }
}

main(process.argv[2] ?? "127.0.0.1:50051").catch((e: unknown) => {
  console.error(e);
  process.exitCode = 1;
});
