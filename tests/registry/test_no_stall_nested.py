"""No request may stall the registry: the bounds on a `run_code` program's nested calls."""

from __future__ import annotations

from typing import Any

from tests.codemode.conftest import make_stack, value_of
from tests.registry.conftest import echo_tool

__all__ = ["make_stack"]  # the fixture, used by name


async def test_a_too_deep_nested_call_fails_only_that_call(make_stack: Any) -> None:
    async with make_stack(max_json_depth=50) as stack:
        echo_tool(stack.registry, "echo")
        agent = await stack.code_agent()
        program = (
            "value = []\n"
            "for _ in range(60):\n"
            "    value = [value]\n"
            "try:\n"
            "    await tools.echo({'v': value})\n"
            "except ToolCallError as e:\n"
            "    print(e.toolName, e)\n"
            "return await tools.echo({'small': [[1]]})"
        )
        _, result = await stack.run_code(program, agent=agent)
        assert value_of(result) == {
            "logs": ["echo tool arguments too deep: nested deeper than 50 levels"],
            "result": {"echo": {"small": [[1]]}},
        }
