"""A registry with a small `max_message_bytes` and a runtime with its default (much larger)
output budget, over real gRPC: whatever a program produces ends as an outcome, never as a
broken Run stream."""

from __future__ import annotations

from typing import Any

import pytest

from registry_service.runtime_client import payload_limit
from tests.codemode.conftest import value_of
from tests.codemode.fake_runtime import FakeRuntime, registry_on
from tests.registry.conftest import echo_tool

MESSAGE_BYTES = 64 * 1024
LIMIT = payload_limit(MESSAGE_BYTES)


async def test_output_over_the_message_limit_is_an_output_limit_outcome(make_stack: Any) -> None:
    async with make_stack(max_message_bytes=MESSAGE_BYTES) as stack:
        agent = await stack.code_agent()
        _, result = await stack.run_code("print('a')\nreturn 'x' * 100_000", agent=agent)
        assert result.is_error and result.error.code == "CODE_RUN_FAILED"
        assert result.error.message == (
            f"code run failed (output-limit): outer output exceeded {LIMIT} bytes"
            "\nCaptured output:\na"
        )
        # The same registry still runs programs whose output fits.
        _, fits = await stack.run_code("return 'x' * 20_000", agent=agent, call_id="c2")
        assert value_of(fits)["result"] == "x" * 20_000


async def test_binding_call_too_large_to_forward_fails_only_that_call(make_stack: Any) -> None:
    async with make_stack(max_message_bytes=MESSAGE_BYTES) as stack:
        echo_tool(stack.registry, "echo")
        agent = await stack.code_agent()
        program = (
            "try:\n"
            "    await tools.echo({'blob': 'z' * 100_000})\n"
            "except ToolCallError as e:\n"
            "    print(e.toolName, e)\n"
            "return await tools.echo({'small': 1})"
        )
        _, result = await stack.run_code(program, agent=agent)
        assert value_of(result) == {
            "logs": [f"echo tool arguments too large: over {LIMIT} bytes of JSON"],
            "result": {"echo": {"small": 1}},
        }
        records = await stack.registry.history.list(
            stack.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
        )
        # The refused call was never dispatched and used no sub-call number.
        assert [(r.kind, r.call_id) for r in records] == [
            ("tool/call", "call-1"),
            ("tool/code-dispatch-start", "call-1:code:1"),
            ("tool/code-dispatch", "call-1:code:1"),
            ("tool/result", "call-1"),
        ]


async def test_tool_result_too_large_for_the_program_fails_only_that_call(
    make_stack: Any,
) -> None:
    async with make_stack(max_message_bytes=MESSAGE_BYTES) as stack:

        async def big(inv: Any) -> Any:
            return "r" * 100_000

        async def huge_error(inv: Any) -> Any:
            raise RuntimeError("e" * 100_000)

        stack.registry.register_tool("big", big)
        stack.registry.register_tool("huge_error", huge_error)
        program = (
            "out = []\n"
            "for name in ['big', 'huge_error']:\n"
            "    try:\n"
            "        await tools[name]({})\n"
            "    except ToolCallError as e:\n"
            "        out.append(str(e)[:70])\n"
            "        out.append(len(str(e)))\n"
            "return out"
        )
        _, result = await stack.run_code(program)
        message = f"tool result too large for the program: over {LIMIT} bytes of JSON"
        assert value_of(result)["result"] == [message, len(message), "e" * 70, LIMIT]


@pytest.mark.parametrize(
    ("default_output", "max_output", "asked"),
    [
        (64 << 20, 64 << 20, LIMIT),  # the runtime's defaults: ask for what fits
        (8 << 10, 64 << 20, 8 << 10),  # the runtime gives runs less by default: keep that
        (0, 32 << 10, 32 << 10),  # default not reported; never ask above the maximum
    ],
)
async def test_the_output_budget_asked_for(
    default_output: int, max_output: int, asked: int
) -> None:
    runtime = FakeRuntime(default_output_bytes=default_output, max_output_bytes=max_output)
    async with registry_on(runtime, max_message_bytes=MESSAGE_BYTES) as (h, _clock, agent):
        await h.execute("run_code", {"code": "pass", "description": "x"}, agent=agent)
    assert runtime.starts[0].budgets.max_output_bytes == asked
