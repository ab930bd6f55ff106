/**
 * `node dist/src/main.js --registry HOST:PORT --agent agents/x [--port N]`: the console's bridge
 * (what `codemode console` starts). Prints `console listening on <url>` once it serves, and
 * runs until SIGINT/SIGTERM.
 */
import { parseArgs } from "node:util";
import { ConsoleBridge } from "./bridge";

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      registry: { type: "string", default: "127.0.0.1:50051" },
      agent: { type: "string" },
      port: { type: "string", default: "0" },
    },
  });
  if (!values.agent) throw new Error("--agent is required");
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--port ${values.port} is not a port`);
  const bridge = new ConsoleBridge({ registry: values.registry!, agent: values.agent, port });
  const url = await bridge.start();
  // The first line is the one `codemode up` learns the port from, as from the services.
  console.log(`console listening on port ${new URL(url).port}`);
  console.log(`console: open ${url} (page runner, approver and history for ${bridge.agent})`);
  const stop = (): void => {
    bridge.close().then(
      () => process.exit(process.exitCode ?? 0),
      () => process.exit(1),
    );
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  void bridge.lost.then((error) => {
    console.error(`console: the page-runner stream to ${values.registry!} ended: ${error.message}`);
    process.exitCode = 1;
    stop();
  });
}

main().catch((e: unknown) => {
  console.error(`console: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(2);
});
