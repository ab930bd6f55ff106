"""The approval store contract (registry_service/domain/approval_records.py), run against the
memory store and every store kit (conftest.py): a pending record is listed in ask order and
read back after a reopen; the first answer wins and a stale, duplicate or late (expired)
answer is refused naming what is stored and changes nothing, also when two stores on one
database answer at once; a registry that is gone leaves its pending records to be
interrupted; retention deletes ended records, never a pending one; a write on a broken backend
stores nothing; PostgreSQL tells other registries
(never the writer) that approvals changed."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from codemode_wire.errors import CodemodeError, Status
from registry_service.domain.approval_records import (
    ApprovalNotPending,
    ApprovalRecord,
    ApprovalState,
    ApprovalStore,
    MemoryApprovalStore,
)
from registry_service.history.store import HISTORY_UNAVAILABLE
from registry_service.history.stores import Stores
from tests.postgres_server import PostgresServer
from tests.registry.history.conftest import STORES, StoreKit, _postgres_kit, _sqlite_kit

PENDING, ALLOWED, REJECTED = (
    ApprovalState.PENDING,
    ApprovalState.ALLOWED_ONCE,
    ApprovalState.REJECTED,
)


def asked(n: int, store: ApprovalStore, **changes: object) -> ApprovalRecord:
    record = ApprovalRecord(
        f"approval-{n}",
        "agents/coder",
        "user:alice",
        f"call-{n}",
        "write",
        '{"path":"a.txt"}',
        "write changes files",
        store.asker_id,
        1000.0 + n,
    )
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


def stored(record: ApprovalRecord, position: int, **changes: object) -> ApprovalRecord:
    return dataclasses.replace(record, position=position, **changes)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", *STORES])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ApprovalStore]:
    """The memory store, or one of a store kit's (the suites' kits, conftest.py)."""
    if request.param == "memory":
        yield MemoryApprovalStore("me")
        return
    kits = (
        _sqlite_kit(tmp_path)
        if request.param == "sqlite"
        else _postgres_kit(request.getfixturevalue("postgres"))
    )
    for kit in kits:
        stores = kit.open_stores()
        try:
            yield stores.approvals
        finally:
            await stores.history.close()


async def test_pending_records_are_listed_in_ask_order_and_paged(store: ApprovalStore) -> None:
    one, two, three = (asked(n, store) for n in (1, 2, 3))
    assert await store.add(one) == stored(one, 1)
    assert await store.add(two) == stored(two, 2)
    assert await store.add(three) == stored(three, 3)
    assert await store.pending(limit=10) == [stored(one, 1), stored(two, 2), stored(three, 3)]
    assert await store.pending(after=1, limit=1) == [stored(two, 2)]
    assert await store.pending(after=3, limit=10) == []
    assert await store.get(["approval-3", "approval-1", "nope"]) == [
        stored(one, 1),
        stored(three, 3),
    ]


async def test_the_first_answer_wins_and_a_duplicate_or_stale_one_changes_nothing(
    store: ApprovalStore,
) -> None:
    record = asked(1, store)
    await store.add(record)
    won = await store.resolve("approval-1", ALLOWED, by="approver:bob", at=2000.0)
    assert won == stored(record, 1, state=ALLOWED, answered_by="approver:bob", answered_at=2000.0)
    for state in (REJECTED, ALLOWED, ApprovalState.CANCELLED, ApprovalState.EXPIRED):
        with pytest.raises(ApprovalNotPending) as refused:
            await store.resolve("approval-1", state, by="approver:eve", at=2001.0)
        assert refused.value.stored == won
    assert await store.get(["approval-1"]) == [won]
    assert await store.pending(limit=10) == []
    with pytest.raises(ApprovalNotPending) as unknown:
        await store.resolve("approval-9", ALLOWED, by="approver:bob", at=2000.0)
    assert unknown.value.stored is None
    with pytest.raises(ValueError, match="final state"):
        await store.resolve("approval-1", PENDING, by="approver:bob", at=2000.0)


async def test_an_id_is_stored_once(store: ApprovalStore) -> None:
    first = await store.add(asked(1, store))
    with pytest.raises(ApprovalNotPending) as again:
        await store.add(asked(1, store, tool_name="other"))
    assert again.value.stored == first
    assert await store.pending(limit=10) == [first]


async def test_an_answer_after_the_expiry_is_refused_and_the_record_expires(
    store: ApprovalStore,
) -> None:
    record = await store.add(asked(1, store, expires_at=1500.0))
    for state in (ALLOWED, REJECTED):
        with pytest.raises(ApprovalNotPending) as late:
            await store.resolve("approval-1", state, by="approver:bob", at=1500.0)
        assert late.value.stored == record  # still pending: only its expiry may end it now
    expired = await store.resolve("approval-1", ApprovalState.EXPIRED, by="registry", at=1500.0)
    assert expired.state is ApprovalState.EXPIRED
    # Before the expiry an answer wins as usual.
    await store.add(asked(2, store, expires_at=1500.0))
    answered = await store.resolve("approval-2", REJECTED, by="approver:bob", at=1499.5)
    assert answered.state is REJECTED


async def test_the_pending_records_of_a_registry_that_is_gone_are_interrupted(
    store: ApprovalStore,
) -> None:
    mine = await store.add(asked(1, store))
    theirs = await store.add(asked(2, store, asked_by="f" * 32))
    answered = await store.add(asked(3, store, asked_by="f" * 32))
    await store.resolve("approval-3", REJECTED, by="approver:bob", at=2000.0)
    interrupted = await store.interrupt_orphans(at=3000.0)
    assert interrupted == [
        dataclasses.replace(
            theirs,
            state=ApprovalState.INTERRUPTED,
            answered_by=store.asker_id,
            answered_at=3000.0,
        )
    ]
    assert await store.pending(limit=10) == [mine]
    assert (await store.get(["approval-3"]))[0].state is REJECTED != answered.state
    assert await store.interrupt_orphans(at=3001.0) == []


async def test_records_are_read_back_after_a_reopen(kit: StoreKit) -> None:
    stores = kit.open_stores()
    one = await stores.approvals.add(asked(1, stores.approvals, expires_at=5000.0))
    two = await stores.approvals.add(asked(2, stores.approvals))
    won = await stores.approvals.resolve("approval-2", ALLOWED, by="approver:bob", at=2000.0)
    await stores.history.close()
    again = kit.open_stores()
    try:
        assert await again.approvals.get(["approval-1", "approval-2"]) == [one, won]
        assert two.state is PENDING
        # A new process asks under an id of its own: the old one's pending record is an orphan
        # (PostgreSQL: its writer closed, so its lease row is gone).
        assert [r.approval_id for r in await again.approvals.interrupt_orphans(at=6000.0)] == [
            "approval-1"
        ]
    finally:
        await again.history.close()


@pytest.fixture
def pg_kit(postgres: PostgresServer) -> Iterator[StoreKit]:
    """PostgreSQL's kit only: one SQLite file has one registry, so nobody answers beside it
    and no other registry holds a lease."""
    yield from _postgres_kit(postgres)


async def test_two_stores_on_one_database_answering_at_once_one_wins(pg_kit: StoreKit) -> None:
    kit = pg_kit
    a, b = kit.open_stores(), kit.open_stores()
    try:
        for n in range(1, 21):
            await a.approvals.add(asked(n, a.approvals))

        async def answer(stores: Stores, n: int, state: ApprovalState) -> ApprovalRecord | None:
            try:
                return await stores.approvals.resolve(f"approval-{n}", state, by="x", at=2000.0)
            except ApprovalNotPending:
                return None

        for n in range(1, 21):
            results = await asyncio.gather(answer(a, n, ALLOWED), answer(b, n, REJECTED))
            winners = [r for r in results if r is not None]
            assert len(winners) == 1
            assert (await b.approvals.get([f"approval-{n}"]))[0].state is winners[0].state
        # B's writer is alive: A's records are not its orphans, nor B's A's.
        await a.approvals.add(asked(21, a.approvals))
        assert await b.approvals.interrupt_orphans(at=3000.0) == []
    finally:
        await a.history.close()
        await b.history.close()


async def test_an_expired_lease_makes_the_asker_an_orphan(pg_kit: StoreKit) -> None:
    kit = pg_kit
    a, b = kit.open_stores(), kit.open_stores()
    try:
        await a.approvals.add(asked(1, a.approvals))
        assert await b.approvals.interrupt_orphans(at=3000.0) == []
        with psycopg.connect(kit.dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE history_writers SET expires_at = now() - interval '1 second' WHERE id = %s",
                (a.approvals.asker_id,),
            )
        [gone] = await b.approvals.interrupt_orphans(at=3000.0)
        assert (gone.approval_id, gone.state) == ("approval-1", ApprovalState.INTERRUPTED)
        with pytest.raises(ApprovalNotPending):
            await a.approvals.resolve("approval-1", ALLOWED, by="late", at=3001.0)
    finally:
        await a.history.close()
        await b.history.close()


async def test_a_write_on_a_broken_backend_stores_nothing_and_the_store_recovers(
    kit: StoreKit,
) -> None:
    stores = kit.open_stores()
    try:
        await stores.approvals.add(asked(1, stores.approvals))
        kit.break_backend()
        big = asked(2, stores.approvals, arguments_json="x" * (64 * 1024 * 1024))
        with pytest.raises(CodemodeError) as failed:
            await asyncio.wait_for(stores.approvals.add(big), 60)
        assert (failed.value.status, failed.value.reason) == (
            Status.UNAVAILABLE,
            HISTORY_UNAVAILABLE,
        )
        kit.repair_backend()
        [only] = await stores.approvals.pending(limit=10)
        assert only.approval_id == "approval-1"
        await stores.approvals.resolve("approval-1", ALLOWED, by="approver:bob", at=2000.0)
        assert await stores.approvals.pending(limit=10) == []
    finally:
        await stores.history.close()


async def test_other_registries_hear_that_approvals_changed_and_the_writer_does_not(
    kit: StoreKit,
) -> None:
    writer = kit.open_stores()
    reader = kit.open_stores() if kit.name == "postgres" else writer
    heard: list[None] = []
    told: list[None] = []
    reader.approvals.follow(lambda: heard.append(None))
    try:
        if reader is writer:  # SQLite: one registry per file, never told anything
            await writer.approvals.add(asked(1, writer.approvals))
            await asyncio.sleep(0)
            assert heard == []
            return
        writer.approvals.follow(lambda: told.append(None))
        for _ in range(1500):  # both LISTENs hold once each was told "anything" once
            if heard and told:
                break
            await asyncio.sleep(0.02)
        assert (heard, told) == ([None], [None])
        await writer.approvals.add(asked(1, writer.approvals))
        await writer.approvals.resolve("approval-1", ALLOWED, by="approver:bob", at=2000.0)
        with pytest.raises(ApprovalNotPending):  # refused: nothing changed, nothing told
            await writer.approvals.resolve("approval-1", REJECTED, by="approver:bob", at=2000.0)
        for _ in range(1500):
            if len(heard) >= 3:
                break
            await asyncio.sleep(0.02)
        assert len(heard) == 3
        await writer.approvals.add(asked(2, writer.approvals))  # a latch: told after the above
        for _ in range(1500):
            if len(heard) >= 4:
                break
            await asyncio.sleep(0.02)
        assert len(heard) == 4 and told == [None]
    finally:
        if reader is not writer:
            await reader.history.close()
        await writer.history.close()


async def test_retention_deletes_ended_records_and_never_a_pending_one(
    store: ApprovalStore,
) -> None:
    for n in (1, 2, 3, 4):
        await store.add(asked(n, store))
    await store.resolve("approval-1", ALLOWED, by="approver:bob", at=100.0)
    await store.resolve("approval-2", ApprovalState.CANCELLED, by="registry", at=200.0)
    await store.resolve("approval-3", REJECTED, by="approver:bob", at=300.0)
    assert await store.prune(250.0, limit=1) == 1  # in batches, oldest first
    assert [r.approval_id for r in await store.get(["approval-1", "approval-2"])] == ["approval-2"]
    assert await store.prune(250.0) == 1
    assert await store.prune(10_000.0) == 1  # approval-3; approval-4 is pending
    assert [r.approval_id for r in await store.pending(limit=10)] == ["approval-4"]
    assert await store.get(["approval-1", "approval-2", "approval-3"]) == []
