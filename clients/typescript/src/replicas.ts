/**
 * Serve every registry replica behind one name: one stream per address, following changes.
 *
 * Several registries can share one store (PostgreSQL): any replica may serve any call, so a tool
 * provider, an approver or a page runner must be connected to all of them, or calls landing on a
 * replica it does not know fail as unknown tools. A load-balanced channel cannot do that (it sends
 * each stream to one backend). `ReplicaSet` resolves the name itself -- every A/AAAA address, as
 * the headless Service of deploy/k8s publishes one per pod -- keeps one client and one served
 * stream per address, and resolves again every `refreshMs`: a new replica is served within that
 * period, a removed one is closed. The same rules as the Python client's `ReplicaSet`.
 *
 *     const provider = new ToolProvider(undefined, "files").tool({ name: "read" }, read);
 *     const replicas = new ReplicaSet("registry.codemode.svc:50051", (c) => provider.onClient(c));
 *     await replicas.serve(); // until replicas.close()
 *
 *     new ReplicaSet(target, (c) => new Approver(c, "oncall", decide));
 *
 * TLS: each client dials an address but verifies the certificate for the name (the target's host
 * is the TLS server name and the `:authority`).
 */
import { lookup } from "node:dns/promises";
import { isIPv6 } from "node:net";
import { RegistryClient, type RegistryClientOptions } from "./registry";

/** A provider or an approver: serves until closed, reconnecting on its own. */
export interface Served {
  serve(): Promise<void>;
  close(): Promise<void>;
}

export interface ReplicaSetOptions extends RegistryClientOptions {
  /** How often the name is resolved again (default 10 s). */
  refreshMs?: number;
  /** Replaces the DNS lookup of the target (a fixed list, service discovery). */
  resolve?: () => Promise<string[]>;
  /** A replica's `serve()` gave up (e.g. a registry refusing the tools); the others go on. */
  onReplicaError?: (address: string, error: unknown) => void;
}

/** `host:port` (`[v6]:port` for IPv6 literals) -> [host, port]; throws otherwise. */
export function splitTarget(target: string): [string, number] {
  const at = target.lastIndexOf(":");
  let host = at > 0 ? target.slice(0, at) : "";
  const port = at > 0 ? target.slice(at + 1) : "";
  if (host === "" || !/^\d+$/.test(port) || Number(port) <= 0 || Number(port) >= 65536) {
    throw new Error(`a replica target must be host:port, not ${JSON.stringify(target)}`);
  }
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  return [host, Number(port)];
}

/** Every address the target's host resolves to (sorted, without duplicates), with its port. */
export async function resolveAll(target: string): Promise<string[]> {
  const [host, port] = splitTarget(target);
  const found = await lookup(host, { all: true });
  const addresses = new Set(found.map((a) => (isIPv6(a.address) ? `[${a.address}]:${port}` : `${a.address}:${port}`)));
  return [...addresses].sort();
}

interface Replica {
  client: RegistryClient;
  served: Served;
  serving: Promise<void>;
}

export class ReplicaSet {
  private readonly host: string;
  private readonly refreshMs: number;
  private readonly resolve: () => Promise<string[]>;
  private readonly replicas = new Map<string, Replica>();
  private closing = false;
  private wake: (() => void) | undefined;
  private firstResolved!: () => void;
  private readonly first = new Promise<void>((resolve) => (this.firstResolved = resolve));

  constructor(
    target: string,
    private readonly make: (client: RegistryClient) => Served,
    private readonly options: ReplicaSetOptions = {},
  ) {
    [this.host] = splitTarget(target);
    this.refreshMs = options.refreshMs ?? 10_000;
    this.resolve = options.resolve ?? (() => resolveAll(target));
  }

  /** The addresses served now. */
  get addresses(): string[] {
    return [...this.replicas.keys()].sort();
  }

  /** Resolves once the first resolution has been applied. */
  resolved(): Promise<void> {
    return this.first;
  }

  /**
   * Serves every replica until `close()`. A failed resolution keeps what is served (a DNS hiccup
   * must not drop live streams) and is tried again next period.
   */
  async serve(): Promise<void> {
    try {
      while (!this.closing) {
        let addresses: string[] | undefined;
        try {
          addresses = await this.resolve();
        } catch (e) {
          console.warn(`cannot resolve the registry replicas: ${e instanceof Error ? e.message : String(e)}`);
        }
        if (addresses !== undefined && !this.closing) {
          await this.apply(new Set(addresses));
          this.firstResolved();
        }
        if (this.closing) break;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, this.refreshMs);
          this.wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
      }
    } finally {
      await this.apply(new Set());
    }
  }

  async close(): Promise<void> {
    this.closing = true;
    this.wake?.();
  }

  private async apply(addresses: Set<string>): Promise<void> {
    for (const address of [...this.replicas.keys()].sort()) {
      if (addresses.has(address)) continue;
      const replica = this.replicas.get(address)!;
      this.replicas.delete(address);
      await replica.served.close();
      await replica.serving;
      replica.client.close();
    }
    for (const address of [...addresses].sort()) {
      if (this.replicas.has(address)) continue;
      const { refreshMs: _r, resolve: _s, onReplicaError: _e, ...clientOptions } = this.options;
      const channelOptions =
        clientOptions.credentials === undefined
          ? clientOptions.channelOptions
          : // Dial the address, verify the name: the certificate names the Service, not a pod IP.
            { "grpc.ssl_target_name_override": this.host, "grpc.default_authority": this.host, ...clientOptions.channelOptions };
      const client = new RegistryClient(address, { ...clientOptions, channelOptions });
      const served = this.make(client);
      const serving = served.serve().catch((e: unknown) => {
        if (this.options.onReplicaError !== undefined) this.options.onReplicaError(address, e);
        else console.error(`serving registry replica ${address} ended: ${e instanceof Error ? e.message : String(e)}`);
      });
      this.replicas.set(address, { client, served, serving });
    }
  }
}
