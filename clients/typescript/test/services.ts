/** Starts the real runtime and registry (Python) on 127.0.0.1:0 for the integration tests. */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer } from "node:net";
import { resolve } from "node:path";
import { RegistryClient } from "../src/index";

// dist/test/services.js → the package root is two levels up; the repository root two more.
export const PACKAGE_ROOT = resolve(__dirname, "..", "..");
export const REPO_ROOT = resolve(PACKAGE_ROOT, "..", "..");
export const PYTHON = process.env.CODEMODE_PYTHON ?? resolve(PACKAGE_ROOT, "..", "..", ".venv", "bin", "python");

export interface Service {
  port: number;
  proc: ChildProcess;
  output(): string;
}

/**
 * Spawns `python -m <module> --listen 127.0.0.1:<port> <args...>` (default port 0: any free
 * one) and waits for `<ready><port>` on stdout.
 */
export function startService(
  module: string,
  ready: string,
  env: Record<string, string> = {},
  timeoutMs = 30_000,
  port = 0,
  args: string[] = [],
): Promise<Service> {
  if (!existsSync(PYTHON)) throw new Error(`no Python at ${PYTHON} (run scripts/bootstrap or set CODEMODE_PYTHON)`);
  const proc = spawn(PYTHON, ["-m", module, "--listen", `127.0.0.1:${port}`, ...args], {
    cwd: REPO_ROOT,
    env: { ...process.env, PYTHONUNBUFFERED: "1", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  const keep = (chunk: Buffer): void => {
    log = (log + chunk.toString()).slice(-20_000);
  };
  proc.stderr!.on("data", keep);
  return new Promise<Service>((resolvePromise, reject) => {
    let buffered = "";
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`${module} was not ready within ${timeoutMs} ms:\n${log}`));
    }, timeoutMs);
    proc.stdout!.on("data", (chunk: Buffer) => {
      keep(chunk);
      buffered += chunk.toString();
      const match = new RegExp(`${ready}(\\d+)`).exec(buffered);
      if (match) {
        clearTimeout(timer);
        buffered = "";
        resolvePromise({ port: Number(match[1]), proc, output: () => log });
      }
    });
    proc.on("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${module} exited (${code ?? signal}) before it was ready:\n${log}`));
    });
  });
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves when the process has exited. */
export function stopService(service: Service | undefined, graceMs = 10_000): Promise<void> {
  const proc = service?.proc;
  if (proc === undefined || proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolvePromise) => {
    const timer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
    proc.once("exit", () => {
      clearTimeout(timer);
      resolvePromise();
    });
    proc.kill("SIGTERM");
  });
}

/** A port free on 127.0.0.1 right now, for a service that must come back on the same address. */
export function freePort(): Promise<number> {
  return new Promise((resolvePromise, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address !== null ? resolvePromise(address.port) : reject(new Error("no port"))));
    });
  });
}

/** A registry (no runtime, in-memory history) listening on 127.0.0.1:`port`, with extra settings in `env`. */
export function startRegistry(port: number, env: Record<string, string> = {}): Promise<Service> {
  return startService("registry_service", "registry listening on port ", { CODEMODE_REGISTRY_HISTORY_PATH: ":memory:", ...env }, 30_000, port);
}

/**
 * A client for tests of registry restarts: reaching a registry again is the channel's job, and
 * its reconnect backoff is shortened so that a restart is noticed quickly instead of waited out.
 */
export function quicklyReconnectingClient(port: number): RegistryClient {
  return new RegistryClient(`127.0.0.1:${port}`, {
    timeoutMs: 10_000,
    executeTimeoutMs: 30_000,
    channelOptions: { "grpc.initial_reconnect_backoff_ms": 100, "grpc.max_reconnect_backoff_ms": 200 },
  });
}

/** The scripted model (codemode_cli/scripted_model.py) serving `script` on 127.0.0.1. */
export function startScriptedModel(scriptFile: string): Promise<Service> {
  return startService("codemode_cli.scripted_model", "scripted model listening on port ", {}, 30_000, 0, ["--script", scriptFile]);
}
