"""The one failure type of every Cordis verb: a tool error with the runner's message and the
reference's reason as its code (`plugin-missing`, `package-missing`, `invalid-mode`, …)."""

from __future__ import annotations

from registry_service.domain.calls import ToolCallFailure

REQUIRE_AGENT = "Cordis dynamic tools require an Agent-backed session"


class CordisError(ToolCallFailure):
    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, reason, "CordisError")
        self.reason = reason
        self.message = message


def plugin_missing(plugin_id: str) -> CordisError:
    # Another agent's plugin reads exactly like one that does not exist.
    return CordisError(
        f'no dynamic plugin "{plugin_id}" in this process — it may have been removed or lost '
        "on registry restart",
        "plugin-missing",
    )


def require_agent(agent: str | None) -> str:
    if not agent:
        raise CordisError(REQUIRE_AGENT, "agent-required")
    return agent
