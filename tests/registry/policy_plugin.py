"""A registry plugin loaded by name in tests (`tests.registry.policy_plugin:install`)."""

from __future__ import annotations

from typing import Any

from registry_service.domain.policy import Deny, PreDecision
from registry_service.registry import Registry

NOT_CALLABLE = "a plugin entry must name a function"


def install(registry: Registry) -> None:
    """Adds an in-process tool and a global hook that refuses it to one agent."""

    async def clock(invocation: Any) -> Any:
        return {"now": "12:00"}

    registry.register_tool("clock", clock, description="The time")

    async def no_clock_for_guests(execution: Any, decision: PreDecision) -> PreDecision:
        if execution.name == "clock" and execution.agent == "agents/guest":
            return Deny("guests have no clock")
        return decision

    registry.catalog.hooks("").pre_execute.append(no_clock_for_guests)
