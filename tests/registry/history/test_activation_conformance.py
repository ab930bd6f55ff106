"""The Cordis run request store contract (registry_service/domain/cordis/activation_records.py),
run against the memory store and every store kit (conftest.py): open records are listed in ask
order and read back after a reopen; every move is a conditional update from the states `MOVES`
allows, so the first answer wins and a duplicate or stale one is refused naming what is stored
and changes nothing (also when two stores on one database answer at once); a success is taken
only once the asker started the Host half a page approved (a Client half cannot approve); a
registry that is gone leaves its open records to be interrupted; retention deletes ended
records, never an open one; a write on a broken backend stores nothing; PostgreSQL tells
other registries (never the writer) that records changed."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from codemode_wire.errors import CodemodeError, Status
from registry_service.domain.cordis.activation_records import (
    MOVES,
    OPEN,
    ActivationNotOpen,
    ActivationRecord,
    ActivationState,
    ActivationStore,
    MemoryActivationStore,
    Move,
    PagesAt,
)
from registry_service.history.store import HISTORY_UNAVAILABLE
from registry_service.history.stores import Stores
from tests.postgres_server import PostgresServer
from tests.registry.history.conftest import STORES, StoreKit, _postgres_kit, _sqlite_kit

S = ActivationState


def asked(n: int, store: ActivationStore, **changes: object) -> ActivationRecord:
    record = ActivationRecord(
        f"approval-{n}",
        "agents/coder",
        "panel-1",
        "pkg-1",
        f"run-{n}",
        "run",
        "Panel",
        "Show a panel.",
        True,
        True,
        "return apply",
        "return { apply(ctx) {} }",
        False,
        store.asker_id,
        1000.0 + n,
    )
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


def stored(record: ActivationRecord, position: int, **changes: object) -> ActivationRecord:
    return dataclasses.replace(record, position=position, **changes)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", *STORES])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ActivationStore]:
    """The memory store, or one of a store kit's (the suites' kits, conftest.py)."""
    if request.param == "memory":
        yield MemoryActivationStore("me")
        return
    kits = (
        _sqlite_kit(tmp_path)
        if request.param == "sqlite"
        else _postgres_kit(request.getfixturevalue("postgres"))
    )
    for kit in kits:
        stores = kit.open_stores()
        try:
            yield stores.activations
        finally:
            await stores.history.close()


async def test_open_records_are_listed_in_ask_order(store: ActivationStore) -> None:
    one, two, three = (asked(n, store) for n in (1, 2, 3))
    assert await store.add(one) == stored(one, 1)
    assert await store.add(two) == stored(two, 2)
    assert await store.add(three) == stored(three, 3)
    assert await store.open(limit=10) == [stored(one, 1), stored(two, 2), stored(three, 3)]
    assert await store.open(limit=2) == [stored(one, 1), stored(two, 2)]
    assert await store.get(["approval-3", "approval-1", "nope"]) == [
        stored(one, 1),
        stored(three, 3),
    ]
    # Approved and hosting records are still open; an ended one is not listed.
    await store.move("approval-1", Move(S.APPROVED, "b:1", 1500.0, approve_future=True))
    await store.move("approval-1", Move(S.HOSTING, "a", 1501.0))
    await store.move("approval-2", Move(S.REJECTED, "b:2", 1502.0, detail='{"o":"rejected"}'))
    assert [r.request_id for r in await store.open(limit=10)] == ["approval-1", "approval-3"]


async def test_the_page_sequence_records_who_approved_and_how_it_ended(
    store: ActivationStore,
) -> None:
    record = await store.add(asked(1, store))
    approved = await store.move("approval-1", Move(S.APPROVED, "b:7", 1500.0, approve_future=True))
    assert approved == dataclasses.replace(
        record, state=S.APPROVED, approved_by="b:7", approve_future=True, changed_at=1500.0
    )
    hosting = await store.move("approval-1", Move(S.HOSTING, "a", 1501.0, detail=""))
    assert hosting == dataclasses.replace(approved, state=S.HOSTING, changed_at=1501.0)
    done = await store.move("approval-1", Move(S.SUCCEEDED, "c:3", 1502.0, detail='{"w":[]}'))
    assert done == dataclasses.replace(
        hosting, state=S.SUCCEEDED, settled_by="c:3", detail='{"w":[]}', changed_at=1502.0
    )
    assert await store.get(["approval-1"]) == [done]
    # A failed start keeps the approval and says why; a page then settles it.
    await store.add(asked(2, store))
    await store.move("approval-2", Move(S.APPROVED, "b:7", 1600.0))
    failed = await store.move("approval-2", Move(S.HOST_FAILED, "a", 1601.0, detail="boom"))
    assert (failed.state, failed.detail, failed.approved_by) == (S.HOST_FAILED, "boom", "b:7")
    settled = await store.move("approval-2", Move(S.FAILED, "b:7", 1602.0, detail="host"))
    assert (settled.state, settled.settled_by, settled.detail) == (S.FAILED, "b:7", "host")


async def test_the_first_answer_wins_and_a_duplicate_or_stale_one_changes_nothing(
    store: ActivationStore,
) -> None:
    await store.add(asked(1, store))
    won = await store.move("approval-1", Move(S.REJECTED, "b:1", 2000.0))
    for target in MOVES:
        with pytest.raises(ActivationNotOpen) as refused:
            await store.move("approval-1", Move(target, "eve:1", 2001.0, detail="late"))
        assert refused.value.stored == won
    assert await store.get(["approval-1"]) == [won]
    assert await store.open(limit=10) == []
    # A second approval of an approved record is refused (the first approver started it).
    await store.add(asked(2, store))
    first = await store.move("approval-2", Move(S.APPROVED, "b:1", 2000.0))
    with pytest.raises(ActivationNotOpen) as second:
        await store.move("approval-2", Move(S.APPROVED, "c:1", 2000.5, approve_future=True))
    assert second.value.stored == first
    with pytest.raises(ActivationNotOpen) as unknown:
        await store.move("approval-9", Move(S.REJECTED, "b:1", 2000.0))
    assert unknown.value.stored is None
    with pytest.raises(ValueError, match="never into it"):
        Move(S.PENDING, "b:1", 2000.0)


@pytest.mark.parametrize("before", [S.PENDING, S.APPROVED, S.HOST_FAILED])
async def test_a_success_is_taken_only_from_a_started_host(
    store: ActivationStore, before: ActivationState
) -> None:
    """A page's Client half reporting success cannot stand in for the approval, nor for the
    Host half the asker started: only `hosting` moves to `succeeded`."""
    record = await store.add(asked(1, store))
    if before is not S.PENDING:
        record = await store.move("approval-1", Move(S.APPROVED, "b:1", 1500.0))
    if before is S.HOST_FAILED:
        record = await store.move("approval-1", Move(S.HOST_FAILED, "a", 1501.0, detail="x"))
    with pytest.raises(ActivationNotOpen) as refused:
        await store.move("approval-1", Move(S.SUCCEEDED, "b:1", 1600.0))
    assert refused.value.stored == record
    assert await store.get(["approval-1"]) == [record]
    if before is S.PENDING:  # and the asker cannot skip the approval either
        with pytest.raises(ActivationNotOpen):
            await store.move("approval-1", Move(S.HOSTING, "a", 1600.0))


async def test_an_id_is_stored_once(store: ActivationStore) -> None:
    first = await store.add(asked(1, store))
    with pytest.raises(ActivationNotOpen) as again:
        await store.add(asked(1, store, plugin_id="other-2"))
    assert again.value.stored == first
    assert await store.open(limit=10) == [first]


async def test_the_open_records_of_a_registry_that_is_gone_are_interrupted(
    store: ActivationStore,
) -> None:
    mine = await store.add(asked(1, store))
    theirs = await store.add(asked(2, store, asked_by="f" * 32))
    await store.add(asked(3, store, asked_by="f" * 32))
    await store.move("approval-3", Move(S.REJECTED, "b:1", 2000.0))
    hosting = await store.add(asked(4, store, asked_by="f" * 32))
    await store.move("approval-4", Move(S.APPROVED, "b:1", 2000.0))
    hosting = await store.move("approval-4", Move(S.HOSTING, "f", 2001.0))
    interrupted = await store.interrupt_orphans(at=3000.0)
    assert interrupted == [
        dataclasses.replace(r, state=S.INTERRUPTED, settled_by=store.asker_id, changed_at=3000.0)
        for r in (theirs, hosting)
    ]
    assert await store.open(limit=10) == [mine]
    assert (await store.get(["approval-3"]))[0].state is S.REJECTED
    assert await store.interrupt_orphans(at=3001.0) == []


async def test_records_are_read_back_after_a_reopen(kit: StoreKit) -> None:
    stores = kit.open_stores()
    one = await stores.activations.add(asked(1, stores.activations, source_truncated=True))
    await stores.activations.add(asked(2, stores.activations))
    won = await stores.activations.move("approval-2", Move(S.CANCELLED, "a", 2000.0))
    await stores.history.close()
    again = kit.open_stores()
    try:
        assert await again.activations.get(["approval-1", "approval-2"]) == [one, won]
        # A new process asks under an id of its own: the old one's open record is an orphan.
        assert [r.request_id for r in await again.activations.interrupt_orphans(at=6000.0)] == [
            "approval-1"
        ]
    finally:
        await again.history.close()


@pytest.fixture
def pg_kit(postgres: PostgresServer) -> Iterator[StoreKit]:
    """PostgreSQL's kit only: one SQLite file has one registry."""
    yield from _postgres_kit(postgres)


async def test_two_stores_on_one_database_answering_at_once_one_wins(pg_kit: StoreKit) -> None:
    a, b = pg_kit.open_stores(), pg_kit.open_stores()
    try:
        for n in range(1, 13):
            await a.activations.add(asked(n, a.activations))

        async def answer(stores: Stores, n: int, move: Move) -> ActivationRecord | None:
            try:
                return await stores.activations.move(f"approval-{n}", move)
            except ActivationNotOpen:
                return None

        for n in range(1, 13):
            results = await asyncio.gather(
                answer(a, n, Move(S.APPROVED, "a:1", 2000.0)),
                answer(b, n, Move(S.REJECTED, "b:1", 2000.0)),
                answer(b, n, Move(S.APPROVED, "b:2", 2000.0, approve_future=True)),
            )
            winners = [r for r in results if r is not None]
            final = (await b.activations.get([f"approval-{n}"]))[0]
            if final.state is S.REJECTED:  # rejected first, or after one approval
                assert len(winners) in (1, 2)
            else:
                assert len(winners) == 1 and final == winners[0]
        await a.activations.add(asked(20, a.activations))
        assert await b.activations.interrupt_orphans(at=3000.0) == []  # A's writer is alive
    finally:
        await a.history.close()
        await b.history.close()


async def test_an_expired_lease_makes_the_asker_an_orphan(pg_kit: StoreKit) -> None:
    a, b = pg_kit.open_stores(), pg_kit.open_stores()
    try:
        await a.activations.add(asked(1, a.activations))
        assert await b.activations.interrupt_orphans(at=3000.0) == []
        with psycopg.connect(pg_kit.dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE history_writers SET expires_at = now() - interval '1 second' WHERE id = %s",
                (a.activations.asker_id,),
            )
        [gone] = await b.activations.interrupt_orphans(at=3000.0)
        assert (gone.request_id, gone.state) == ("approval-1", S.INTERRUPTED)
        with pytest.raises(ActivationNotOpen):
            await a.activations.move("approval-1", Move(S.APPROVED, "late", 3001.0))
    finally:
        await a.history.close()
        await b.history.close()


async def test_a_write_on_a_broken_backend_stores_nothing_and_the_store_recovers(
    kit: StoreKit,
) -> None:
    stores = kit.open_stores()
    try:
        await stores.activations.add(asked(1, stores.activations))
        kit.break_backend()
        big = asked(2, stores.activations, source_host="x" * (64 * 1024 * 1024))
        with pytest.raises(CodemodeError) as failed:
            await asyncio.wait_for(stores.activations.add(big), 60)
        assert (failed.value.status, failed.value.reason) == (
            Status.UNAVAILABLE,
            HISTORY_UNAVAILABLE,
        )
        kit.repair_backend()
        [only] = await stores.activations.open(limit=10)
        assert only.request_id == "approval-1"
        await stores.activations.move("approval-1", Move(S.REJECTED, "b:1", 2000.0))
        assert await stores.activations.open(limit=10) == []
    finally:
        await stores.history.close()


async def _until(condition: object, what: str) -> None:
    for _ in range(1500):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(what)


async def test_other_registries_hear_that_records_changed_and_the_writer_does_not(
    kit: StoreKit,
) -> None:
    writer = kit.open_stores()
    reader = kit.open_stores() if kit.name == "postgres" else writer
    heard: list[None] = []
    told: list[None] = []
    reader.activations.follow(lambda: heard.append(None))
    try:
        if reader is writer:  # SQLite: one registry per file, never told anything
            await writer.activations.add(asked(1, writer.activations))
            await asyncio.sleep(0)
            assert heard == []
            return
        writer.activations.follow(lambda: told.append(None))
        await _until(lambda: heard and told, "both LISTENs hold")
        assert (heard, told) == ([None], [None])
        await writer.activations.add(asked(1, writer.activations))
        await writer.activations.move("approval-1", Move(S.REJECTED, "b:1", 2000.0))
        with pytest.raises(ActivationNotOpen):  # refused: nothing changed, nothing told
            await writer.activations.move("approval-1", Move(S.FAILED, "b:1", 2000.0))
        await _until(lambda: len(heard) >= 3, "two changes heard")
        await writer.activations.add(asked(2, writer.activations))  # a latch
        await _until(lambda: len(heard) >= 4, "the latch heard")
        assert len(heard) == 4 and told == [None]
    finally:
        if reader is not writer:
            await reader.history.close()
        await writer.history.close()


async def test_retention_deletes_ended_records_and_never_an_open_one(
    store: ActivationStore,
) -> None:
    for n in (1, 2, 3, 4):
        await store.add(asked(n, store))
    await store.move("approval-1", Move(S.REJECTED, "b:1", 100.0))
    await store.move("approval-2", Move(S.CANCELLED, "a", 200.0))
    await store.move("approval-3", Move(S.APPROVED, "b:1", 50.0))  # open, changed long ago
    assert await store.prune(250.0, limit=1) == 1  # in batches, oldest first
    assert [r.request_id for r in await store.get(["approval-1", "approval-2"])] == ["approval-2"]
    assert await store.prune(250.0) == 1
    assert await store.prune(10_000.0) == 0
    assert [r.request_id for r in await store.open(limit=10)] == ["approval-3", "approval-4"]


def test_every_open_state_can_end() -> None:
    for final in (S.REJECTED, S.FAILED, S.CANCELLED, S.INTERRUPTED):
        assert MOVES[final] == OPEN


async def test_page_presence_is_heard_by_live_registries_only(pg_kit: StoreKit) -> None:
    a, b = pg_kit.open_stores(), pg_kit.open_stores()
    try:
        await a.activations.attach_pages("agents/coder", "10.0.0.1:50051", "[]")
        await a.activations.attach_pages("agents/coder", "10.0.0.1:50051", '[{"id":"Slots"}]')
        await a.activations.attach_pages("agents/other", "10.0.0.1:50051", "")
        assert await a.activations.pages_elsewhere() == []  # its own rows are not "elsewhere"
        assert await b.activations.pages_elsewhere() == [
            PagesAt("agents/coder", a.activations.asker_id, "10.0.0.1:50051", '[{"id":"Slots"}]'),
            PagesAt("agents/other", a.activations.asker_id, "10.0.0.1:50051", ""),
        ]
        await a.activations.detach_pages("agents/other")
        assert [p.agent for p in await b.activations.pages_elsewhere()] == ["agents/coder"]
        # A registry whose history writer lease expired is gone: its rows are not heard.
        with psycopg.connect(pg_kit.dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE history_writers SET expires_at = now() - interval '1 second' WHERE id = %s",
                (a.activations.asker_id,),
            )
        assert await b.activations.pages_elsewhere() == []
    finally:
        await a.history.close()
        await b.history.close()


async def test_one_registry_stores_hear_of_no_pages_elsewhere(store: ActivationStore) -> None:
    await store.attach_pages("agents/coder", "127.0.0.1:1", "[]")
    assert await store.pages_elsewhere() == []
    await store.detach_pages("agents/coder")
    await store.detach_pages("agents/never")  # nothing attached: nothing to do
    assert await store.pages_elsewhere() == []
