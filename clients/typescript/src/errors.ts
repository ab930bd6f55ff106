/**
 * The client's one error type for RPC failures: the gRPC code plus the `ErrorInfo` (reason,
 * domain, metadata) and `RetryInfo` the services put in the `grpc-status-details-bin` trailer.
 */
import { Metadata, status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";
import { ErrorInfo, RetryInfo } from "./gen/google/rpc/error_details";
import { Status } from "./gen/google/rpc/status";

const ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo";
const RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo";
const STATUS_TRAILER = "grpc-status-details-bin";

export class CodemodeError extends Error {
  /** The gRPC status code (`status.NOT_FOUND`, ...). */
  readonly code: GrpcStatus;
  /** The status code's name, e.g. `NOT_FOUND`. */
  readonly codeName: string;
  /** `ErrorInfo.reason`, e.g. `AGENT_NOT_FOUND`; empty when the error carried no ErrorInfo. */
  readonly reason: string;
  /** `ErrorInfo.domain`, e.g. `codemode.registry`; empty when absent. */
  readonly domain: string;
  /** `ErrorInfo.metadata`. */
  readonly metadata: Readonly<Record<string, string>>;
  /** The trailing metadata of the failed call, when there was one. */
  readonly grpcMetadata: Metadata | undefined;
  /**
   * Milliseconds after which the same request may succeed, from the status's `RetryInfo`
   * (e.g. a `runCode` that no code runtime took: `UNAVAILABLE`, reason
   * `CODE_RUNTIME_UNAVAILABLE`, metadata `phase: connect`); undefined without RetryInfo.
   */
  readonly retryDelay: number | undefined;

  constructor(
    code: GrpcStatus,
    message: string,
    info: { reason?: string; domain?: string; metadata?: Record<string, string>; retryDelay?: number } = {},
    grpcMetadata?: Metadata,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "CodemodeError";
    this.code = code;
    this.codeName = GrpcStatus[code] ?? String(code);
    this.reason = info.reason ?? "";
    this.domain = info.domain ?? "";
    this.metadata = Object.freeze({ ...(info.metadata ?? {}) });
    this.grpcMetadata = grpcMetadata;
    this.retryDelay = info.retryDelay;
  }

  /** Builds the error from a `google.rpc.Status` (e.g. a registration acknowledgement). */
  static fromStatus(status: Status, grpcMetadata?: Metadata, cause?: unknown): CodemodeError {
    const info = { ...(errorInfoOf(status) ?? {}), retryDelay: retryDelayOf(status) };
    return new CodemodeError(status.code as GrpcStatus, status.message, info, grpcMetadata, { cause });
  }

  /** Converts anything thrown by a grpc-js call; other errors are wrapped as UNKNOWN. */
  static from(error: unknown): CodemodeError {
    if (error instanceof CodemodeError) return error;
    if (isServiceError(error)) {
      const raw = error.metadata?.get(STATUS_TRAILER)[0];
      if (raw !== undefined && typeof raw !== "string") {
        try {
          const status = Status.decode(raw);
          if (status.code === error.code) return CodemodeError.fromStatus(status, error.metadata, error);
        } catch {
          // A malformed trailer: fall back to the plain status below.
        }
      }
      return new CodemodeError(error.code, error.details || error.message, {}, error.metadata, { cause: error });
    }
    const message = error instanceof Error ? error.message : String(error);
    return new CodemodeError(GrpcStatus.UNKNOWN, message, {}, undefined, { cause: error });
  }
}

/** The first `ErrorInfo` detail of a rich status, if any. */
export function errorInfoOf(status: Status): ErrorInfo | undefined {
  for (const detail of status.details) {
    if (detail.typeUrl === ERROR_INFO_TYPE) return ErrorInfo.decode(detail.value);
  }
  return undefined;
}

/** The delay of the first `RetryInfo` detail of a rich status, in milliseconds, if any. */
export function retryDelayOf(status: Status): number | undefined {
  for (const detail of status.details) {
    if (detail.typeUrl !== RETRY_INFO_TYPE) continue;
    const delay = RetryInfo.decode(detail.value).retryDelay;
    return delay === undefined ? 0 : Number(delay.seconds) * 1000 + delay.nanos / 1e6;
  }
  return undefined;
}

function isServiceError(error: unknown): error is ServiceError {
  return (
    error instanceof Error &&
    typeof (error as Partial<ServiceError>).code === "number" &&
    (error as Partial<ServiceError>).metadata instanceof Metadata
  );
}
