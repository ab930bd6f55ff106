/** Ordinary tool approvals of the console's agent, answered by the person (allow / reject). */
import type { ToolApprovalView } from "../src/protocol";
import type { Connection } from "./connection";
import { button, el } from "./dom";

export class ToolApprovals {
  private readonly rows = new Map<string, HTMLElement>();

  constructor(
    private readonly connection: Connection,
    private readonly list: HTMLElement,
  ) {}

  requested(request: ToolApprovalView): void {
    if (this.rows.has(request.approvalId)) return;
    const answer = (value: "allow" | "reject") => async () => {
      for (const b of row.querySelectorAll("button")) b.disabled = true;
      await this.connection.call("answerToolApproval", { approvalId: request.approvalId, answer: value });
    };
    const row = el(
      "li",
      { "data-approval": request.approvalId, "data-tool": request.toolName },
      el("strong", {}, request.toolName),
      " ",
      el("code", {}, request.argumentsJson || "{}"),
      el("span", { class: "cm-muted" }, ` ${request.reason} (call ${request.callId})`),
      " ",
      button("Allow", "allow", () => void answer("allow")()),
      button("Reject", "reject", () => void answer("reject")()),
    );
    this.rows.set(request.approvalId, row);
    this.list.append(row);
  }

  withdrawn(approvalId: string): void {
    this.rows.get(approvalId)?.remove();
    this.rows.delete(approvalId);
  }
}
