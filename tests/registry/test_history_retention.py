"""History retention: whole calls past the retention age are deleted (outer and nested records,
and what they spilled), calls with a newer record are kept whole, and a configured registry
prunes by itself; read back through the ListHistory and GetRecordContent RPCs."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import grpc
import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.config import RegistrySettings
from registry_service.domain.records import Record
from registry_service.history.sqlite import SqliteHistory
from tests.registry.conftest import Harness

DAY = 86_400.0


def _call(
    agent: str, root: str, at: float, *, nested: int = 1, spill: int = 0, agent_id: str = ""
) -> list[Record]:
    """The records of one run_code call: outer call, `nested` start/settle pairs, outer result
    (kept under `agent_id`, by default the same text as the agent's name)."""

    def record(kind: str, call_id: str, offset: float, content: str = "") -> Record:
        parent = "" if call_id == root else root
        return Record(
            kind=kind,
            agent=agent,
            agent_id=agent_id or agent,
            call_id=call_id,
            root_call_id=root,
            parent_call_id=parent,
            name="run_code" if call_id == root else "t",
            content_json=content,
            time=at + offset,
        )

    body = [record("tool/call", root, 0)]
    for n in range(1, nested + 1):
        sub = f"{root}:code:{n}"
        text = '[{"type":"text","text":"' + "x" * spill + '"}]' if spill else ""
        body += [
            record("tool/code-dispatch-start", sub, n),
            record("tool/code-dispatch", sub, n, text),
        ]
    return [*body, record("tool/result", root, nested + 1, '[{"type":"text","text":"ok"}]')]


async def _kinds(store: SqliteHistory, agent: str) -> list[tuple[str, str]]:
    return [(r.call_id, r.kind) for r in await store.list(agent, after_seq=0, limit=1000)]


async def test_prune_deletes_whole_old_calls_and_their_spills() -> None:
    store = SqliteHistory(":memory:", max_inline_bytes=256)
    now = time.time()
    old = _call("agents/a", "old", now - 3 * DAY, spill=1000)
    straddling = _call("agents/a", "long", now - 2 * DAY)
    straddling[-1] = dataclasses.replace(straddling[-1], time=now)  # ended recently
    for record in [*old, *straddling, *_call("agents/a", "new", now), *_call("agents/b", "b", now)]:
        await store.append(record)
    assert store._db.execute("SELECT COUNT(*) FROM spills").fetchone()[0] == 1

    assert await store.prune(now - DAY) == 1
    assert await store.prune(now - DAY) == 0  # nothing more is old enough
    kept = await _kinds(store, "agents/a")
    assert {call for call, _ in kept} == {"long", "long:code:1", "new", "new:code:1"}
    assert len(kept) == 8  # both calls whole, the one that straddles the cutoff included
    assert [c for c, _ in await _kinds(store, "agents/b")] == ["b", "b:code:1", "b:code:1", "b"]
    assert store._db.execute("SELECT COUNT(*) FROM spills").fetchone()[0] == 0
    await store.close()


async def test_prune_works_in_batches() -> None:
    store = SqliteHistory(":memory:")
    old = time.time() - 10 * DAY
    for n in range(7):
        for record in _call("agents/a", f"c{n}", old):
            await store.append(record)
    assert [await store.prune(time.time(), limit=3) for _ in range(4)] == [3, 3, 1, 0]
    await store.close()


async def test_a_registry_with_retention_prunes_by_itself(make_registry: Any) -> None:
    retention_days = 2 / DAY  # two seconds
    async with make_registry(history_retention_days=retention_days) as h:
        agent = await h.agent("coder")

        async def tool(invocation: Any) -> Any:
            return 1

        h.registry.register_tool("t", tool)
        old = time.time() - 3600
        agent_id = h.registry.catalog.get_agent(agent).agent_id
        for record in _call(agent, "ancient", old, agent_id=agent_id):
            await h.registry.history.append(record)
        await h.execute("t", agent=agent, call_id="fresh")
        first = await _listed(h, agent)
        assert "ancient" in first and "fresh" in first
        await _until(lambda: _listed(h, agent), lambda calls: "ancient" not in calls)
        assert "fresh" in await _listed(h, agent)  # younger than two seconds when pruned


def test_retention_must_be_positive() -> None:
    with pytest.raises(ValueError, match="history_retention_days"):
        RegistrySettings(history_retention_days=0)


async def test_a_pruned_record_is_not_found(make_registry: Any) -> None:
    async with make_registry() as h:
        agent = await h.agent("coder")
        agent_id = h.registry.catalog.get_agent(agent).agent_id
        [record] = [
            await h.registry.history.append(r)
            for r in _call(agent, "gone", time.time() - DAY, nested=0, agent_id=agent_id)[:1]
        ]
        kept = rpb.GetRecordContentRequest(agent=agent, seq=record.seq)
        assert (await h.stub.GetRecordContent(kept)).content == []  # there, until pruned
        # Older than half a day: the call, not the audit record of the agent's creation.
        assert await h.registry.history.prune(time.time() - DAY / 2) == 1
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await h.stub.GetRecordContent(rpb.GetRecordContentRequest(agent=agent, seq=record.seq))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def _listed(h: Harness, agent: str) -> set[str]:
    page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
    return {r.call_id for r in page.records}


async def _until(read: Any, done: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not done(await read()):
        assert time.monotonic() < deadline, "retention did not prune in time"
        await asyncio.sleep(0.1)
