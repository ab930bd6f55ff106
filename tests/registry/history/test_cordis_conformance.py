"""The Cordis store contract (registry_service/domain/cordis/state.py), run against every store
kit (conftest.py) like the history and catalog suites: records written are loaded back after a
reopen; counters never hand out a number twice, also when two stores on one database draw at
once; a package is immutable; a pointer write naming a stale revision, or a plugin another
registry removed, is refused and stores nothing; a write on a broken backend stores nothing
and the store recovers; PostgreSQL tells other registries (never the writer) what changed."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Collection

import psycopg
import pytest

from codemode_wire.errors import CodemodeError, Status
from registry_service.domain.cordis.model import Package
from registry_service.domain.cordis.state import (
    ID_KINDS,
    CordisSnapshot,
    PackageImmutable,
    PackageRow,
    PluginRow,
    StaleWrite,
)
from registry_service.history.store import HISTORY_UNAVAILABLE
from registry_service.history.stores import Stores
from tests.registry.history.conftest import StoreKit

CLOCK = PluginRow("clock-1", "agents/coder", "a" * 32)
PANEL = PluginRow("panel-2", "agents/coder", "a" * 32)
PKG1 = Package("pkg-1", "Clock", "Tell the time.", "return apply", None)
PKG2 = Package("pkg-2", "Clock", "Tell the time better.", "return apply2", "client()")
PKG3 = Package("pkg-3", "Panel", "A panel.", None, "render()")
PKG4 = Package("pkg-4", "Clock", "Again.", "return apply4", None)


async def reopened(kit: StoreKit, stores: Stores) -> tuple[Stores, CordisSnapshot]:
    await stores.history.close()
    again = kit.open_stores()
    return again, await again.cordis.load()


async def _filled(stores: Stores) -> None:
    cordis = stores.cordis
    await cordis.create_plugin(CLOCK, PKG1)
    await cordis.create_plugin(PANEL, PKG3)
    await cordis.add_package("clock-1", PKG2)
    await cordis.add_package("clock-1", PKG4)
    assert await cordis.set_pointers("clock-1", "pkg-1", "pkg-2", revision=1) == 2
    await cordis.grant("clock-1", "pkg-2", any_version=False)
    await cordis.grant("panel-2", "pkg-3", any_version=True)


async def test_a_fresh_store_holds_no_plugins_and_counts_from_one(kit: StoreKit) -> None:
    stores = kit.open_stores()
    assert await stores.cordis.load() == CordisSnapshot([], [], [])
    assert [await stores.cordis.next_id(kind) for kind in ID_KINDS] == [1] * len(ID_KINDS)
    assert await stores.cordis.next_id("plugins") == 2  # each kind its own counter
    assert await stores.cordis.take_legacy() is None
    await stores.history.close()


async def test_records_are_loaded_back_after_a_reopen(kit: StoreKit) -> None:
    stores = kit.open_stores()
    await _filled(stores)
    for _ in range(3):
        await stores.cordis.next_id("packages")
    stores, snapshot = await reopened(kit, stores)
    assert list(snapshot.plugins) == [
        PluginRow("clock-1", "agents/coder", "a" * 32, "pkg-1", "pkg-2", False, 2),
        PluginRow("panel-2", "agents/coder", "a" * 32, None, None, True, 1),
    ]
    # Packages in define order (the order they were written), each with its plugin.
    assert list(snapshot.packages) == [
        PackageRow("clock-1", PKG1),
        PackageRow("panel-2", PKG3),
        PackageRow("clock-1", PKG2),
        PackageRow("clock-1", PKG4),
    ]
    assert list(snapshot.grants) == [("clock-1", "pkg-2"), ("panel-2", "pkg-3")]
    assert await stores.cordis.next_id("packages") == 4  # the counter went on where it was
    alone = await stores.cordis.load(["panel-2"])
    assert [p.plugin_id for p in alone.plugins] == ["panel-2"]
    assert list(alone.packages) == [PackageRow("panel-2", PKG3)]
    assert list(alone.grants) == [("panel-2", "pkg-3")]
    await stores.history.close()


async def test_a_package_is_written_once(kit: StoreKit) -> None:
    stores = kit.open_stores()
    await _filled(stores)
    before = await stores.cordis.load()
    await stores.cordis.add_package("clock-1", PKG2)  # the same again: a repeated write
    changed = Package("pkg-2", "Clock", "Tell the time better.", "return evil", "client()")
    with pytest.raises(PackageImmutable, match="pkg-2"):
        await stores.cordis.add_package("clock-1", changed)
    with pytest.raises(PackageImmutable):  # nor moved to another plugin
        await stores.cordis.add_package("panel-2", PKG2)
    with pytest.raises(StaleWrite):  # a plugin id taken
        await stores.cordis.create_plugin(CLOCK, Package("pkg-9", "X", "Y", "z", None))
    assert await stores.cordis.load() == before
    await stores.history.close()


async def test_a_stale_or_orphaned_write_is_refused_and_stores_nothing(kit: StoreKit) -> None:
    stores = kit.open_stores()
    await _filled(stores)
    before = await stores.cordis.load()
    with pytest.raises(StaleWrite) as stale:  # read at revision 1; the store is at 2
        await stores.cordis.set_pointers("clock-1", "pkg-4", None, revision=1)
    assert stale.value.plugin_id == "clock-1"
    assert await stores.cordis.load() == before
    await stores.cordis.delete_plugin("clock-1")
    for orphaned in (
        stores.cordis.set_pointers("clock-1", "pkg-1", None, revision=2),
        stores.cordis.add_package("clock-1", Package("pkg-5", "C", "D", "e", None)),
        stores.cordis.grant("clock-1", "pkg-1", any_version=True),
    ):
        with pytest.raises(StaleWrite):
            await orphaned
    snapshot = await stores.cordis.load()
    assert [p.plugin_id for p in snapshot.plugins] == ["panel-2"]  # the other plugin stays
    assert list(snapshot.packages) == [PackageRow("panel-2", PKG3)]
    assert list(snapshot.grants) == [("panel-2", "pkg-3")]
    await stores.cordis.delete_plugin("clock-1")  # gone already: nothing
    await stores.history.close()


async def test_counters_never_hand_out_a_number_twice_when_drawn_at_once(kit: StoreKit) -> None:
    # Two registries on one PostgreSQL; SQLite has one registry per file, drawing at once.
    first = kit.open_stores()
    second = kit.open_stores() if kit.name == "postgres" else first
    drawn = await asyncio.gather(
        *(stores.cordis.next_id("plugins") for stores in (first, second) for _ in range(40))
    )
    assert sorted(drawn) == list(range(1, 81))
    await first.history.close()
    if second is not first:
        await second.history.close()


async def test_counters_are_raised_never_lowered(kit: StoreKit) -> None:
    stores = kit.open_stores()
    await stores.cordis.next_id("runs")
    await stores.cordis.raise_ids({"runs": 7, "plugins": 3})
    await stores.cordis.raise_ids({"runs": 2})
    assert await stores.cordis.next_id("runs") == 8
    assert await stores.cordis.next_id("plugins") == 4
    await stores.history.close()


def _put_legacy(kit: StoreKit, body: str) -> None:
    if kit.name == "postgres":
        with psycopg.connect(kit.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO cordis_state (id, body) VALUES (1, %s)", (body,))
    else:
        with contextlib.closing(sqlite3.connect(kit.where / "history.sqlite3")) as db:
            db.execute("INSERT INTO cordis_state (id, body) VALUES (1, ?)", (body,))
            db.commit()


async def test_an_older_registrys_snapshot_is_taken_once(kit: StoreKit) -> None:
    stores = kit.open_stores()  # migrated: the snapshot's table is there
    _put_legacy(kit, '{"version": 1}')
    assert await stores.cordis.take_legacy() == '{"version": 1}'
    assert await stores.cordis.take_legacy() is None
    await stores.history.close()


async def test_a_write_on_a_broken_backend_stores_nothing_and_the_store_recovers(
    kit: StoreKit,
) -> None:
    stores = kit.open_stores()
    await stores.cordis.create_plugin(CLOCK, PKG1)
    kit.break_backend()
    big = Package("pkg-2", "Big", "Fills the disk.", "x" * (64 * 1024 * 1024), None)
    with pytest.raises(CodemodeError) as failed:
        await asyncio.wait_for(stores.cordis.add_package("clock-1", big), 60)
    assert (failed.value.status, failed.value.reason) == (Status.UNAVAILABLE, HISTORY_UNAVAILABLE)
    kit.repair_backend()
    snapshot = await stores.cordis.load()
    assert list(snapshot.packages) == [PackageRow("clock-1", PKG1)]  # nothing of it
    await stores.cordis.add_package("clock-1", PKG2)
    stores, snapshot = await reopened(kit, stores)
    assert [row.package for row in snapshot.packages] == [PKG1, PKG2]
    await stores.history.close()


async def test_other_registries_hear_what_changed_and_the_writer_does_not(kit: StoreKit) -> None:
    writer = kit.open_stores()
    reader = kit.open_stores() if kit.name == "postgres" else writer
    heard: list[Collection[str] | None] = []
    told: list[Collection[str] | None] = []
    reader.cordis.follow(heard.append)
    if reader is not writer:
        writer.cordis.follow(told.append)
        for _ in range(1500):  # both LISTENs hold once each was told "anything" once
            if heard and told:
                break
            await asyncio.sleep(0.02)
        assert heard == [None] and told == [None]
    await _filled(writer)
    if reader is writer:  # SQLite: one registry per file, never told anything
        await asyncio.sleep(0)
        assert heard == []
    else:
        for _ in range(1500):
            if len(heard) >= 8:
                break
            await asyncio.sleep(0.02)
        assert heard[1:] == [frozenset({p}) for p in ("clock-1", "panel-2", *["clock-1"] * 3)] + [
            frozenset({"clock-1"}),
            frozenset({"panel-2"}),
        ]
        assert told == [None]  # its own writes are not told back
        await reader.history.close()
    await writer.history.close()
