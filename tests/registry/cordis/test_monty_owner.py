"""A Monty agent's plugins (`code_language: monty`) on a real runtime: Monty's bridge runs
programs, not plugin hosts, so the agent's host halves are Python ones (its profile's
`host_language`): checked as Python at define time, run by the Python host harness, and their
tools called from the agent's Monty programs like any binding."""

from __future__ import annotations

import importlib.util

import pytest

from codemode_wire import jsonvalue
from runtime_service.languages import monty as monty_backend
from runtime_service.languages import register
from tests.registry.conftest import BOTH
from tests.registry.cordis.real_stack import real_stack

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pydantic_monty") is None,
    reason="the pydantic-monty package is not installed (scripts/bootstrap installs it)",
)

HOST = """\
async def now(args):
    return {"time": "12:00", "args": args}

tool = harness.define_tool(
    name="clock_now",
    description="The time.",
    parameters={"type": "object", "properties": {}, "additionalProperties": True},
    execute=now,
)

async def apply(ctx):
    harness.register_tool(tool)

return apply
"""


async def test_a_monty_agents_host_half_is_python_and_its_tool_serves_monty_programs() -> None:
    unregister = register(monty_backend.BACKEND)  # for this test only
    try:
        await _define_and_call()
    finally:
        unregister()


async def _define_and_call() -> None:
    async with real_stack(runtime_settings={"languages": ["python", "monty"]}) as stack:
        agent = await stack.agent("monty-coder", mode=BOTH, language="monty")
        # Checked as Python: a Python syntax error is named as Python's.
        refused = await stack.call(
            agent,
            "cordis_define",
            {"plugin": {"kind": "new", "idPrefix": "bad"}, "name": "Bad", "purpose": "p",
             "code": {"host": "def apply(ctx)\n    pass"}},
        )  # fmt: skip
        assert refused.is_error and "Python async function body" in refused.error.message
        defined = await stack.define(agent, HOST)
        started = await stack.run(agent, defined["pluginId"], defined["packageId"])
        assert not started.is_error, started.error.message
        status = jsonvalue.loads(started.value_json)
        assert isinstance(status, dict) and status["status"] == "running"
        program = "import asyncio\nreturn await asyncio.gather(tools.clock_now({'a': 1}))"
        result = await stack.call(
            agent, "run_code", {"code": program, "description": "clock"}, "p1"
        )
        assert not result.is_error, result.error.message
        assert jsonvalue.loads(result.value_json) == {
            "logs": [],
            "result": [{"time": "12:00", "args": {"a": 1}}],
        }
