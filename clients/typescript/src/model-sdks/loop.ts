/**
 * The one model loop every vendor adapter runs (the twin of `codemode_client.model_sdks.loop`):
 * ask the model, execute the tool calls it made through the registry, hand the replies back,
 * until it answers without a tool call. Nothing is kept between runs: the conversation returned
 * is the caller's, and the registry records every call in the agent's history. Turns are
 * bounded (`maxTurns` model requests); calls of one turn run one after the other, in the order
 * the model made them.
 */
import type { AgentTools, ModelCall, ToolReply } from "./tools";

/** How one vendor API is asked, read, and continued. */
export interface Dialect<Message, Response> {
  create(conversation: Message[]): Promise<Response>;
  calls(response: Response): ModelCall[];
  text(response: Response): string;
  addResponse(conversation: Message[], response: Response): void;
  addReplies(conversation: Message[], replies: readonly ToolReply[]): void;
}

export interface LoopResult<Message, Response> {
  /** The model's text in its last response. */
  text: string;
  /** The vendor's last response object. */
  response: Response;
  /** Every message (or input item) of the run, in the vendor's shape: pass it to continue. */
  conversation: Message[];
  /** Model requests made. */
  turns: number;
  /** `answered`, `concluded` (a result asked to end the turn) or `maxTurns`. */
  stop: "answered" | "concluded" | "maxTurns";
  /** Every tool reply, in order. */
  replies: ToolReply[];
}

export async function runLoop<Message, Response>(
  dialect: Dialect<Message, Response>,
  tools: AgentTools,
  conversation: Message[],
  maxTurns: number,
): Promise<LoopResult<Message, Response>> {
  if (!Number.isInteger(maxTurns) || maxTurns < 1) throw new RangeError(`maxTurns must be at least 1, got ${maxTurns}`);
  const replies: ToolReply[] = [];
  let response!: Response;
  const done = (turns: number, stop: LoopResult<Message, Response>["stop"]): LoopResult<Message, Response> => ({
    text: dialect.text(response),
    response,
    conversation,
    turns,
    stop,
    replies,
  });
  for (let turn = 1; turn <= maxTurns; turn++) {
    response = await dialect.create(conversation);
    dialect.addResponse(conversation, response);
    const calls = dialect.calls(response);
    if (calls.length === 0) return done(turn, "answered");
    const batch: ToolReply[] = [];
    for (const call of calls) batch.push(await tools.call(call));
    replies.push(...batch);
    dialect.addReplies(conversation, batch);
    if (batch.some((r) => r.concludesTurn)) return done(turn, "concluded");
  }
  return done(maxTurns, "maxTurns");
}

