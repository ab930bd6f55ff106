/** A tiny element builder: the page draws with plain DOM calls (no UI framework). */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

export function button(label: string, action: string, onClick: () => void, enabled = true): HTMLButtonElement {
  const b = el("button", { type: "button", "data-action": action }, label);
  b.disabled = !enabled;
  b.addEventListener("click", onClick);
  return b;
}

/** The error's message and stack, for settling a failure. */
export function describe(error: unknown): { message: string; stack?: string } {
  if (error instanceof Error) return { message: error.message, ...(error.stack ? { stack: error.stack } : {}) };
  return { message: String(error) };
}
