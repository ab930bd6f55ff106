"""The pipeline's observers (docs/pipeline.md, "Observers"): a model-direct call's events reach
every observer once each, in the order they happen, and an observer that raises on every event
changes neither the call's result nor what the other observers (history, telemetry) see."""

from __future__ import annotations

from typing import Any

from registry_service.domain.events import (
    CallFinished,
    CallReceived,
    CallStarted,
    Observed,
    StageTimed,
    ToolResolved,
)
from registry_service.domain.observers import Observers, Write
from tests.registry.conftest import Harness, result_text


class Recording:
    def __init__(self) -> None:
        self.seen: list[Observed] = []

    def observe(self, event: Observed) -> Write | None:
        self.seen.append(event)
        return None


class Raising:
    def __init__(self) -> None:
        self.raised = 0

    def observe(self, event: Observed) -> Write | None:
        self.raised += 1
        raise RuntimeError("a broken observer")


def _attach(harness: Harness, *observers: Any) -> None:
    executor = harness.registry.executor
    executor.observers = Observers((*observers, *executor.observers.members))


async def test_a_direct_call_is_observed_once_in_order(harness: Harness) -> None:
    recording = Recording()
    _attach(harness, recording)

    async def body(inv: Any) -> Any:
        return {"ok": True}

    harness.registry.register_tool("t", body)
    agent = await harness.agent("observed")
    _, result = await harness.execute("t", agent=agent)
    assert not result.is_error

    kinds = [type(event).__name__ for event in recording.seen]
    assert kinds[0] == CallReceived.__name__
    assert kinds[-1] == CallFinished.__name__
    for once in (CallReceived, ToolResolved, CallStarted, CallFinished):
        assert kinds.count(once.__name__) == 1, kinds
    bodies = [e for e in recording.seen if isinstance(e, StageTimed) and e.stage == "body"]
    assert len(bodies) == 1
    order = [kinds.index(ToolResolved.__name__), kinds.index(CallStarted.__name__)]
    order += [recording.seen.index(bodies[0]), kinds.index(CallFinished.__name__)]
    assert order == sorted(order), kinds
    finished = recording.seen[-1]
    assert isinstance(finished, CallFinished) and not finished.result.is_error


async def test_an_observer_that_raises_changes_no_result_and_no_record(harness: Harness) -> None:
    async def body(inv: Any) -> Any:
        return {"n": 7}

    harness.registry.register_tool("t", body)
    agent = await harness.agent("observed")
    _, plain = await harness.execute("t", agent=agent, call_id="plain")

    raising, recording = Raising(), Recording()
    _attach(harness, raising, recording)
    _, observed = await harness.execute("t", agent=agent, call_id="observed")

    assert raising.raised > 0
    assert observed.is_error == plain.is_error
    assert result_text(observed) == result_text(plain)
    # The observers after the broken one saw the whole call, and history recorded it.
    kinds = [type(event).__name__ for event in recording.seen]
    assert kinds[0] == CallReceived.__name__ and kinds[-1] == CallFinished.__name__
    agent_id = harness.registry.catalog.get_agent(agent).agent_id
    records = await harness.registry.history.list(
        agent_id, after_seq=0, limit=100, call_id="observed"
    )
    assert [r.kind for r in records] == ["tool/call", "tool/result"]
