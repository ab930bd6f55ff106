"""An agent in `code` with language `typescript`, end to end over real gRPC: registry → runtime →
a Node worker → a provider's tool through the generated binding → back; the same nested records
and outcome texts as a Python program's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from codemode_client import ToolError, ToolProvider
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from tests.codemode.conftest import Stack, value_of
from tests.registry.conftest import CODE, blocks_of, result_text

BOTH_LANGUAGES = ["python", "typescript"]

PROGRAM = """\
interface Greeting { text: string }
const one: Greeting = await tools.greet({ name: "one" });
console.log("saw", one.text);
try {
  await tools["fail-hard"]({});
} catch (e) {
  if (!(e instanceof ToolCallError)) throw e;
  console.log(`caught ${e.toolName}: ${e.message}`);
}
const [a, b] = await Promise.all([tools.greet({ name: "a" }), tools.greet({ name: "b" })]);
return { texts: [one.text, a.text, b.text] };
"""


@pytest.fixture
async def ts_stack(make_stack: Any) -> AsyncIterator[Stack]:
    async with make_stack(runtime_languages=BOTH_LANGUAGES) as stack:
        provider = ToolProvider(stack.channel, "greeter")

        @provider.tool(name="greet", concurrency_safe=True)
        async def greet(args: Any, ctx: Any) -> Any:
            return {"text": f"hello {args['name']}"}

        @provider.tool(name="fail-hard")
        async def fail_hard(args: Any, ctx: Any) -> Any:
            raise ToolError("no luck")  # an explicit failure: its text reaches the program

        await provider.start()
        try:
            yield stack
        finally:
            await provider.close()


async def _ts_agent(stack: Stack, agent_id: str = "ts-coder") -> str:
    agent = scope_pb2.Agent(mode=CODE, code_language="typescript")
    response = await stack.stub.CreateAgent(rpb.CreateAgentRequest(agent_id=agent_id, agent=agent))
    assert response.agent.effective_code_language == "typescript"
    name: str = response.agent.name
    return name


async def test_a_typescript_agent_calls_a_provider_tool_and_leaves_nested_records(
    ts_stack: Stack,
) -> None:
    agent = await _ts_agent(ts_stack)
    events, result = await ts_stack.run_code(PROGRAM, agent=agent)
    value = value_of(result)
    assert value == {
        "logs": ["saw hello one", "caught fail-hard: no luck"],
        "result": {"texts": ["hello one", "hello a", "hello b"]},
    }
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds.count("nested_started") == 4 and kinds.count("nested_settled") == 4
    settled = {e.nested_settled.tool_name: e.nested_settled for e in events if e.nested_settled}
    assert settled["fail-hard"].is_error and not settled["greet"].is_error
    page = await ts_stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, page_size=100))
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


async def test_outcome_texts_match_pythons(ts_stack: Stack) -> None:
    """The texts the model sees are the language-neutral ones: logs then the value, the empty
    run's placeholder, and a failure's kind + message + captured output."""
    ts = await _ts_agent(ts_stack)
    py = (
        await ts_stack.stub.CreateAgent(
            rpb.CreateAgentRequest(
                agent_id="py-coder", agent=scope_pb2.Agent(mode=CODE, code_language="python")
            )
        )
    ).agent.name
    pairs = {
        "both": ("console.log('log');\nreturn 'value';", "print('log')\nreturn 'value'"),
        "result": ("return [1, { a: 'b' }];", "return [1, {'a': 'b'}]"),
        "neither": ("const x = 1;", "x = 1"),
        # Sequential awaits, a log between them.
        "sequential-awaits": (
            "const a = await tools.greet({ name: 'one' });\nconsole.log('saw', a.text);\n"
            "return (await tools.greet({ name: 'two' })).text;",
            "a = await tools.greet({'name': 'one'})\nprint('saw', a['text'])\n"
            "return (await tools.greet({'name': 'two'}))['text']",
        ),
        # A tool's error rejects the program's call with the tool's message.
        "tool-error": (
            "try { await tools['fail-hard']({}); } catch (e) {\n"
            "  if (e instanceof ToolCallError) return [e.toolName, e.message];\n  throw e;\n}",
            "try:\n    await tools['fail-hard']({})\nexcept ToolCallError as e:\n"
            "    return [e.toolName, e.message]",
        ),
        # A call without an arguments object is refused with the `{}` hint.
        "no-arguments-hint": (
            "try { await tools.greet(); } catch (e) { return (e as ToolCallError).message; }",
            "try:\n    tools.greet()\nexcept ToolCallError as e:\n    return e.message",
        ),
    }
    for case, (ts_program, py_program) in pairs.items():
        _, ts_result = await ts_stack.run_code(ts_program, agent=ts, call_id=f"ts-{case}")
        _, py_result = await ts_stack.run_code(py_program, agent=py, call_id=f"py-{case}")
        assert not ts_result.is_error, ts_result.error.message
        assert result_text(ts_result) == result_text(py_result), case
        assert value_of(ts_result) == value_of(py_result), case
    _, failed = await ts_stack.run_code(
        "console.log('before');\nthrow new Error('boom');", agent=ts, call_id="ts-failed"
    )
    assert failed.is_error
    assert (failed.error.code, failed.error.name) == ("CODE_RUN_FAILED", "CodeRunFailedError")
    assert failed.error.message.startswith("code run failed (exception): ")
    assert "Error: boom" in failed.error.message
    assert failed.error.message.endswith("\nCaptured output:\nbefore")
