"""What run_code leaves in history, read back through ListHistory."""

from __future__ import annotations

from typing import Any

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import history_pb2, tool_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.results import ImageBlock, JsonBlock, TextBlock, success
from tests.codemode.conftest import Stack, value_of
from tests.registry.conftest import blocks_of


async def _history(stack: Stack, agent: str, call_id: str = "") -> list[history_pb2.HistoryRecord]:
    page = await stack.stub.ListHistory(
        rpb.ListHistoryRequest(agent=agent, call_id=call_id, page_size=1000)
    )
    assert not page.next_page_token
    return list(page.records)


async def test_stored_outer_result_content(stack: Stack) -> None:
    agent = await stack.code_agent()
    cases = {
        "logs": ("print('one')\nprint('two', 2)", "one\ntwo 2"),
        "result": ("return [1, {'a': 'b'}]", '[\n  1,\n  {\n    "a": "b"\n  }\n]'),
        "string": ("return 'raw\\ntext'", "raw\ntext"),
        "both": ("print('log')\nreturn 'value'", "log\nvalue"),
        "neither": ("x = 1", "(run_code completed with no output)"),
    }
    results: dict[str, tool_pb2.ToolResult] = {}
    for call_id, (program, _) in cases.items():
        _, results[call_id] = await stack.run_code(program, agent=agent, call_id=call_id)
    _, results["failed"] = await stack.run_code(
        "print('before')\nraise ValueError('boom')", agent=agent, call_id="failed"
    )
    records = await _history(stack, agent)
    stored = {r.call_id: r for r in records if r.kind == "tool/result"}
    assert sorted(stored) == sorted(results)
    for call_id, (_, text) in cases.items():
        record = stored[call_id]
        assert blocks_of(record.content) == [("text", text)], call_id
        assert not record.is_error and record.error_code == "" and record.spill_locator == ""
        assert blocks_of(results[call_id].content) == blocks_of(record.content)
    failed = stored["failed"]
    assert failed.is_error and failed.error_code == "CODE_RUN_FAILED"
    assert blocks_of(failed.content) == blocks_of(results["failed"].content)
    (kind, text), *rest = blocks_of(failed.content)
    assert kind == "text" and rest == []
    assert text.startswith("Error: code run failed (exception): ")
    assert text.endswith("ValueError: boom\nCaptured output:\nbefore")


async def test_only_outer_records_lack_a_parent(stack: Stack) -> None:
    async def ok(inv: Any) -> Any:
        return "ok"

    async def broken(inv: Any) -> Any:
        raise RuntimeError("broken")

    stack.registry.register_tool("ok", ok, concurrency_safe=True)
    stack.registry.register_tool("broken", broken)
    agent = await stack.code_agent()
    program = (
        "import asyncio\n"
        "await asyncio.gather(tools.ok({}), tools.ok({}), return_exceptions=True)\n"
        "try:\n"
        "    await tools.broken({})\n"
        "except ToolCallError:\n"
        "    pass\n"
        "return 'done'"
    )
    for call_id in ("c1", "c2"):
        _, result = await stack.run_code(program, agent=agent, call_id=call_id)
        assert not result.is_error
    records = await _history(stack, agent)
    outer = [r for r in records if not r.parent_call_id]
    assert [(r.kind, r.call_id) for r in outer] == [
        ("tool/call", "c1"),
        ("tool/result", "c1"),
        ("tool/call", "c2"),
        ("tool/result", "c2"),
    ]
    assert all(r.root_call_id == r.call_id and r.tool_name == "run_code" for r in outer)
    nested = [r for r in records if r.parent_call_id]
    assert len(nested) == 2 * 3 * 2  # two runs, three calls, a start and a settle each
    for r in nested:
        assert r.kind in ("tool/code-dispatch-start", "tool/code-dispatch")
        outer_id = r.call_id.split(":code:")[0]
        assert outer_id in ("c1", "c2")
        assert r.root_call_id == r.parent_call_id == outer_id
    # Each run's nested records sit between its own call and result records, and ListHistory by
    # call id returns the run with its nested records and nothing of the other run.
    for outer_id in ("c1", "c2"):
        own = await _history(stack, agent, outer_id)
        assert own[0].kind == "tool/call" and own[-1].kind == "tool/result"
        assert {r.root_call_id for r in own} == {outer_id}
        assert [r.call_id for r in own[1:-1]] == [
            r.call_id for r in nested if r.parent_call_id == outer_id
        ]


async def test_settle_record_keeps_sub_result_content_verbatim(stack: Stack) -> None:
    # Escapes, quotes, tabs, non-ASCII and astral characters, 10,000 characters in all.
    unit = 'héllo "wörld" \\ ✓ 🚀\t<b>&amp;</b>\n'
    long_text = (unit * (10_000 // len(unit) + 1))[:10_000]
    image = bytes(range(256)) * 4  # every byte value
    doc = jsonvalue.dumps({"a": [1, 2.5, "x"], "b": None, "c": {"deep": [True]}})

    async def rich(inv: Any) -> Any:
        return success(
            "rich", (TextBlock(long_text), ImageBlock("image/png", image), JsonBlock(doc))
        )

    long_error = "why: " + "x" * 5_000

    async def fails(inv: Any) -> Any:
        raise RuntimeError(long_error)

    stack.registry.register_tool("rich", rich)
    stack.registry.register_tool("fails", fails)
    agent = await stack.code_agent()
    program = (
        "value = await tools.rich({})\n"
        "try:\n"
        "    await tools.fails({})\n"
        "except ToolCallError as e:\n"
        "    return [value, len(str(e))]"
    )
    _, result = await stack.run_code(program, agent=agent)
    assert value_of(result)["result"] == ["rich", len(long_error)]
    settles = {
        r.tool_name: r for r in await _history(stack, agent) if r.kind == "tool/code-dispatch"
    }
    assert settles["rich"].spill_locator == "" and not settles["rich"].is_error
    assert blocks_of(settles["rich"].content) == [
        ("text", long_text),
        ("image", ("image/png", image)),
        ("json", doc),
    ]
    assert settles["fails"].is_error and settles["fails"].spill_locator == ""
    assert blocks_of(settles["fails"].content) == [("text", f"Error: {long_error}")]
