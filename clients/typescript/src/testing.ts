/**
 * `@codemode/client/testing`: test your agents against a real registry and runtime with
 * `node:test` (docs/clients.md, "Testing your agents"; the Python client's
 * `codemode_client.testing` is the same kit for pytest).
 *
 * - `startServices()` runs `codemode up` on free loopback ports (port 0: each service binds one
 *   itself) with history and traces in a temporary folder, and `stop()` ends it by pid, then any
 *   of its services still alive.
 * - `useCodemode()` registers `node:test` hooks: the services for the file, a `Testbed` per test
 *   (a client, fresh agents, in-process tool providers; removed after the test).
 * - `TurnScript` plays a scripted model's turns through `ExecuteToolCall`: `runCode(program)`,
 *   `callTool(name, args)`, `answer(text)`, or a function of the conversation so far.
 * - `Trajectory` is one call's nested calls as the history recorded them, with assertions whose
 *   failures draw the calls.
 *
 * The services come from the `codemode` command of an environment that has the servers:
 * `command`, else `$CODEMODE_TESTING_COMMAND` (e.g. `/path/to/venv/bin/codemode` or
 * `python -m codemode_cli`), else `codemode` on PATH.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { accessSync, constants, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { after, afterEach, before, beforeEach } from "node:test";
import { CodemodeError } from "./errors";
import { parseJson, stringifyJson, type JsonValue } from "./json";
import { ToolProvider } from "./provider";
import { RegistryClient, type CodeLanguage, type HistoryEntry, type Mode, type ToolCallResult } from "./registry";

export const COMMAND_VARIABLE = "CODEMODE_TESTING_COMMAND";

export interface ServicesOptions {
  /** The argv that runs `codemode` (default: see the module's comment). */
  command?: string[];
  /** Extra settings (`CODEMODE_REGISTRY_*`, `CODEMODE_RUNTIME_*`). */
  env?: Record<string, string>;
  /** Where history, traces and the services' working directory go (default: a new temp dir). */
  workdir?: string;
  timeoutMs?: number;
}

export interface CodemodeServices {
  /** The registry's `host:port`. */
  address: string;
  runtimes: string[];
  workdir: string;
  /** The `codemode up` supervisor's pid and its services' (registry, runtimes). */
  pid: number;
  servicePids: number[];
  /** The last lines `codemode up` printed. */
  output(): string;
  /** SIGTERM to `codemode up` (registry first, then runtimes); SIGKILL after the grace. */
  stop(graceMs?: number): Promise<void>;
}

/** The `codemode` command to run (throws a clear error when there is none). */
export function codemodeCommand(command?: string[]): string[] {
  if (command !== undefined && command.length > 0) return command;
  const fromEnv = process.env[COMMAND_VARIABLE]?.trim();
  if (fromEnv) return fromEnv.split(/\s+/);
  const onPath = (process.env.PATH ?? "").split(":").some((dir) => {
    try {
      accessSync(join(dir || ".", "codemode"), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
  if (onPath) return ["codemode"];
  throw new Error(
    `the testing kit starts the services with the \`codemode\` command, which is not installed here: ` +
      `install the \`codemode\` Python package, or set ${COMMAND_VARIABLE} (e.g. /path/to/venv/bin/codemode)`,
  );
}

function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

function children(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** Starts `codemode up` and resolves once its registry serves (rejects, with its output, if not). */
export async function startServices(options: ServicesOptions = {}): Promise<CodemodeServices> {
  const [program, ...args] = codemodeCommand(options.command);
  const workdir = options.workdir ?? mkdtempSync(join(tmpdir(), "codemode-"));
  const timeoutMs = options.timeoutMs ?? 120_000;
  const argv = [...args, "up", "--registry-listen", "127.0.0.1:0", "--runtime-listen", "127.0.0.1:0", "--runtimes", "1"];
  const proc: ChildProcess = spawn(program, argv, {
    cwd: workdir,
    env: {
      ...process.env,
      PYTHONUNBUFFERED: "1",
      CODEMODE_REGISTRY_HISTORY_PATH: join(workdir, "history.sqlite3"),
      CODEMODE_REGISTRY_TRACE_FILE: join(workdir, "traces.jsonl"),
      CODEMODE_RUNTIME_TRACE_FILE: join(workdir, "traces.jsonl"),
      ...options.env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let lines: string[] = [];
  const runtimes: string[] = [];
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  const services: CodemodeServices = {
    address: "",
    runtimes,
    workdir,
    pid: proc.pid ?? -1,
    servicePids: [],
    output: () => lines.join("\n"),
    async stop(graceMs = 45_000) {
      if (proc.exitCode === null && proc.signalCode === null) {
        const timer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
        proc.kill("SIGTERM");
        await exited;
        clearTimeout(timer);
      }
      for (const pid of services.servicePids) {
        if (!alive(pid)) continue;
        try {
          process.kill(pid, "SIGKILL"); // `up` was killed before it stopped them
        } catch {
          // gone in the meantime
        }
      }
    },
  };
  return new Promise<CodemodeServices>((resolve, reject) => {
    let buffered = "";
    const fail = (problem: string): void => {
      clearTimeout(timer);
      void services.stop().then(() => reject(new Error(`${[program, ...argv].join(" ")} ${problem}:\n  ${lines.slice(-20).join("\n  ")}`)));
    };
    const timer = setTimeout(() => fail(`was not ready after ${timeoutMs} ms`), timeoutMs);
    const onData = (chunk: Buffer): void => {
      buffered += chunk.toString();
      let newline: number;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        lines = [...lines.slice(-199), line];
        if (line.startsWith("runtime") && line.includes(" listening on ")) runtimes.push(line.split(" ").at(-1)!);
        else if (line.startsWith("registry listening on ") && !services.address) {
          // `codemode up` prints it once its runtimes and the registry all serve.
          clearTimeout(timer);
          services.address = line.slice("registry listening on ".length);
          services.servicePids = children(services.pid);
          resolve(services);
        }
      }
    };
    proc.stdout!.on("data", onData);
    proc.stderr!.on("data", (chunk: Buffer) => (lines = [...lines, ...chunk.toString().trimEnd().split("\n")].slice(-200)));
    proc.once("exit", (code, signal) => {
      if (!services.address) fail(`exited (${code ?? signal}) before it was ready`);
    });
    proc.once("error", (e) => fail(`could not start: ${e.message}`));
  });
}

// -- the scripted model ---------------------------------------------------------------------

export type Turn =
  | { kind: "runCode"; program: string; description: string }
  | { kind: "callTool"; name: string; arguments: JsonValue }
  | { kind: "answer"; text: string };
export type ScriptedTurn = Turn | ((conversation: Conversation) => Turn);

/** The model calls `run_code` with this program. */
export const runCode = (program: string, description = "a scripted program"): Turn => ({ kind: "runCode", program, description });
/** The model calls a tool directly. */
export const callTool = (name: string, args: JsonValue = {}): Turn => ({ kind: "callTool", name, arguments: args });
/** The model answers: the conversation ends. */
export const answer = (text: string): Turn => ({ kind: "answer", text });

export interface Step {
  turn: Turn;
  callId: string;
  result: ToolCallResult;
}

export interface Conversation {
  agent: string;
  /** The tool names on the wire when it started (under `code`: `run_code`). */
  offered: string[];
  steps: Step[];
  answer: string | undefined;
}

/** A model that takes the given turns in order, executing each tool call as a model loop would. */
export class TurnScript {
  private readonly turns: ScriptedTurn[];

  constructor(...turns: ScriptedTurn[]) {
    this.turns = turns;
  }

  async play(client: RegistryClient, agent: string): Promise<Conversation> {
    const offered = (await client.getWireSchemas(agent)).schemas.map((s) => s.name);
    const conversation: Conversation = { agent, offered, steps: [], answer: undefined };
    for (const [index, scripted] of this.turns.entries()) {
      if (conversation.answer !== undefined) throw new Error(`turn ${index + 1} comes after the answer`);
      const turn = typeof scripted === "function" ? scripted(conversation) : scripted;
      if (turn.kind === "answer") {
        conversation.answer = turn.text;
        continue;
      }
      const callId = `turn-${index + 1}-${Math.random().toString(16).slice(2, 10)}`;
      const call =
        turn.kind === "runCode"
          ? client.runCode(agent, turn.program, turn.description, { callId })
          : client.executeToolCall({ agent, callId, toolName: turn.name, arguments: turn.arguments });
      conversation.steps.push({ turn, callId, result: await call.result });
    }
    return conversation;
  }
}

// -- trajectories ---------------------------------------------------------------------------

export interface NestedCall {
  callId: string;
  toolName: string;
  arguments: JsonValue | undefined;
  settled: boolean;
  isError: boolean;
  errorCode: string;
  /** What the call returned as the history shows it (a value: its JSON; a failure: its message). */
  text: string;
}

export interface Expected {
  toolName: string;
  arguments?: JsonValue;
  /** A string is compared with the recorded text, anything else with it read as JSON. */
  result?: JsonValue;
  /** "" expects a success; a code expects a failure with it. */
  errorCode?: string;
}

/** One nested call `assertNested` expects (fields left out are not checked). */
export const expectCall = (toolName: string, fields: Omit<Expected, "toolName"> = {}): Expected => ({ toolName, ...fields });

const textOf = (record: HistoryEntry): string =>
  record.content.flatMap((b) => (b.block?.$case === "text" ? [b.block.value.text] : [])).join("\n");

function short(value: unknown, limit = 80): string {
  const text = (typeof value === "string" ? value : stringifyJson(value ?? null)).replace(/\n/g, "\\n");
  return text.length <= limit ? text : `${text.slice(0, limit - 1)}…`;
}

function recordedValue(text: string): JsonValue {
  try {
    return parseJson(text);
  } catch {
    return text;
  }
}

export class Trajectory {
  private constructor(
    readonly callId: string,
    readonly toolName: string,
    readonly finished: boolean,
    readonly isError: boolean,
    readonly errorCode: string,
    readonly text: string,
    readonly nested: NestedCall[],
    readonly records: HistoryEntry[],
  ) {}

  /** Reads the call's records (written before its result was returned). */
  static async load(client: RegistryClient, agent: string, callId: string): Promise<Trajectory> {
    const records: HistoryEntry[] = [];
    let pageToken = "";
    do {
      const page = await client.listHistory(agent, { callId, pageSize: 500, pageToken });
      records.push(...page.records);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return Trajectory.fromRecords(records, callId);
  }

  static fromRecords(records: HistoryEntry[], callId: string): Trajectory {
    const call = records.find((r) => r.callId === callId && r.kind === "tool/call");
    if (call === undefined) throw new Error(`no tool/call record of call ${callId} in the history`);
    const result = records.find((r) => r.callId === callId && r.kind === "tool/result");
    const settles = new Map(records.filter((r) => r.kind === "tool/code-dispatch" && r.parentCallId === callId).map((r) => [r.callId, r]));
    const nested = records
      .filter((r) => r.kind === "tool/code-dispatch-start" && r.parentCallId === callId)
      .map((start): NestedCall => {
        const settle = settles.get(start.callId);
        return {
          callId: start.callId,
          toolName: start.toolName,
          arguments: start.arguments,
          settled: settle !== undefined,
          isError: settle?.isError ?? false,
          errorCode: settle?.errorCode ?? "",
          text: settle === undefined ? "" : textOf(settle),
        };
      });
    return new Trajectory(callId, call.toolName, result !== undefined, result?.isError ?? false, result?.errorCode ?? "", result ? textOf(result) : "", nested, records);
  }

  get tools(): string[] {
    return this.nested.map((c) => c.toolName);
  }

  get kinds(): string[] {
    return this.records.map((r) => r.kind);
  }

  /** The trajectory as an indented tree, one line per call. */
  render(): string {
    const outcome = !this.finished ? "no result recorded" : this.isError ? `error ${this.errorCode}: ${short(this.text)}` : `-> ${short(this.text)}`;
    const lines = [`${this.toolName} ${this.callId} ${outcome}`];
    this.nested.forEach((c, i) => {
      const how = !c.settled ? "never settled" : c.isError ? `error ${c.errorCode}: ${short(c.text)}` : `-> ${short(c.text)}`;
      lines.push(`  ${i + 1}. ${c.callId} ${c.toolName} ${short(c.arguments)} ${how}`);
    });
    if (this.nested.length === 0) lines.push("  (no nested calls)");
    return lines.join("\n");
  }

  private fail(message: string): Error {
    return new Error(`${message}\ntrajectory:\n${this.render()}`);
  }

  /** The program made exactly these nested calls, in this order (a string: just the tool). */
  assertNested(...expected: (Expected | string)[]): void {
    const wanted = expected.map((e) => (typeof e === "string" ? expectCall(e) : e));
    const problems: string[] = [];
    wanted.forEach((want, i) => {
      const call = this.nested[i];
      if (call === undefined) return;
      const at = `  call ${i + 1} (${call.callId}):`;
      if (call.toolName !== want.toolName) problems.push(`${at} tool ${call.toolName}, expected ${want.toolName}`);
      if (want.arguments !== undefined && !isDeepStrictEqual(call.arguments, want.arguments))
        problems.push(`${at} arguments ${short(call.arguments)}, expected ${short(want.arguments)}`);
      if (want.errorCode !== undefined && (call.isError !== (want.errorCode !== "") || call.errorCode !== want.errorCode))
        problems.push(`${at} ${call.isError ? `error ${call.errorCode}` : "success"}, expected ${want.errorCode ? `error ${want.errorCode}` : "success"}`);
      if (want.result !== undefined) {
        const recorded = typeof want.result === "string" ? call.text : recordedValue(call.text);
        if (!isDeepStrictEqual(recorded, want.result)) problems.push(`${at} result ${short(recorded)}, expected ${short(want.result)}`);
      }
    });
    if (wanted.length !== this.nested.length) problems.push(`  ${this.nested.length} nested calls, expected ${wanted.length}`);
    if (problems.length > 0) throw this.fail(`nested calls of ${this.callId} differ:\n${problems.join("\n")}`);
  }

  /** The outer call and result and every nested call's start and settle are recorded, in order. */
  assertRecorded(): void {
    const problems: string[] = [];
    const at = (kind: string, callId: string): number => this.records.findIndex((r) => r.kind === kind && r.callId === callId);
    const end = at("tool/result", this.callId);
    if (at("tool/call", this.callId) < 0 || end < 0) problems.push(`the outer tool/call/tool/result pair is incomplete: ${this.kinds.join(", ")}`);
    for (const call of this.nested) {
      const start = at("tool/code-dispatch-start", call.callId);
      const settle = at("tool/code-dispatch", call.callId);
      if (settle < 0) problems.push(`${call.callId} has no tool/code-dispatch record`);
      else if (!(start < settle && (end < 0 || settle < end))) problems.push(`${call.callId}'s records are out of order`);
    }
    if (problems.length > 0) throw this.fail(`history records:\n  ${problems.join("\n  ")}`);
  }
}

// -- the testbed and node:test hooks -------------------------------------------------------

/** A test's view of the services: a client, fresh agents and in-process tool providers. */
export class Testbed {
  readonly client: RegistryClient;
  private readonly providers: ToolProvider[] = [];
  private readonly agents: string[] = [];

  constructor(readonly address: string) {
    this.client = new RegistryClient(address);
  }

  /** Creates an agent (default: a fresh `test-<random>` in `code` mode); deleted by `close()`. */
  async agent(options: { name?: string; mode?: Mode; codeLanguage?: CodeLanguage; preset?: string } = {}): Promise<string> {
    const id = options.name ?? `test-${Math.random().toString(16).slice(2, 12)}`;
    const created = await this.client.createAgent(id, { mode: options.mode ?? "code", codeLanguage: options.codeLanguage, preset: options.preset });
    this.agents.push(created.name);
    return created.name;
  }

  /** A `ToolProvider` served from this process: declare tools with `.tool(...)`, then `start()`. */
  provider(name = `test-tools-${Math.random().toString(16).slice(2, 10)}`): ToolProvider {
    const provider = new ToolProvider(this.client, name);
    this.providers.push(provider);
    return provider;
  }

  play(agent: string, ...turns: ScriptedTurn[]): Promise<Conversation> {
    return new TurnScript(...turns).play(this.client, agent);
  }

  trajectory(agent: string, callId: string): Promise<Trajectory> {
    return Trajectory.load(this.client, agent, callId);
  }

  async close(): Promise<void> {
    for (const provider of this.providers) await provider.close();
    for (const agent of this.agents) {
      try {
        await this.client.deleteAgent(agent);
      } catch (e) {
        if (!(e instanceof CodemodeError)) throw e; // the test deleted it already
      }
    }
    this.client.close();
  }
}

/**
 * Registers `node:test` hooks in the calling file (or `describe`): the services before its
 * tests, a fresh `Testbed` around each test, the services stopped after them.
 */
export function useCodemode(options: ServicesOptions = {}): { readonly services: CodemodeServices; readonly testbed: Testbed } {
  let services: CodemodeServices | undefined;
  let testbed: Testbed | undefined;
  before(async () => {
    services = await startServices(options);
  });
  beforeEach(() => {
    testbed = new Testbed(services!.address);
  });
  afterEach(async () => {
    await testbed?.close();
    testbed = undefined;
  });
  after(async () => {
    await services?.stop();
  });
  return {
    get services(): CodemodeServices {
      if (services === undefined) throw new Error("the services start in `before`: use them inside a test");
      return services;
    },
    get testbed(): Testbed {
      if (testbed === undefined) throw new Error("a testbed exists only while a test runs");
      return testbed;
    },
  };
}
