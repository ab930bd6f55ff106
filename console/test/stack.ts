/** What the console's browser tests share: `codemode console` as a real process, and Chromium. */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type Browser } from "playwright-core";
import { PYTHON, REPO_ROOT, startService, type Service } from "@codemode/client/dist/test/services";

export const CHROMIUM = process.env.CODEMODE_CHROMIUM ?? "/usr/bin/chromium";

export interface RunningConsole {
  /** The printed URL: it carries this start's key. */
  url: string;
  /** `http://127.0.0.1:PORT` */
  origin: string;
  port: number;
  proc: ChildProcess;
  log(): string;
  stop(): Promise<void>;
}

/** Starts `codemode console` and resolves once it printed the URL to open. */
export function startConsole(registry: string, agent: string, extra: string[] = []): Promise<RunningConsole> {
  const proc = spawn(PYTHON, ["-m", "codemode_cli", "console", "--registry", registry, "--agent", agent, ...extra], {
    cwd: REPO_ROOT,
    env: { ...process.env, PYTHONUNBUFFERED: "1" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  const keep = (chunk: Buffer): void => {
    log = (log + chunk.toString()).slice(-20_000);
  };
  proc.stderr!.on("data", keep);
  const stop = async (): Promise<void> => {
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGTERM");
    await exited;
  };
  return new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => reject(new Error(`the console was not ready:\n${log}`)), 60_000);
    proc.stdout!.on("data", (chunk: Buffer) => {
      keep(chunk);
      const match = /console: open (\S+)/.exec(log);
      if (match) {
        clearTimeout(timer);
        const url = new URL(match[1]!);
        resolvePromise({ url: url.href, origin: url.origin, port: Number(url.port), proc, log: () => log, stop });
      }
    });
    proc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the console exited (${code}) before it was ready:\n${log}`));
    });
  });
}

/** Debian's headless Chromium; `args` are added to the usual ones. */
export async function launchChromium(args: string[] = []): Promise<Browser> {
  if (!existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM}: scripts/bootstrap installs Debian's chromium`);
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", ...args],
  });
}

/** A runtime and a registry wired to it whose policy asks a person before any `deploy` call;
 * `registryEnv` adds to the registry's settings. */
export async function startDeployStack(registryEnv: Record<string, string> = {}): Promise<{ runtime: Service; registry: Service }> {
  const rules = join(mkdtempSync(join(tmpdir(), "codemode-console-")), "rules.yaml");
  writeFileSync(rules, "rules:\n  - tool: deploy\n    action: ask\n    reason: deploys need a person\n");
  const runtime = await startService("runtime_service", "runtime listening on port ", { CODEMODE_RUNTIME_POOL_SIZE: "1" });
  const registry = await startService("registry_service", "registry listening on port ", {
    CODEMODE_REGISTRY_RUNTIME_TARGETS: JSON.stringify([`127.0.0.1:${runtime.port}`]),
    CODEMODE_REGISTRY_HISTORY_PATH: ":memory:",
    CODEMODE_REGISTRY_POLICY_RULES: rules,
    ...registryEnv,
  });
  return { runtime, registry };
}
