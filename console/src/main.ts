/**
 * `node dist/src/main.js --registry HOST:PORT --agent agents/x [--port N] [--bind ADDR]
 * [--tls-ca PEM [--tls-cert PEM --tls-key PEM]] [--token-file FILE]`: the console's bridge (what
 * `codemode console` starts). Prints `console listening on port <n>`, then the URL to open (it
 * carries this start's key), and runs until SIGINT/SIGTERM.
 *
 * The credentials are the principal the console acts as toward the registry: a bearer token read
 * from a file (never a command-line argument, which other users can list) and TLS material.
 */
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import { parseArgs } from "node:util";
import { tlsCredentials, type ChannelCredentials } from "@codemode/client";
import { ConsoleBridge } from "./bridge";

function read(option: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (e) {
    throw new Error(`${option}: cannot read ${path}: ${e instanceof Error ? e.message : String(e)}`);
  }
}

function credentialsOf(values: { "tls-ca"?: string; "tls-cert"?: string; "tls-key"?: string }): ChannelCredentials | undefined {
  const { "tls-ca": ca, "tls-cert": cert, "tls-key": key } = values;
  if ((cert === undefined) !== (key === undefined)) throw new Error("--tls-cert and --tls-key go together");
  if (ca === undefined && cert === undefined) return undefined;
  return tlsCredentials({
    ca: ca === undefined ? undefined : read("--tls-ca", ca),
    cert: cert === undefined ? undefined : read("--tls-cert", cert),
    key: key === undefined ? undefined : read("--tls-key", key),
  });
}

function bearerOf(path: string | undefined): Record<string, string> | undefined {
  if (path === undefined) return undefined;
  const token = read("--token-file", path).toString("utf8").trim();
  if (token === "" || /\s/.test(token)) throw new Error(`--token-file: ${path} must hold one token (no spaces)`);
  return { authorization: `Bearer ${token}` };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      registry: { type: "string", default: "127.0.0.1:50051" },
      agent: { type: "string" },
      port: { type: "string", default: "0" },
      bind: { type: "string", default: "127.0.0.1" },
      "tls-ca": { type: "string" },
      "tls-cert": { type: "string" },
      "tls-key": { type: "string" },
      "token-file": { type: "string" },
    },
  });
  if (!values.agent) throw new Error("--agent is required");
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--port ${values.port} is not a port`);
  const bind = values.bind!;
  // The page's Host and Origin checks need the one address it is reached by.
  if (isIP(bind) === 0 || bind === "0.0.0.0" || bind === "::") throw new Error(`--bind ${bind}: name one IP address, not a wildcard`);
  const bridge = new ConsoleBridge({
    registry: values.registry!,
    agent: values.agent,
    port,
    bind,
    credentials: credentialsOf(values),
    metadata: bearerOf(values["token-file"]),
  });
  const url = await bridge.start();
  // The first line is the one `codemode up` learns the port from, as from the services.
  console.log(`console listening on port ${new URL(url).port}`);
  if (!bind.startsWith("127.") && bind !== "::1") {
    console.error(`console: WARNING: serving on ${bind}, not loopback: whoever learns the URL (sent in plaintext) drives ${bridge.agent}`);
  }
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
