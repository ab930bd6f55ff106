"""The Cordis host lease contract (registry_service/domain/cordis/host_leases.py), run against
process memory and every store kit (conftest.py): one owner per plugin; a live lease of another
owner is not taken; an expired one is, with a higher epoch; renew and release name the lease
they hold, so a stale owner (taken over) neither renews nor releases; leases are read back
after a reopen, with the principal that activated the run (a survivor's takeover keeps it, a
later activation by the owner replaces it); PostgreSQL tells the other registries which
plugin's lease changed. Expiry is made by the store's own clock (a lease of no length, or
`expire`), never waited for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from codemode_common.principals import ANONYMOUS, Principal
from registry_service.domain.cordis.host_leases import HostLease, HostLeases, MemoryHostLeases
from registry_service.history.stores import Stores
from tests.registry.history.conftest import STORES, StoreKit, _postgres_kit, _sqlite_kit

TTL = 3600.0  # a lease that does not expire during a test


@dataclass
class Leases:
    """Two registries' views of one store (the same object where one process owns it)."""

    a: HostLeases
    b: HostLeases
    shared: bool
    reopen: Callable[[], HostLeases] | None = None


@pytest.fixture(params=["memory", *STORES])
async def leases(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Leases]:
    if request.param == "memory":
        memory = MemoryHostLeases()
        yield Leases(memory, memory, shared=False)
        return
    kits = (
        _sqlite_kit(tmp_path)
        if request.param == "sqlite"
        else _postgres_kit(request.getfixturevalue("postgres"))
    )
    kit = next(iter(kits))
    try:
        async for view in _views(kit):
            yield view
    finally:
        cast("Generator[StoreKit]", kits).close()


async def _views(kit: StoreKit) -> AsyncIterator[Leases]:
    opened: list[Stores] = [kit.open_stores()]
    shared = kit.name == "postgres"
    if shared:
        opened.append(kit.open_stores())

    def reopen() -> HostLeases:
        again = kit.open_stores()
        opened.append(again)
        return again.host_leases

    try:
        b = opened[1].host_leases if shared else opened[0].host_leases
        yield Leases(opened[0].host_leases, b, shared, reopen)
    finally:
        for stores in opened:
            await stores.history.close()


def _held(lease: HostLease | None) -> HostLease:
    assert lease is not None
    return lease


async def test_a_free_lease_is_taken_and_a_live_one_of_another_owner_is_not(
    leases: Leases,
) -> None:
    first = _held(await leases.a.acquire("clock-1", "ra", "10.0.0.1:50051", TTL))
    assert (first.owner, first.address, first.epoch, first.expired) == (
        "ra",
        "10.0.0.1:50051",
        1,
        False,
    )
    assert await leases.b.acquire("clock-1", "rb", "10.0.0.2:50051", TTL) is None
    [stored] = await leases.b.load()
    assert (stored.owner, stored.epoch, stored.expired) == ("ra", 1, False)
    # Taken again by its owner: the same epoch (not a change of hands).
    again = _held(await leases.a.acquire("clock-1", "ra", "10.0.0.1:50051", TTL))
    assert again.epoch == 1
    # Another plugin is another lease.
    other = _held(await leases.b.acquire("panel-2", "rb", "10.0.0.2:50051", TTL))
    assert other.epoch == 1
    assert [lease.plugin_id for lease in await leases.a.load()] == ["clock-1", "panel-2"]
    assert [lease.owner for lease in await leases.a.load({"panel-2"})] == ["rb"]


async def test_an_expired_lease_is_taken_over_and_the_stale_owner_is_fenced(
    leases: Leases,
) -> None:
    old = _held(await leases.a.acquire("clock-1", "ra", "a:1", 0.0))  # expires at once
    [stored] = await leases.b.load()
    assert stored.expired
    taken = _held(await leases.b.acquire("clock-1", "rb", "b:1", TTL))
    assert (taken.owner, taken.address, taken.epoch) == ("rb", "b:1", 2)
    # The former owner neither renews nor releases what is no longer its lease.
    assert await leases.a.renew(old, TTL) is None
    await leases.a.release(old)
    [stored] = await leases.a.load()
    assert (stored.owner, stored.epoch, stored.expired) == ("rb", 2, False)
    # Nor can it take it back while it lives.
    assert await leases.a.acquire("clock-1", "ra", "a:1", TTL) is None


async def test_renew_extends_release_removes_and_expire_hands_over(leases: Leases) -> None:
    short = _held(await leases.a.acquire("clock-1", "ra", "a:1", 0.0))
    renewed = _held(await leases.a.renew(short, TTL))
    assert (renewed.epoch, renewed.expired) == (1, False)
    assert await leases.b.acquire("clock-1", "rb", "b:1", TTL) is None  # renewed: still held
    await leases.a.release(renewed)
    assert await leases.a.load() == []
    # Released: the next owner starts a new epoch.
    fresh = _held(await leases.b.acquire("clock-1", "rb", "b:1", TTL))
    assert fresh.epoch == 1
    _held(await leases.b.acquire("panel-2", "rb", "b:1", TTL))
    _held(await leases.a.acquire("note-3", "ra", "a:1", TTL))
    await leases.b.expire("rb")  # a registry shutting down hands its plugins over at once
    expired = {lease.plugin_id: lease.expired for lease in await leases.a.load()}
    assert expired == {"clock-1": True, "note-3": False, "panel-2": True}
    taken = _held(await leases.a.acquire("clock-1", "ra", "a:1", TTL))
    assert taken.epoch == 2


async def test_only_one_of_two_registries_racing_for_a_lease_gets_it(leases: Leases) -> None:
    won = await asyncio.gather(
        *(
            (leases.a if i % 2 else leases.b).acquire("clock-1", f"r{i}", f"h{i}:1", TTL)
            for i in range(6)
        )
    )
    assert len([lease for lease in won if lease is not None]) == 1


# Process memory does not outlive its process: only the stores are reopened.
@pytest.mark.parametrize("leases", STORES, indirect=True)
async def test_leases_are_read_back_after_a_reopen(leases: Leases) -> None:
    assert leases.reopen is not None
    _held(await leases.a.acquire("clock-1", "ra", "a:1", TTL))
    [stored] = await leases.reopen().load()
    assert (stored.plugin_id, stored.owner, stored.address, stored.epoch) == (
        "clock-1",
        "ra",
        "a:1",
        1,
    )


ALICE, BOB = Principal("token", "alice"), Principal("jwt", "bob@example.com")


async def test_a_lease_keeps_the_principal_that_activated_its_run(leases: Leases) -> None:
    held = _held(await leases.a.acquire("clock-1", "ra", "a:1", 0.0, principal=ALICE))
    assert held.principal == ALICE
    [stored] = await leases.b.load()
    assert (stored.principal, stored.expired) == (ALICE, True)
    # A survivor takes the expired lease over as the activator it read; renewals keep it.
    taken = _held(await leases.b.acquire("clock-1", "rb", "b:1", TTL, principal=stored.principal))
    assert (taken.epoch, taken.principal) == (2, ALICE)
    renewed = _held(await leases.b.renew(taken, TTL))
    assert renewed.principal == ALICE
    # A refused acquire (a live lease of another) changes nothing, principal included.
    assert await leases.a.acquire("clock-1", "ra", "a:1", TTL, principal=BOB) is None
    [stored] = await leases.a.load()
    assert (stored.owner, stored.epoch, stored.principal) == ("rb", 2, ALICE)
    # The owner's next activation, by another principal, names that one (same epoch).
    again = _held(await leases.b.acquire("clock-1", "rb", "b:1", TTL, principal=BOB))
    assert (again.epoch, again.principal) == (2, BOB)
    [stored] = await leases.a.load({"clock-1"})
    assert stored.principal == BOB
    # No principal given: anonymous.
    _held(await leases.a.acquire("panel-2", "ra", "a:1", TTL))
    assert [lease.principal for lease in await leases.b.load({"panel-2"})] == [ANONYMOUS]
    if leases.reopen is not None:
        assert [lease.principal for lease in await leases.reopen().load()] == [BOB, ANONYMOUS]


# Only PostgreSQL is shared by several registries.
@pytest.mark.parametrize("kit", ["postgres"], indirect=True)
async def test_other_registries_hear_which_plugins_lease_changed(kit: StoreKit) -> None:
    assert kit.name == "postgres"
    writer, reader = kit.open_stores(), kit.open_stores()
    heard: list[Collection[str] | None] = []
    ready = asyncio.Event()

    def changed(names: Collection[str] | None) -> None:
        heard.append(names)
        ready.set()

    try:
        reader.cordis.follow(changed)
        # The LISTEN connection's first reload (None) says it holds.
        await asyncio.wait_for(ready.wait(), 60)
        heard.clear()
        ready.clear()
        lease = _held(await writer.host_leases.acquire("clock-1", "ra", "a:1", TTL))
        await asyncio.wait_for(ready.wait(), 60)
        assert [sorted(names or []) for names in heard] == [["clock-1"]]
        ready.clear()
        await writer.host_leases.release(lease)
        await asyncio.wait_for(ready.wait(), 60)
        assert [sorted(names or []) for names in heard] == [["clock-1"], ["clock-1"]]
    finally:
        await writer.history.close()
        await reader.history.close()
