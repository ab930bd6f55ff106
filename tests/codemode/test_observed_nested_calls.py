"""A `run_code` program's nested calls reach the executor's observers as the direct call does
(docs/pipeline.md, "Observers"): each one received, started and settled exactly once, in that
order, all between its run's start and end, which sit inside the outer call's received and
finished; the history recorder among the same observers wrote each one's records."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from registry_service.domain.events import (
    CallFinished,
    CallReceived,
    NestedCallReceived,
    NestedCallSettled,
    NestedCallStarted,
    RunEnded,
    RunStarted,
)
from registry_service.domain.observers import Observers
from tests.codemode.conftest import Stack, value_of
from tests.registry.test_observers import Recording


async def test_nested_calls_are_observed_once_each_in_order_inside_their_run(
    make_stack: Any,
) -> None:
    async with make_stack() as stack:
        assert isinstance(stack, Stack)
        recording = Recording()
        executor = stack.registry.executor
        executor.observers = Observers((recording, *executor.observers.members))

        async def double(inv: Any) -> Any:
            return {"n": inv.arguments["n"] * 2}

        stack.registry.register_tool(
            "double",
            double,
            input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
            concurrency_safe=True,
        )
        agent = await stack.agent("watched")
        program = (
            "import asyncio\n"
            "values = await asyncio.gather(*(tools.double({'n': n}) for n in range(3)))\n"
            "return [v['n'] for v in values]"
        )
        _events, result = await stack.run_code(program, agent=agent, call_id="outer")
        assert value_of(result)["result"] == [0, 2, 4]
        history = stack.registry.history
        agent_id = stack.registry.catalog.get_agent(agent).agent_id
        kinds = {
            sub_call_id: [
                r.kind
                for r in await history.list(agent_id, after_seq=0, limit=100, call_id=sub_call_id)
            ]
            for sub_call_id in (f"outer:code:{n}" for n in range(1, 4))
        }
    nested = ["tool/code-dispatch-start", "tool/code-dispatch"]
    assert kinds == {f"outer:code:{n}": nested for n in range(1, 4)}
    seen = recording.seen
    first, last = seen[0], seen[-1]
    assert isinstance(first, CallReceived) and first.call.call_id == "outer"
    assert isinstance(last, CallFinished) and last.call.call_id == "outer"
    (run_start,) = [i for i, e in enumerate(seen) if isinstance(e, RunStarted)]
    (run_end,) = [i for i, e in enumerate(seen) if isinstance(e, RunEnded)]
    steps: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for index, event in enumerate(seen):
        if isinstance(event, NestedCallReceived):
            steps[event.call.call_id].append(("received", index))
        elif isinstance(event, NestedCallStarted):
            steps[event.sub_call_id].append(("started", index))
        elif isinstance(event, NestedCallSettled):
            assert not event.is_error
            steps[event.sub_call_id].append(("settled", index))
    assert sorted(steps) == [f"outer:code:{n}" for n in range(1, 4)], steps
    for sub_call_id, order in steps.items():
        assert [step for step, _ in order] == ["received", "started", "settled"], sub_call_id
        assert all(run_start < index < run_end for _, index in order), sub_call_id
