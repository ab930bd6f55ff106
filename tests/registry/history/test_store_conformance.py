"""The history store contract (registry_service/history/store.py), run against every store kit
(conftest.py): ordering and seq, filters and paging, watch, spill, durability, retention,
closing interrupted calls, and what a full disk or damaged data does."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import json
import time
from collections.abc import Sequence

import pytest

from codemode_wire.errors import CodemodeError, Status
from registry_service.domain.records import (
    DISPATCH,
    DISPATCH_START,
    INTERRUPTED,
    MAX_KEY_BYTES,
    TOOL_CALL,
    TOOL_RESULT,
    Record,
)
from registry_service.history.store import (
    HISTORY_CORRUPT,
    HISTORY_RECORD_INVALID,
    HISTORY_UNAVAILABLE,
    HistoryStore,
    StoreState,
)
from tests.registry.history.conftest import StoreKit

DAY = 86_400.0
_TEXT = '[{"type":"text","text":"ok"}]'


def rec(
    kind: str,
    call_id: str,
    *,
    agent: str = "agents/a",
    at: float | None = None,
    content: str = "",
    arguments: str = "",
) -> Record:
    root, _, _ = call_id.partition(":")
    return Record(
        kind=kind,
        agent=agent,
        agent_id=agent,  # the history key: a stable id (here the same text as the name)
        call_id=call_id,
        root_call_id=root,
        parent_call_id=root if call_id != root else "",
        name="run_code" if call_id == root else "t",
        arguments_json=arguments,
        content_json=content,
        time=time.time() if at is None else at,
    )


def call(root: str, *, agent: str = "agents/a", at: float | None = None, nested: int = 1,
         spill: int = 0) -> list[Record]:  # fmt: skip
    """The records of one finished run_code call with `nested` nested calls."""
    at = time.time() if at is None else at
    body = [rec(TOOL_CALL, root, agent=agent, at=at, arguments='{"code":"x"}')]
    for n in range(1, nested + 1):
        sub = f"{root}:code:{n}"
        text = json.dumps([{"type": "text", "text": "x" * spill}]) if spill else _TEXT
        body += [
            rec(DISPATCH_START, sub, agent=agent, at=at + n, arguments='{"n":1}'),
            rec(DISPATCH, sub, agent=agent, at=at + n, arguments='{"n":1}', content=text),
        ]
    return [*body, rec(TOOL_RESULT, root, agent=agent, at=at + nested + 1, content=_TEXT)]


async def append_all(store: HistoryStore, records: Sequence[Record]) -> list[Record]:
    return [await store.append(r) for r in records]


async def everything(store: HistoryStore, agent: str = "agents/a") -> list[Record]:
    return list(await store.list(agent, after_seq=0, limit=10_000))


def shape(records: Sequence[Record]) -> list[tuple[str, str]]:
    return [(r.call_id, r.kind) for r in records]


# -- ordering, filters, paging ---------------------------------------------------------------


async def test_seq_is_strictly_increasing_per_agent_in_submission_order(kit: StoreKit) -> None:
    store = kit.open()
    # One event-loop turn (one batch) interleaving two agents, then single appends.
    batch = [
        store.submit(rec(TOOL_CALL, f"c{n}", agent=f"agents/{'ab'[n % 2]}")) for n in range(20)
    ]
    stored = await asyncio.gather(*batch)
    later = [await store.append(rec(TOOL_CALL, f"d{n}", agent="agents/a")) for n in range(5)]
    for agent in ("agents/a", "agents/b"):
        listed = await everything(store, agent)
        submitted = [r.call_id for r in [*stored, *later] if r.agent == agent]
        assert [r.call_id for r in listed] == submitted
        seqs = [r.seq for r in listed]
        assert all(b > a for a, b in itertools.pairwise(seqs)) and seqs[0] > 0
    # What append returned is what a list reads back.
    assert {r.seq: r for r in await everything(store)} == {
        r.seq: r for r in [*stored, *later] if r.agent == "agents/a"
    }
    await store.close()


async def test_list_filters_by_call_and_root_call(kit: StoreKit) -> None:
    store = kit.open()
    await append_all(store, call("c1", nested=2))
    await append_all(store, call("c2"))
    await append_all(store, call("c1", agent="agents/other"))
    assert shape(await store.list("agents/a", after_seq=0, limit=100, call_id="c1")) == [
        ("c1", TOOL_CALL),
        ("c1:code:1", DISPATCH_START),
        ("c1:code:1", DISPATCH),
        ("c1:code:2", DISPATCH_START),
        ("c1:code:2", DISPATCH),
        ("c1", TOOL_RESULT),
    ]
    nested = await store.list("agents/a", after_seq=0, limit=100, call_id="c1:code:2")
    assert shape(nested) == [("c1:code:2", DISPATCH_START), ("c1:code:2", DISPATCH)]
    assert await store.list("agents/nobody", after_seq=0, limit=100) == []
    await store.close()


async def test_pages_continue_after_the_last_seq_without_gaps_or_repeats(kit: StoreKit) -> None:
    store = kit.open()
    written = await append_all(store, [rec(TOOL_CALL, f"c{n}") for n in range(23)])
    pages: list[list[Record]] = []
    token = 0
    while page := list(await store.list("agents/a", after_seq=token, limit=5)):
        pages.append(page)
        token = page[-1].seq
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [r.seq for p in pages for r in p] == [r.seq for r in written]
    # A token past the end reads nothing; a token from the middle reads the rest.
    assert await store.list("agents/a", after_seq=written[-1].seq, limit=5) == []
    rest = await store.list("agents/a", after_seq=written[19].seq, limit=100)
    assert [r.call_id for r in rest] == ["c20", "c21", "c22"]
    await store.close()


async def test_records_survive_a_reopen(kit: StoreKit) -> None:
    store = kit.open()
    written = await append_all(store, call("c1"))
    await store.close()
    again = kit.open()
    assert await everything(again) == written
    follow = await again.append(rec(TOOL_CALL, "c2"))
    assert follow.seq > written[-1].seq  # seq keeps increasing across the reopen
    await again.close()


# -- watch -----------------------------------------------------------------------------------


async def test_watch_replays_then_follows_one_agent(kit: StoreKit) -> None:
    store = kit.open()
    first = await store.append(rec(TOOL_CALL, "old0"))
    await store.append(rec(TOOL_CALL, "old1"))
    seen: list[str] = []
    following = asyncio.Event()

    async def watch() -> None:
        async for record in store.watch("agents/a", first.seq):
            seen.append(record.call_id)
            following.set()
            if len(seen) == 3:
                return

    task = asyncio.create_task(watch())
    await asyncio.wait_for(following.wait(), 10)  # the backlog is out: live records follow
    await store.append(rec(TOOL_CALL, "new1"))
    await store.append(rec(TOOL_CALL, "elsewhere", agent="agents/b"))
    await store.append(rec(TOOL_CALL, "new2"))
    await asyncio.wait_for(task, 10)
    assert seen == ["old1", "new1", "new2"]
    await store.close()


async def test_end_watches_ends_live_watches(kit: StoreKit) -> None:
    store = kit.open()
    await store.append(rec(TOOL_CALL, "c1"))
    got: list[str] = []
    started = asyncio.Event()

    async def watch() -> None:
        async for record in store.watch("agents/a", 0):
            got.append(record.call_id)
            started.set()

    task = asyncio.create_task(watch())
    await asyncio.wait_for(started.wait(), 10)
    store.end_watches()
    await asyncio.wait_for(task, 10)
    assert got == ["c1"]
    await store.close()


# -- spill -----------------------------------------------------------------------------------


async def test_large_content_spills_and_reads_back_in_full(kit: StoreKit) -> None:
    store = kit.open(max_inline_bytes=512)
    image = base64.b64encode(bytes(range(256)) * 8).decode()
    big = json.dumps(
        [
            {"type": "text", "text": "line\n" * 1000},
            {"type": "image", "mime_type": "image/png", "data": image},
        ]
    )
    small = await store.append(rec(TOOL_RESULT, "c0", content=_TEXT))
    record = await store.append(rec(TOOL_RESULT, "c1", content=big))
    assert small.spilled == "" and small.content_json == _TEXT
    assert record.spilled
    [preview] = json.loads(record.content_json)  # a text preview within the inline limit
    assert preview["text"].startswith("line\nline\n") and len(preview["text"]) <= 512
    assert await store.read_spill(record.spilled) == big
    [listed] = await store.list("agents/a", after_seq=small.seq, limit=1)
    assert listed.spilled == record.spilled and listed.content_json == record.content_json
    assert await store.read_spill(record.spilled + "0") is None
    assert await store.read_spill("nonsense") is None
    await store.close()


# -- retention -------------------------------------------------------------------------------


async def test_prune_deletes_whole_old_calls_and_what_they_spilled(kit: StoreKit) -> None:
    store = kit.open(max_inline_bytes=256)
    now = time.time()
    old = await append_all(store, call("old", at=now - 3 * DAY, spill=1000))
    straddling = call("long", at=now - 2 * DAY)
    straddling[-1] = rec(TOOL_RESULT, "long", at=now, content=_TEXT)  # ended recently
    await append_all(store, straddling)
    await append_all(store, call("new", at=now))
    await append_all(store, call("b", agent="agents/b", at=now - 3 * DAY))
    [spilled] = [r.spilled for r in old if r.spilled]

    assert await store.prune(now - DAY, limit=1) == 1
    assert await store.prune(now - DAY) == 1  # the other old call, of the other agent
    assert await store.prune(now - DAY) == 0
    kept = shape(await everything(store))
    assert {c for c, _ in kept} == {"long", "long:code:1", "new", "new:code:1"}
    assert len(kept) == 8  # both calls whole, the one that straddles the cutoff included
    assert await everything(store, "agents/b") == []
    assert await store.read_spill(spilled) is None
    await store.close()


# -- interrupted calls -----------------------------------------------------------------------


async def test_calls_left_open_are_closed_once_nested_first(kit: StoreKit) -> None:
    store = kit.open()
    await append_all(store, call("done"))
    # A run_code call cut off with one nested call settled and one in flight, and a direct
    # call cut off in its body; another agent's call too.
    await append_all(
        store,
        [
            rec(TOOL_CALL, "run", arguments='{"code":"x"}'),
            rec(DISPATCH_START, "run:code:1", arguments='{"n":1}'),
            rec(DISPATCH, "run:code:1", arguments='{"n":1}', content=_TEXT),
            rec(DISPATCH_START, "run:code:2", arguments='{"n":2}'),
            rec(TOOL_CALL, "direct"),
            rec(TOOL_CALL, "other", agent="agents/b"),
        ],
    )
    await store.close()

    store = kit.open()
    closed = await store.close_interrupted()
    assert {(r.agent, r.call_id, r.kind) for r in closed} == {
        ("agents/a", "run:code:2", DISPATCH),
        ("agents/a", "run", TOOL_RESULT),
        ("agents/a", "direct", TOOL_RESULT),
        ("agents/b", "other", TOOL_RESULT),
    }
    assert all(r.is_error and r.error_code == INTERRUPTED and r.seq for r in closed)
    records = await everything(store)
    assert shape(records)[-3:] == [
        ("direct", TOOL_RESULT),
        ("run:code:2", DISPATCH),
        ("run", TOOL_RESULT),
    ]
    settle = records[-2]
    assert settle.root_call_id == settle.parent_call_id == "run"
    assert settle.arguments_json == '{"n":2}' and settle.name == "t"
    assert "interrupted" in json.loads(settle.content_json)[0]["text"]
    assert await store.close_interrupted() == []
    await store.close()

    store = kit.open()  # exactly once: a later start finds nothing open
    assert await store.close_interrupted() == []
    assert await everything(store) == records
    await store.close()


async def test_a_reused_call_id_is_not_closed_twice(kit: StoreKit) -> None:
    store = kit.open()
    await append_all(store, [rec(TOOL_CALL, "c"), rec(TOOL_RESULT, "c"), rec(TOOL_CALL, "c")])
    [closed] = await store.close_interrupted()
    assert (closed.call_id, closed.kind) == ("c", TOOL_RESULT)
    assert await store.close_interrupted() == []
    await store.close()


async def test_pruned_calls_are_not_closed(kit: StoreKit) -> None:
    store = kit.open()
    await store.append(rec(TOOL_CALL, "ancient", at=time.time() - 3 * DAY))
    assert await store.prune(time.time() - DAY) == 1
    assert await store.close_interrupted() == []
    await store.close()


# -- failures --------------------------------------------------------------------------------


async def _fails(future: asyncio.Future[Record] | Record | BaseException, reason: str) -> None:
    assert isinstance(future, CodemodeError), future
    assert future.reason == reason


async def test_a_backend_failure_fails_the_whole_batch_at_once_then_recovers(kit: StoreKit) -> None:
    store = kit.open()
    before = await append_all(store, call("c0"))
    kit.break_backend()
    batch = [store.submit(r) for r in call("c1", nested=3)]
    # Bounded wait: a batch that never resolves fails here instead of hanging the suite.
    outcomes = await asyncio.wait_for(asyncio.gather(*batch, return_exceptions=True), 30)
    for outcome in outcomes:
        await _fails(outcome, HISTORY_UNAVAILABLE)
    assert all(isinstance(o, CodemodeError) and o.status is Status.UNAVAILABLE for o in outcomes)
    assert store.state is StoreState.UNAVAILABLE
    # Still broken: a probe fails too, and the state stays.
    assert await store.check() is StoreState.UNAVAILABLE

    kit.repair_backend()
    assert await asyncio.wait_for(store.check(), 30) is StoreState.OK
    after = await append_all(store, call("c2"))
    records = await everything(store)
    assert records == [*before, *after]  # nothing of the failed batch, not half of it
    assert before[-1].seq < after[0].seq
    await store.close()


async def test_state_changed_wakes_on_failure_and_recovery(kit: StoreKit) -> None:
    store = kit.open()
    assert store.state is StoreState.OK
    watcher = asyncio.create_task(store.state_changed(StoreState.OK))
    kit.break_backend()
    with pytest.raises(CodemodeError):
        await store.append(rec(TOOL_CALL, "c1"))
    assert await asyncio.wait_for(watcher, 10) is StoreState.UNAVAILABLE
    kit.repair_backend()
    recovered = asyncio.create_task(store.state_changed(StoreState.UNAVAILABLE))
    await store.append(rec(TOOL_CALL, "c2"))  # a write that works is a recovery too
    assert await asyncio.wait_for(recovered, 10) is StoreState.OK
    await store.close()


async def test_an_end_record_lost_to_a_backend_failure_is_closed_as_interrupted(
    kit: StoreKit,
) -> None:
    store = kit.open()
    started = await store.append(rec(TOOL_CALL, "c1"))
    kit.break_backend()
    with pytest.raises(CodemodeError) as lost:
        await store.append(rec(TOOL_RESULT, "c1", content=_TEXT))
    assert lost.value.reason == HISTORY_UNAVAILABLE
    kit.repair_backend()
    nxt = await store.append(rec(TOOL_CALL, "c2"))
    records = await everything(store)
    assert shape(records) == [("c1", TOOL_CALL), ("c1", TOOL_RESULT), ("c2", TOOL_CALL)]
    closing = records[1]
    assert started.seq < closing.seq < nxt.seq
    assert closing.is_error and closing.error_code == INTERRUPTED
    await store.close()
    again = kit.open()  # closed once: not again at the next start
    assert [(r.call_id, r.kind) for r in await again.close_interrupted()] == [("c2", TOOL_RESULT)]
    await again.close()


async def test_damaged_data_is_reported_corrupt_and_nothing_is_read_or_written(
    kit: StoreKit,
) -> None:
    store = kit.open()
    for n in range(40):  # several pages of records and indexes
        await append_all(store, call(f"c{n}", nested=2))
    await store.close()
    kit.corrupt()

    store = kit.open()
    assert store.state is StoreState.CORRUPT
    for operation in (
        store.append(rec(TOOL_CALL, "new")),
        store.list("agents/a", after_seq=0, limit=10),
        store.read_spill("spill:1"),
        store.prune(time.time()),
        store.close_interrupted(),
    ):
        with pytest.raises(CodemodeError) as failed:
            await asyncio.wait_for(operation, 30)
        assert (failed.value.status, failed.value.reason) == (Status.DATA_LOSS, HISTORY_CORRUPT)
    assert await store.check() is StoreState.CORRUPT
    await store.close()


# -- one bad record --------------------------------------------------------------------------


def _refused(outcome: object) -> bool:
    return (
        isinstance(outcome, CodemodeError)
        and outcome.status is Status.INVALID_ARGUMENT
        and outcome.reason == HISTORY_RECORD_INVALID
    )


async def _one_turn_with_others(
    store: HistoryStore, bad: Sequence[Record]
) -> tuple[list[object], list[object]]:
    """Submits `bad` in one turn (one batch) among 20 good records of another agent; returns
    the outcomes of the bad ones and of the good ones."""
    good = [rec(TOOL_CALL, f"b{n}", agent="agents/b") for n in range(20)]
    futures: list[asyncio.Future[Record]] = []
    for n, record in enumerate(good):
        futures.append(store.submit(record))
        if n % 4 == 0 and n // 4 < len(bad):
            futures.append(store.submit(bad[n // 4]))
    outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)
    by_call = {r.call_id: o for r, o in zip(_interleaved(good, bad), outcomes, strict=True)}
    return [by_call[r.call_id] for r in bad], [by_call[r.call_id] for r in good]


def _interleaved(good: Sequence[Record], bad: Sequence[Record]) -> list[Record]:
    out: list[Record] = []
    for n, record in enumerate(good):
        out.append(record)
        if n % 4 == 0 and n // 4 < len(bad):
            out.append(bad[n // 4])
    return out


async def test_a_record_no_store_can_hold_fails_alone(kit: StoreKit) -> None:
    store = kit.open()
    await store.append(rec(TOOL_CALL, "open"))
    bad = [
        rec(TOOL_CALL, "nul\x00id"),
        dataclasses.replace(rec(TOOL_RESULT, "open"), is_error=True, error_code="CODE\x00"),
        dataclasses.replace(rec(TOOL_CALL, "surrogate"), name="t\ud800"),
        rec(TOOL_CALL, "x" * (MAX_KEY_BYTES + 1)),
        rec(TOOL_CALL, "nul-arguments", arguments='{"a":"\x00"}'),
    ]
    refused, written = await _one_turn_with_others(store, bad)
    assert all(_refused(o) for o in refused), refused
    assert all(isinstance(o, Record) for o in written), written
    assert [r.call_id for r in await everything(store, "agents/b")] == [f"b{n}" for n in range(20)]
    assert store.state is StoreState.OK
    # The call whose end was refused is not left open: the next write closes it, interrupted.
    await store.append(rec(TOOL_CALL, "next"))
    assert [(r.call_id, r.kind, r.error_code) for r in await everything(store)] == [
        ("open", TOOL_CALL, ""),
        ("open", TOOL_RESULT, INTERRUPTED),
        ("next", TOOL_CALL, ""),
    ]
    # A read asking for such a value finds nothing (no record holds it), and the store is OK.
    for call_id in ("a\x00b", "a\udc80", "x" * (MAX_KEY_BYTES + 1)):
        assert await store.list("agents/a", after_seq=0, limit=10, call_id=call_id) == []
        assert await store.list(call_id, after_seq=0, limit=10) == []
    assert store.state is StoreState.OK
    assert await store.check() is StoreState.OK
    await store.close()


async def test_a_record_the_backend_refuses_fails_alone_and_the_rest_are_written(
    kit: StoreKit,
) -> None:
    store = kit.open()
    await store.append(rec(TOOL_CALL, "ending"))
    kit.refuse_marked()
    bad = [
        rec(TOOL_CALL, "starting", arguments='{"refuse":1}'),
        dataclasses.replace(rec(TOOL_RESULT, "ending"), is_error=True, error_code="REFUSE"),
    ]
    refused, written = await _one_turn_with_others(store, bad)
    assert all(_refused(o) for o in refused), refused
    assert all(isinstance(o, Record) for o in written), written
    listed = await everything(store, "agents/b")
    assert [r.call_id for r in listed] == [f"b{n}" for n in range(20)]
    assert [r.seq for r in listed] == sorted({r.seq for r in listed})
    assert store.state is StoreState.OK
    # The refused end's call is closed by the next batch, interrupted; nothing of the other.
    await asyncio.gather(store.submit(rec(TOOL_CALL, "next")), store.submit(rec(TOOL_CALL, "n2")))
    assert [(r.call_id, r.kind, r.error_code) for r in await everything(store)] == [
        ("ending", TOOL_CALL, ""),
        ("ending", TOOL_RESULT, INTERRUPTED),
        ("next", TOOL_CALL, ""),
        ("n2", TOOL_CALL, ""),
    ]
    assert store.state is StoreState.OK
    await store.close()
