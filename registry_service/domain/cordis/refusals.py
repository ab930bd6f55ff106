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


def stale_state(plugin_id: str) -> CordisError:
    """A write that found the stored plugin otherwise than this registry had it: another
    registry sharing the store changed it first. Nothing was changed; the plugin is read again."""
    return CordisError(
        f'dynamic plugin "{plugin_id}" was changed by another registry meanwhile; nothing was '
        "changed here. Inspect it again (cordis_inspect_self), then retry",
        "stale-state",
    )


def require_agent(agent: str | None) -> str:
    if not agent:
        raise CordisError(REQUIRE_AGENT, "agent-required")
    return agent
