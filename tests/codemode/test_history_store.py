"""The SQLite history store: ordering, filtering, spill, watch, durability across reopen."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from registry_service.history.records import DISPATCH, TOOL_CALL, Record
from registry_service.history.sqlite import SqliteHistory


def _record(
    call_id: str, kind: str = TOOL_CALL, agent: str = "agents/a", content: str = ""
) -> Record:
    return Record(
        kind=kind,
        agent=agent,
        call_id=call_id,
        root_call_id=call_id.split(":", maxsplit=1)[0],
        parent_call_id="",
        name="t",
        content_json=content,
        time=1.0,
    )


async def test_appends_get_increasing_seq_and_filter_by_call(tmp_path: Path) -> None:
    store = SqliteHistory(tmp_path / "h.sqlite3")
    stored = await asyncio.gather(*(store.append(_record(f"c{i}")) for i in range(5)))
    assert [r.seq for r in stored] == sorted(r.seq for r in stored)
    await store.append(_record("c1:code:1", DISPATCH))
    await store.append(_record("x", agent="agents/other"))
    assert [
        r.call_id for r in await store.list("agents/a", after_seq=0, limit=100, call_id="c1")
    ] == ["c1", "c1:code:1"]
    page = await store.list("agents/a", after_seq=stored[1].seq, limit=2)
    assert [r.call_id for r in page] == ["c2", "c3"]
    await store.close()


async def test_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    store = SqliteHistory(path)
    await store.append(_record("c1"))
    await store.close()
    again = SqliteHistory(path)
    assert [r.call_id for r in await again.list("agents/a", after_seq=0, limit=10)] == ["c1"]
    await again.close()


async def test_large_content_spills_with_preview_and_locator() -> None:
    store = SqliteHistory(max_inline_bytes=100)
    big = json.dumps([{"type": "text", "text": "x" * 10_000}])
    record = await store.append(_record("c1", content=big))
    assert record.spilled.startswith("spill:")
    assert len(record.content_json) < len(big)
    assert await store.read_spill(record.spilled) == big
    assert await store.read_spill("spill:999") is None
    await store.close()


async def test_watch_replays_then_follows() -> None:
    store = SqliteHistory()
    await store.append(_record("old"))
    seen: list[str] = []

    async def watch() -> None:
        async for record in store.watch("agents/a", 0):
            seen.append(record.call_id)
            if len(seen) == 3:
                return

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.01)
    await store.append(_record("new1"))
    await store.append(_record("elsewhere", agent="agents/b"))
    await store.append(_record("new2"))
    await asyncio.wait_for(task, 5)
    assert seen == ["old", "new1", "new2"]
    await store.close()
