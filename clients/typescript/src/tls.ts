/** TLS toward the registry from PEM files' contents, for `RegistryClientOptions.credentials`. */
import { credentials, type ChannelCredentials } from "@grpc/grpc-js";

export type { ChannelCredentials };

export interface TlsMaterial {
  /** Trusted roots for the registry's certificate (default: the system's). */
  ca?: Buffer;
  /** A client certificate and its key, together (mutual TLS). */
  cert?: Buffer;
  key?: Buffer;
}

export function tlsCredentials(tls: TlsMaterial): ChannelCredentials {
  if ((tls.cert === undefined) !== (tls.key === undefined)) throw new Error("a client certificate and its key go together");
  return credentials.createSsl(tls.ca ?? null, tls.key ?? null, tls.cert ?? null);
}
