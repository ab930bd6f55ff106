/**
 * AI SDK tools (`@codemode/client/ai-sdk`; `ai` is an optional peer dependency: `npm install ai@7`): the agent's wire schemas
 * as `tool({ inputSchema: jsonSchema(...), execute })`, each call going to the registry as the
 * agent under the AI SDK's tool call id. `ai` is loaded by `aiSdkTools` alone (it is an ES
 * module: imported dynamically), so the base client never needs it. A failure throws an error
 * whose message names the Codemode code: the AI SDK hands it to the model as a tool error.
 */
import type { ToolSet } from "ai" with { "resolution-mode": "import" };
import type { AgentTools } from "./tools";

/** The agent's tools for `generateText`/`streamText` (`tools: await aiSdkTools(tools)`). */
export async function aiSdkTools(tools: AgentTools): Promise<ToolSet> {
  const ai = await import("ai");
  const set: ToolSet = {};
  for (const schema of tools.schemas) {
    set[schema.name] = ai.tool({
      description: schema.description,
      inputSchema: ai.jsonSchema<Record<string, unknown>>(schema.parameters as object),
      execute: async (input: Record<string, unknown>, options: { toolCallId: string }) => {
        const reply = await tools.call({ callId: options.toolCallId, name: schema.name, arguments: input });
        if (reply.isError) throw new Error(reply.text);
        return reply.text;
      },
    });
  }
  return set;
}
