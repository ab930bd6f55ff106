"""Registry plugin for `benchmarks.run_code`: fast in-process tools for nested calls.

Loaded with `CODEMODE_REGISTRY_PLUGINS='["benchmarks._run_code_tools:install"]'`.
"""

from __future__ import annotations

import asyncio

from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.tools import Invocation
from registry_service.registry import Registry

SLEEP_S = 0.1


async def _noop(invocation: Invocation) -> JsonValue:
    return invocation.arguments


async def _sleep100(invocation: Invocation) -> JsonValue:
    await asyncio.sleep(SLEEP_S)
    return None


def install(registry: Registry) -> None:
    registry.register_tool(
        "noop", _noop, description="Returns its arguments (benchmark)", concurrency_safe=True
    )
    registry.register_tool(
        "sleep100", _sleep100, description="Waits 100 ms (benchmark)", concurrency_safe=True
    )
