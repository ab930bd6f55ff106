/** The page's end of the bridge's WebSocket: verbs answered by replies, and pushed events. */
import type { ClientMessage, ServerMessage, VerbName, Verbs } from "../src/protocol";

type Event = Exclude<ServerMessage, { type: "reply" }>;

export class Connection {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private listener: (event: Event) => void = () => undefined;

  private constructor(private readonly socket: WebSocket) {
    socket.addEventListener("message", (e: MessageEvent<string>) => this.onMessage(JSON.parse(e.data) as ServerMessage));
    socket.addEventListener("close", () => {
      for (const { reject } of this.pending.values()) reject(new Error("the console's bridge went away"));
      this.pending.clear();
    });
  }

  /** Opens the socket; events that arrive before `onEvent` is set are delivered to it. */
  static open(url: string, onEvent: (event: Event) => void): Promise<Connection> {
    const socket = new WebSocket(url);
    const connection = new Connection(socket);
    connection.listener = onEvent;
    return new Promise((resolve, reject) => {
      socket.addEventListener("open", () => resolve(connection), { once: true });
      socket.addEventListener("error", () => reject(new Error(`cannot reach ${url}`)), { once: true });
    });
  }

  onClose(fn: () => void): void {
    this.socket.addEventListener("close", fn);
  }

  /** One verb; rejects when the bridge could not carry it (the registry's refusals resolve). */
  call<V extends VerbName>(verb: V, args: Verbs[V]["args"]): Promise<Verbs[V]["result"]> {
    const id = this.nextId++;
    const message: ClientMessage<V> = { id, verb, args };
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.socket.send(JSON.stringify(message));
    });
  }

  private onMessage(message: ServerMessage): void {
    if (message.type !== "reply") {
      this.listener(message);
      return;
    }
    const pending = this.pending.get(message.id);
    this.pending.delete(message.id);
    if (message.ok) pending?.resolve(message.result);
    else pending?.reject(new Error(message.error));
  }
}
