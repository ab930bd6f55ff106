/**
 * What `ToolProvider.serve()` and `Approver.serve()` share: a settle-once promise for a stream's
 * end, and the loop that opens a lost stream again.
 */
import { status as GrpcStatus, type ClientDuplexStream } from "@grpc/grpc-js";
import { CodemodeError } from "./errors";

export interface ServeOptions {
  /** Longest pause in ms before opening again a stream that failed at once (default 10 000). */
  maxDelayMs?: number;
}

export interface Deferred<T> {
  promise: Promise<T>;
  settled: boolean;
  settle(value: T): void;
}

export function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const d: Deferred<T> = {
    promise: new Promise<T>((r) => (resolve = r)),
    settled: false,
    settle(value) {
      if (d.settled) return;
      d.settled = true;
      resolve(value);
    },
  };
  return d;
}

/** One bidi stream's state: open (`opened` until the registry acknowledges it), ending, ended. */
export class DuplexStream<Req, Res> {
  ended = false;
  closing = false;
  opened: { resolve: (id: string) => void; reject: (e: unknown) => void } | undefined;

  constructor(
    readonly call: ClientDuplexStream<Req, Res>,
    /** Settled when the stream ends: `undefined` after `close()` or a clean end, else the error. */
    readonly done: Deferred<CodemodeError | undefined>,
  ) {}

  write(message: Req): void {
    if (!this.ended) this.call.write(message);
  }
}

/** Codes no reconnection can fix (a wrong target, missing credentials): `serve()` ends with them. */
const PERMANENT = new Set<GrpcStatus>([
  GrpcStatus.INVALID_ARGUMENT,
  GrpcStatus.UNAUTHENTICATED,
  GrpcStatus.PERMISSION_DENIED,
  GrpcStatus.UNIMPLEMENTED,
]);

const FIRST_DELAY_MS = 50;

/**
 * Opens a stream (`open` resolves once it is open, with the promise of its end) again whenever it ends, until
 * `stop()`. `fatal` turns an error of `open` into the error `done` rejects with (e.g. a refused
 * registration), or returns undefined to treat it like a lost stream; `onEnd` runs as `done`
 * settles, before anything awaiting `done` resumes.
 */
export class Reconnector {
  readonly done: Promise<void>;
  private stopped = false;
  /** Ends the pause between two attempts (`stop()` does not wait it out). */
  private wake: () => void = () => undefined;

  constructor(
    private readonly open: () => Promise<{ ended: Promise<CodemodeError | undefined> }>,
    private readonly maxDelayMs: number,
    private readonly fatal: (e: unknown) => Error | undefined = () => undefined,
    onEnd: () => void = () => undefined,
  ) {
    this.done = this.run().finally(onEnd);
  }

  stop(): void {
    this.stopped = true;
    this.wake();
  }

  private async run(): Promise<void> {
    let delayMs = Math.min(FIRST_DELAY_MS, this.maxDelayMs);
    while (!this.stopped) {
      let lost: CodemodeError | undefined;
      try {
        const { ended } = await this.open();
        delayMs = Math.min(FIRST_DELAY_MS, this.maxDelayMs);
        lost = await ended;
      } catch (e) {
        const fatal = this.fatal(e);
        if (fatal !== undefined) throw fatal; // retrying changes nothing
        if (!(e instanceof CodemodeError)) throw e; // not the stream's failure (e.g. a closed client)
        lost = e;
      }
      if (this.stopped) return;
      if (lost !== undefined && PERMANENT.has(lost.code)) throw lost;
      // Only a stream that failed at once comes back here quickly: a pause (jittered, doubling up
      // to maxDelayMs) keeps a refusing registry from being hammered. Waiting for a registry to
      // be reachable at all is the channel's business (waitForReady, its reconnect backoff).
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, delayMs * (0.5 + Math.random() / 2));
        this.wake = () => (clearTimeout(timer), resolve());
      });
      delayMs = Math.min(delayMs * 2, this.maxDelayMs);
    }
  }
}
