"""An agent in `code` with language `monty`, end to end over real gRPC: registry → runtime (its
`languages` naming monty) → a sandboxed Monty host → a provider's tool → back. The agent chooses
the language through the API like any other (`code_language: monty`); its model reads the
Monty `run_code` description and SDK (a Python stub that says what the subset leaves out); a
program fans calls out under `asyncio.gather`, catches a failed call as `ToolCallError`, and
leaves the same nested history records as a Python program."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from codemode_client import ToolError, ToolProvider
from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from registry_service.presentation.sdk_monty import ERROR_CLASS
from runtime_service.languages import monty as monty_backend
from runtime_service.languages import register
from tests.codemode.conftest import Stack, value_of
from tests.registry.conftest import CODE, blocks_of

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pydantic_monty") is None,
    reason="the pydantic-monty package is not installed (scripts/bootstrap installs it)",
)

LANGUAGES = ["python", "monty"]

PROGRAM = """\
import asyncio
one = await tools.greet({'name': 'one'})
print('saw', one['text'])
try:
    await tools.fail_hard({})
except ToolCallError as e:
    print('caught', str(e))
a, b = await asyncio.gather(tools.greet({'name': 'a'}), tools.greet({'name': 'b'}))
return {'texts': [one['text'], a['text'], b['text']], 'big': 2 ** 70}
"""


@pytest.fixture
def monty_registered() -> Iterator[None]:
    """Monty registered for this test only (a runtime whose `languages` name it would
    register it for the rest of the process otherwise)."""
    unregister = register(monty_backend.BACKEND)
    try:
        yield
    finally:
        unregister()


@pytest.fixture
async def monty_stack(make_stack: Any, monty_registered: None) -> AsyncIterator[Stack]:
    async with make_stack(
        runtime_languages=LANGUAGES, runtime_settings={"languages": LANGUAGES}
    ) as stack:
        provider = ToolProvider(stack.channel, "greeter")

        @provider.tool(name="greet", concurrency_safe=True)
        async def greet(args: Any, ctx: Any) -> Any:
            return {"text": f"hello {args['name']}"}

        @provider.tool(name="fail_hard")
        async def fail_hard(args: Any, ctx: Any) -> Any:
            raise ToolError("no luck")  # an explicit failure: its text reaches the program

        @provider.tool(name="odd-name")
        async def odd_name(args: Any, ctx: Any) -> Any:
            return {}

        await provider.start()
        try:
            yield stack
        finally:
            await provider.close()


async def _monty_agent(stack: Stack, agent_id: str = "monty-coder") -> str:
    agent = scope_pb2.Agent(mode=CODE, code_language="monty")
    response = await stack.stub.CreateAgent(rpb.CreateAgentRequest(agent_id=agent_id, agent=agent))
    assert response.agent.effective_code_language == "monty"
    name: str = response.agent.name
    return name


async def test_a_monty_agent_calls_provider_tools_and_leaves_nested_records(
    monty_stack: Stack,
) -> None:
    agent = await _monty_agent(monty_stack)
    events, result = await monty_stack.run_code(PROGRAM, agent=agent)
    assert value_of(result) == {
        "logs": ["saw hello one", "caught ToolCallError: no luck"],
        "result": {"texts": ["hello one", "hello a", "hello b"], "big": 2**70},
    }
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds.count("nested_started") == 4 and kinds.count("nested_settled") == 4
    settled = {e.nested_settled.tool_name: e.nested_settled for e in events if e.nested_settled}
    assert settled["fail_hard"].is_error and not settled["greet"].is_error
    page = await monty_stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, page_size=100))
    records = list(page.records)
    assert (records[0].kind, records[-1].kind) == ("tool/call", "tool/result")
    nested = records[1:-1]
    assert len(nested) == 8  # four calls, a start and a settle each
    assert {r.kind for r in nested} == {"tool/code-dispatch-start", "tool/code-dispatch"}
    assert all(r.parent_call_id == r.root_call_id == "call-1" for r in nested)
    assert sorted({r.call_id for r in nested}) == [f"call-1:code:{i}" for i in range(1, 5)]
    first = next(r for r in nested if r.kind == "tool/code-dispatch")
    assert (first.tool_name, first.arguments_json) == ("greet", '{"name":"one"}')
    assert blocks_of(records[-1].content) == blocks_of(result.content)


async def test_what_monty_refuses_fails_the_run_with_its_line(monty_stack: Stack) -> None:
    agent = await _monty_agent(monty_stack)
    _, failed = await monty_stack.run_code(
        "print('before')\nclass E(Exception):\n    pass\nreturn 1", agent=agent
    )
    assert failed.is_error
    assert failed.error.code == "CODE_RUN_FAILED"
    assert failed.error.message.startswith("code run failed (exception): ")
    assert "line 2:" in failed.error.message, failed.error.message
    # The same program is fine on CPython: the language is the agent's choice.
    python = await monty_stack.agent("py-coder", mode=CODE)
    _, result = await monty_stack.run_code(
        "class E(Exception):\n    pass\nreturn 1", agent=python, call_id="call-2"
    )
    assert value_of(result) == {"logs": [], "result": 1}


async def test_the_model_is_told_it_writes_monty_and_what_it_lacks(monty_stack: Stack) -> None:
    agent = await _monty_agent(monty_stack)
    sdk = await monty_stack.stub.GetSdk(ppb.GetSdkRequest(scope=agent))
    assert sdk.language == "monty"
    text = sdk.text
    assert "Monty, a SUBSET of Python" in text
    assert "What Monty does NOT support" in text and "class inheritance" in text
    assert "another name for `RuntimeError`" in text
    assert ERROR_CLASS in text and "class ToolCallError(Exception)" not in text
    # The Python stub, unchanged: typed methods for callable names, a comment for the rest
    # (which the instructions say Monty cannot call).
    assert "async def greet(self, args: " in text
    assert '# tools["odd-name"]' in text and "cannot be called from Monty" in text
    wire = await monty_stack.stub.GetWireSchemas(ppb.GetWireSchemasRequest(scope=agent))
    assert wire.language == "monty" and [s.name for s in wire.schemas] == ["run_code"]
    run_code = wire.schemas[0]
    assert run_code.description.startswith("Execute a program in Monty, a fast sandboxed SUBSET")
    assert "class inheritance" in run_code.description
    # A Python agent of the same deployment reads the Python texts.
    python = await monty_stack.agent("py-coder", mode=CODE)
    python_sdk = await monty_stack.stub.GetSdk(ppb.GetSdkRequest(scope=python))
    assert python_sdk.language == "python" and "Monty" not in python_sdk.text
    assert "class ToolCallError(Exception)" in python_sdk.text


async def test_each_monty_agent_has_hosts_of_its_own(monty_stack: Stack) -> None:
    """The registry sends each agent's runs as a tenant of their own: an agent's second run
    reuses its kept host, another agent's gets another host, and nothing of one run (the
    agent's own earlier one included) is seen by the next."""
    kept = monty_stack.runtime.runtime.kept
    first, second = await _monty_agent(monty_stack, "m1"), await _monty_agent(monty_stack, "m2")
    leak = "global leaked\nleaked = 'secret'\nreturn 1"
    probe = "try:\n    return leaked\nexcept NameError:\n    return 'fresh'"
    _, result = await monty_stack.run_code(leak, agent=first, call_id="a1")
    assert value_of(result)["result"] == 1
    assert kept.idle_count == 1
    _, result = await monty_stack.run_code(probe, agent=first, call_id="a2")
    assert value_of(result)["result"] == "fresh"
    assert kept.idle_count == 1  # the same host, a fresh session
    _, result = await monty_stack.run_code(probe, agent=second, call_id="b1")
    assert value_of(result)["result"] == "fresh"
    assert kept.idle_count == 2  # another tenant: another host
