/**
 * The console's client inspect providers (`Slots.listSubTree`,
 * `Theme.listTokens`): the manifest the page syncs when it connects, and its answers to the
 * model's `cordis_inspect_query` calls with `platform: "client"`. The registry validates the
 * input before asking and the answer against the output schema; the first valid answer of any
 * page wins.
 */
import type { InspectQueryView } from "../src/protocol";
import type { Connection } from "./connection";
import { STYLES, type ClientSlots } from "./slots";

const STRING = { type: "string" };

export const MANIFEST = [
  {
    id: "Slots",
    description: "The page's plugin slots: which Client half runs where.",
    methods: [
      {
        name: "listSubTree",
        description: "Each slot (optionally one plugin's): its plugin, run, state and rendered text.",
        inputSchema: { type: "object", properties: { pluginId: STRING } },
        outputSchema: {
          type: "object",
          properties: {
            slots: {
              type: "array",
              items: {
                type: "object",
                properties: { pluginId: STRING, pluginRunId: STRING, state: STRING, text: STRING },
                required: ["pluginId", "pluginRunId", "state", "text"],
              },
            },
          },
          required: ["slots"],
        },
      },
    ],
  },
  {
    id: "Theme",
    description: "The console's style tokens (the `styles` a Client half receives).",
    methods: [
      {
        name: "listTokens",
        description: "Token names and the class names they stand for.",
        inputSchema: { type: "object", properties: {} },
        outputSchema: {
          type: "object",
          properties: {
            tokens: {
              type: "array",
              items: { type: "object", properties: { name: STRING, className: STRING }, required: ["name", "className"] },
            },
          },
          required: ["tokens"],
        },
      },
    ],
  },
];

/** Text kept per slot in an answer: enough to see what rendered, not a page dump. */
const MAX_TEXT = 2000;

export async function answerQuery(connection: Connection, slots: ClientSlots, query: InspectQueryView): Promise<void> {
  let data: unknown;
  try {
    data = answer(slots, query.provider, query.method, JSON.parse(query.inputJson || "{}") as Record<string, unknown>);
  } catch (e) {
    await connection.call("failQuery", { queryId: query.queryId, message: e instanceof Error ? e.message : String(e) });
    return;
  }
  await connection.call("answerQuery", { queryId: query.queryId, dataJson: JSON.stringify(data) });
}

function answer(slots: ClientSlots, provider: string, method: string, input: Record<string, unknown>): unknown {
  if (provider === "Theme" && method === "listTokens") {
    return { tokens: Object.entries(STYLES).map(([name, className]) => ({ name, className })) };
  }
  if (provider === "Slots" && method === "listSubTree") {
    const pluginId = typeof input.pluginId === "string" ? input.pluginId : undefined;
    return { slots: slots.describe(pluginId).map((slot) => ({ ...slot, text: slot.text.slice(0, MAX_TEXT) })) };
  }
  throw new Error(`this page has no client inspect method ${provider}.${method}`);
}
