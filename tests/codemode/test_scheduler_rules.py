"""Scheduler and binding rules through real runs, read back through ListHistory.

Complements test_scheduler.py: live reclassification of queued calls, what never becomes a
binding, and the settle-record bookkeeping of parallel calls.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Callable
from typing import Any

import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import history_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.codemode.conftest import Stack, value_of

# A hostile program can reach past the `tools` namespace: a binding's closure holds the
# worker's raw call function, which sends any name. The runtime and registry must refuse it.
RAW_CALL = (
    "raw_call = next(\n"
    "    c.cell_contents for c in tools.{via}.__closure__ if callable(c.cell_contents)\n"
    ")\n"
)


async def _history(stack: Stack, agent: str, call_id: str = "") -> list[history_pb2.HistoryRecord]:
    page = await stack.stub.ListHistory(
        rpb.ListHistoryRequest(agent=agent, call_id=call_id, page_size=1000)
    )
    assert not page.next_page_token
    return list(page.records)


async def _run_streaming(
    stack: Stack, program: str, on_log: Callable[[str], None]
) -> list[rpb.ExecuteToolCallResponse]:
    """Runs a program, handing each log event to `on_log` as it arrives."""
    request = rpb.ExecuteToolCallRequest(
        call_id="call-1",
        tool_name="run_code",
        arguments_json=jsonvalue.dumps({"code": program, "description": "streamed"}),
    )
    events = []
    async for event in stack.stub.ExecuteToolCall(request):
        events.append(event)
        if event.WhichOneof("event") == "log":
            on_log(event.log.text)
    return events


@pytest.mark.parametrize("method", ["classifier", "reregister"])
@pytest.mark.parametrize(
    "initially_safe", [True, False], ids=["safe-to-exclusive", "exclusive-to-safe"]
)
async def test_queued_call_is_classified_when_it_starts(
    stack: Stack, method: str, initially_safe: bool
) -> None:
    log: list[str] = []
    active, peak = 0, 0
    gate = asyncio.Event()

    async def blocker(inv: Any) -> Any:
        log.append("start:x")
        await asyncio.wait_for(gate.wait(), 10)
        log.append("end:x")
        return "x"

    def tool(name: str) -> Any:
        async def body(inv: Any) -> Any:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            log.append(f"start:{name}")
            await asyncio.sleep(0.1)
            log.append(f"end:{name}")
            active -= 1
            return name

        return body

    safe = [initially_safe]
    stack.registry.register_tool("x", blocker)  # exclusive: the later calls queue behind it
    stack.registry.register_tool("p", tool("p"), concurrency_safe=True)
    if method == "classifier":
        stack.registry.register_tool("s", tool("s"), concurrency_safe=lambda _a: safe[0])
    else:
        defn = stack.registry.register_tool("s", tool("s"), concurrency_safe=initially_safe)

    def on_log(text: str) -> None:
        # Binding calls leave the worker before the print: s and p are queued behind x now.
        assert text == "queued" and log in ([], ["start:x"])
        if method == "classifier":
            safe[0] = not initially_safe
        else:
            assert stack.registry.catalog.unregister("", defn)
            stack.registry.register_tool("s", tool("s"), concurrency_safe=not initially_safe)
        gate.set()

    program = (
        "import asyncio\n"
        "calls = [tools.x({}), tools.s({}), tools.p({})]\n"
        "print('queued')\n"
        "return await asyncio.gather(*calls)"
    )
    events = await _run_streaming(stack, program, on_log)
    assert value_of(events[-1].result)["result"] == ["x", "s", "p"]
    if initially_safe:  # s is exclusive now: p waits for it
        assert log == ["start:x", "end:x", "start:s", "end:s", "start:p", "end:p"]
        assert peak == 1
    else:  # s is safe now: s and p overlap
        assert log[:4] == ["start:x", "end:x", "start:s", "start:p"]
        assert peak == 2


async def test_run_code_and_restricted_tools_are_never_bindings(stack: Stack) -> None:
    ran: list[str] = []

    async def secret(inv: Any) -> Any:
        ran.append("secret")
        return "leaked"

    async def echo(inv: Any) -> Any:
        return "echo"

    stack.registry.register_tool("secret", secret)
    stack.registry.register_tool("echo", echo)
    agent = await stack.code_agent()
    await stack.stub.AddRestriction(rpb.AddRestrictionRequest(scope=agent, deny=["secret"]))
    program = (
        "out = [sorted(dir(tools)), 'run_code' in tools, 'secret' in tools]\n"
        + RAW_CALL.format(via="echo")
        + "for name in ['run_code', 'secret']:\n"
        "    try:\n"
        "        tools[name]\n"
        "    except KeyError as e:\n"
        "        out.append(repr(e))\n"
        "    try:\n"
        "        getattr(tools, name)\n"
        "    except AttributeError as e:\n"
        "        out.append(str(e))\n"
        "    try:\n"
        "        await raw_call(name, {})\n"
        "    except ToolCallError as e:\n"
        "        out.append([e.toolName, str(e)])\n"
        "return out"
    )
    _, result = await stack.run_code(program, agent=agent)
    assert value_of(result)["result"] == [
        ["echo"],
        False,
        False,
        "KeyError(\"tools has no binding 'run_code'; bindings: echo\")",
        "tools has no binding 'run_code'; bindings: echo",
        ["run_code", 'unknown binding "tools.run_code"'],
        "KeyError(\"tools has no binding 'secret'; bindings: echo\")",
        "tools has no binding 'secret'; bindings: echo",
        ["secret", 'unknown binding "tools.secret"'],
    ]
    assert ran == []
    records = await _history(stack, agent)
    assert [(r.kind, r.call_id) for r in records] == [
        ("tool/call", "call-1"),
        ("tool/result", "call-1"),
    ]


async def test_tool_registered_after_the_run_started_is_not_a_binding(stack: Stack) -> None:
    # The other half (unregistered after enumeration → `unknown tool`) is
    # test_scheduler.py::test_tool_unregistered_after_enumeration.
    ran: list[str] = []

    async def late(inv: Any) -> Any:
        ran.append("late")
        return "late"

    async def registrar(inv: Any) -> Any:
        stack.registry.register_tool("late", late)
        return "registered"

    stack.registry.register_tool("registrar", registrar)
    agent = await stack.code_agent()
    program = (
        "out = [await tools.registrar({}), 'late' in tools]\n"
        + RAW_CALL.format(via="registrar")
        + "try:\n"
        "    tools['late']\n"
        "except KeyError as e:\n"
        "    out.append(repr(e))\n"
        "try:\n"
        "    await raw_call('late', {})\n"
        "except ToolCallError as e:\n"
        "    out.append([e.toolName, str(e)])\n"
        "return out"
    )
    _, result = await stack.run_code(program, agent=agent)
    assert value_of(result)["result"] == [
        "registered",
        False,
        "KeyError(\"tools has no binding 'late'; bindings: registrar\")",
        ["late", 'unknown binding "tools.late"'],
    ]
    assert ran == []
    records = await _history(stack, agent, "call-1")
    assert {r.tool_name for r in records} == {"run_code", "registrar"}
    # The registration itself took: the next run enumerates it.
    _, again = await stack.run_code("return await tools.late({})", agent=agent, call_id="call-2")
    assert value_of(again)["result"] == "late"
    assert ran == ["late"]


async def test_every_start_settles_once_before_the_outer_result(make_stack: Any) -> None:
    async def t(inv: Any) -> Any:
        await asyncio.sleep(inv.arguments["delay"])
        if inv.arguments["i"] == 3:
            raise RuntimeError("three fails")
        return inv.arguments["i"]

    # A cap below the call count: starts wait for slots and settle writes see backpressure.
    async with make_stack(pool_size=1, max_parallel_sub_calls=2) as stack:
        stack.registry.register_tool("t", t, concurrency_safe=True)
        agent = await stack.code_agent()
        # Later calls finish first, so completion order differs from submission order.
        program = (
            "import asyncio\n"
            "delays = [0.08, 0.0, 0.05, 0.0, 0.03, 0.0]\n"
            "calls = [tools.t({'i': i, 'delay': d}) for i, d in enumerate(delays, 1)]\n"
            "out = await asyncio.gather(*calls, return_exceptions=True)\n"
            "return [str(r) if isinstance(r, Exception) else r for r in out]"
        )
        _, result = await stack.run_code(program, agent=agent)
        assert value_of(result)["result"] == [1, 2, "three fails", 4, 5, 6]
        records = await _history(stack, agent)

    assert (records[0].kind, records[-1].kind) == ("tool/call", "tool/result")
    outer_result = records[-1]
    starts = [r for r in records if r.kind == "tool/code-dispatch-start"]
    settles = [r for r in records if r.kind == "tool/code-dispatch"]
    ids = [f"call-1:code:{n}" for n in range(1, 7)]
    # Starts are written in submission order, and call n carries the n-th submitted arguments.
    assert [r.call_id for r in starts] == ids
    assert [json.loads(r.arguments_json)["i"] for r in starts] == [1, 2, 3, 4, 5, 6]
    assert collections.Counter(r.call_id for r in settles) == collections.Counter(ids)
    by_id = {r.call_id: r for r in settles}
    for start in starts:
        settle = by_id[start.call_id]
        assert start.seq < settle.seq < outer_result.seq
        assert settle.arguments_json == start.arguments_json
    assert [by_id[i].is_error for i in ids] == [False, False, True, False, False, False]
    assert by_id["call-1:code:3"].content[0].text.text == "Error: three fails"
