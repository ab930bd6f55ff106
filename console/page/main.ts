/** The console page: connects to its bridge and wires the panels to the events. */
import { Activations } from "./activations";
import { ToolApprovals } from "./approvals";
import { Connection } from "./connection";
import { MANIFEST, answerQuery } from "./inspect";
import { ClientSlots } from "./slots";
import { Trajectories } from "./trajectory";

function byId(id: string): HTMLElement {
  const node = document.getElementById(id);
  if (node === null) throw new Error(`the page has no #${id}`);
  return node;
}

async function main(): Promise<void> {
  const status = (text: string): void => {
    byId("status").textContent = text;
  };
  const trajectories = new Trajectories(byId("calls"), byId("messages"));
  let activations: Activations | undefined;
  let approvals: ToolApprovals | undefined;
  const slots = new ClientSlots(byId("slots"));
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
  const connection = await Connection.open(url, (event) => {
    switch (event.type) {
      case "hello":
        byId("agent").textContent = event.agent;
        document.body.dataset.connected = "true";
        status(`attached for ${event.agent}`);
        break;
      case "notice": {
        const item = document.createElement("li");
        item.dataset.stream = event.notice.stream;
        item.textContent = event.notice.message;
        byId("notices").append(item);
        break;
      }
      case "run-requested":
        activations?.requested(event.request);
        break;
      case "run-resolved":
        activations?.resolved(event.requestId, event.outcome);
        break;
      case "tool-approval":
        approvals?.requested(event.request);
        break;
      case "tool-approval-withdrawn":
        approvals?.withdrawn(event.approvalId);
        break;
      case "inspect-query":
        void answerQuery(connection, slots, event.query);
        break;
      case "inspect-query-resolved":
        break;
      case "history":
        activations?.plugins.observe(event.record);
        trajectories.add(event.record);
        break;
    }
  });
  // Created before any event can arrive: messages are dispatched from the event loop, after this.
  activations = new Activations(connection, byId("requests"), slots, byId("plugins"), status);
  approvals = new ToolApprovals(connection, byId("approvals"));
  trajectories.connect(connection);
  const synced = await connection.call("syncManifest", { providersJson: JSON.stringify(MANIFEST) });
  if (!synced.accepted) status(`the registry refused the inspect manifest: ${synced.code} ${synced.message}`);
  connection.onClose(() => {
    document.body.dataset.connected = "false";
    status("the console's bridge went away; reload once it is back");
  });
}

main().catch((e: unknown) => {
  document.getElementById("status")!.textContent = `cannot start: ${String(e)}`;
});
