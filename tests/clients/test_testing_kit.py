"""The testing kit users get (`codemode_client.testing`): its fixtures start real services,
its scripted model drives `ExecuteToolCall` as a model loop would, and its trajectory
assertions fail with messages that say what differs."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typing_extensions import TypedDict

from codemode_client import ToolFailed
from codemode_client.testing import (
    Answer,
    CallTool,
    CodemodeServices,
    Conversation,
    RunCode,
    ServicesError,
    Testbed,
    expect,
    start_services,
    wait_gone,
)
from tests.procfs import alive


class AddArgs(TypedDict):
    a: int
    b: int


def _math(codemode: Testbed) -> Any:
    tools = codemode.provider("math")

    @tools.tool(concurrency_safe=True)
    async def add(args: AddArgs, ctx: Any) -> int:
        """Add two integers."""
        return args["a"] + args["b"]

    @tools.tool()
    async def divide(args: AddArgs, ctx: Any) -> float:
        """Divide a by b."""
        if args["b"] == 0:
            raise ToolFailed("division by zero", "DIVIDE_BY_ZERO")
        return args["a"] / args["b"]

    return tools


DIVIDE_ERROR = "Error: division by zero"  # the text the history keeps of a failed call
PROGRAM = """
total = await tools.add({"a": 2, "b": 3})
try:
    await tools.divide({"a": total, "b": 0})
except Exception as exc:
    print("refused:", exc)
return total
"""


def _answer_with_the_total(so_far: Conversation) -> Answer:
    """A turn that reads the last result, as a model answers from what a call returned."""
    value = so_far.last.result.value
    assert isinstance(value, dict)
    return Answer(f"the total is {value['result']}")


async def test_a_scripted_model_runs_a_program_and_answers_from_its_result(
    codemode: Testbed,
) -> None:
    await _math(codemode).start()
    agent = await codemode.agent()
    conversation = await codemode.play(
        agent,
        CallTool("add", {"a": 1, "b": 1}),  # under code the model may call only run_code
        RunCode(PROGRAM, "add then divide"),
        _answer_with_the_total,
    )
    assert conversation.offered == ["run_code"]
    refused, ran = conversation.steps
    assert refused.result.is_error and refused.result.error_code == "UNKNOWN_TOOL"
    assert ran.result.value == {"logs": ["refused: division by zero"], "result": 5}
    assert conversation.answer == "the total is 5"

    trajectory = await codemode.trajectory(agent, ran.call_id)
    trajectory.assert_succeeded()
    trajectory.assert_recorded()
    trajectory.assert_nested(
        expect("add", {"a": 2, "b": 3}, result=5, error_code=""),
        expect(
            "divide",
            {"a": 5, "b": 0},
            error_code="DIVIDE_BY_ZERO",
            result="Error: division by zero",
        ),
    )
    assert trajectory.tools == ["add", "divide"]
    assert trajectory.arguments == {"code": PROGRAM, "description": "add then divide"}
    assert trajectory.kinds == [
        "tool/call",
        "tool/code-dispatch-start",
        "tool/code-dispatch",
        "tool/code-dispatch-start",
        "tool/code-dispatch",
        "tool/result",
    ]
    assert trajectory.call("divide").is_error


async def test_a_failed_trajectory_assertion_says_what_differs_and_draws_the_calls(
    codemode: Testbed,
) -> None:
    await _math(codemode).start()
    agent = await codemode.agent()
    conversation = await codemode.play(agent, RunCode(PROGRAM))
    trajectory = await codemode.trajectory(agent, conversation.last.call_id)
    with pytest.raises(AssertionError) as failed:
        trajectory.assert_nested(expect("add", {"a": 2, "b": 4}, result=6), "greet", "divide")
    message = str(failed.value)
    call_id = conversation.last.call_id
    assert f"nested calls of {call_id} differ:" in message
    assert (
        "call 1 (" + call_id + ':code:1): arguments {"a": 2, "b": 3}, expected {"a": 2, "b": 4}'
        in message
    )
    assert "call 1 (" + call_id + ":code:1): result 5, expected 6" in message
    assert "call 2 (" + call_id + ":code:2): tool 'divide', expected 'greet'" in message
    assert "2 nested calls, expected 3" in message
    drawn = rf"^  2\. {call_id}:code:2 divide \{{.*\}} error DIVIDE_BY_ZERO: {DIVIDE_ERROR}$"
    assert re.search(drawn, message, flags=re.MULTILINE), message
    with pytest.raises(AssertionError, match="0 nested call"):
        trajectory.call("greet")


async def test_testbeds_clean_up_their_agents_and_tools(
    codemode_services: CodemodeServices,
) -> None:
    async with Testbed(codemode_services.address) as first:
        await _math(first).start()
        agent = await first.agent()
        assert "add" in {t.name for t in await first.client.list_tools(agent)}
    async with Testbed(codemode_services.address) as second:
        names = {a.name for a in await second.client.list_agents()}
        assert agent not in names
        assert "add" not in {t.name for t in await second.client.list_tools()}


def test_services_stop_by_pid_and_leave_no_process(tmp_path: Path) -> None:
    services = start_services(tmp_path / "services")
    pids = [services.pid, *services.service_pids]
    assert len(services.service_pids) == 2 and all(alive(pid) for pid in pids)
    assert services.address.startswith("127.0.0.1:") and services.runtimes
    services.stop()
    assert wait_gone(pids) == []
    assert (tmp_path / "services" / "history.sqlite3").exists()


def test_a_command_that_cannot_start_the_services_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ServicesError, match="exited") as failed:
        start_services(tmp_path, command=["python3", "-c", "print('no services here')"])
    assert "no services here" in str(failed.value)


def test_the_plugin_is_loaded_by_its_entry_point_in_a_users_project(tmp_path: Path) -> None:
    """A user's test file needs no conftest: installing the client registers the fixtures."""
    (tmp_path / "test_my_agent.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from codemode_client.testing import RunCode

            @pytest.mark.asyncio
            async def test_it(codemode):
                agent = await codemode.agent()
                conversation = await codemode.play(agent, RunCode("return 6 * 7"))
                assert conversation.last.result.value == {"logs": [], "result": 42}
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         "-c", "/dev/null", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
