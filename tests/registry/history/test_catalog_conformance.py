"""The catalog store contract (registry_service/history/catalog_store.py), run against every
store kit (conftest.py) like the history suite: what is applied is loaded back after a reopen,
row by row; a change is all or nothing (a real full disk, a stopped server); a change that
finds the stored catalog otherwise than it expects (another registry changed it) is a
conflict and stores nothing; some scopes are read back alone; deleting an agent's history
deletes only its own; damaged data is reported corrupt."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from codemode_wire.errors import CodemodeError, Status
from registry_service.domain.records import DISPATCH, TOOL_CALL, TOOL_RESULT, Record
from registry_service.domain.scopes import Mode
from registry_service.history.catalog_store import (
    CatalogChange,
    CatalogConflict,
    CatalogSnapshot,
    DeleteHistory,
    DeleteRestriction,
    DeleteScope,
    PutRestriction,
    PutScope,
    RestrictionRow,
    ScopeRow,
)
from registry_service.history.store import HISTORY_CORRUPT, HISTORY_UNAVAILABLE
from registry_service.history.stores import Stores
from tests.registry.history.conftest import StoreKit

NOW = 1_700_000_000.5
PRESET = ScopeRow("presets/team", NOW, Mode.BOTH, "python", True)
AGENT = ScopeRow("agents/coder", NOW + 1, Mode.CODE, "typescript", False, "presets/team", "a" * 32)
BARE = ScopeRow("agents/bare", NOW + 2, agent_id="b" * 32)  # nothing declared
RESTRICTION = RestrictionRow("agents/coder", "r2", ("read",), None)
EMPTY_ALLOW = RestrictionRow("presets/team", "r10", (), ("write", "delete"))


def made(row: ScopeRow) -> PutScope:
    """The change that creates `row`'s scope."""
    return PutScope(row, create=True)


async def reopened(kit: StoreKit, stores: Stores) -> tuple[Stores, CatalogSnapshot]:
    await stores.history.close()
    again = kit.open_stores()
    return again, await again.catalog.load()


async def test_a_fresh_store_holds_no_catalog(kit: StoreKit) -> None:
    stores = kit.open_stores()
    snapshot = await stores.catalog.load()
    assert (list(snapshot.scopes), list(snapshot.restrictions)) == ([], [])
    assert dict(snapshot.legacy_agents) == {}
    await stores.history.close()


async def test_applied_rows_are_loaded_back_after_a_reopen(kit: StoreKit) -> None:
    stores = kit.open_stores()
    # Agents before presets in the changes: the load still lists presets first.
    await stores.catalog.apply([made(BARE), made(PRESET)])
    await stores.catalog.apply([made(AGENT), PutRestriction(RESTRICTION)])
    await stores.catalog.apply([PutRestriction(EMPTY_ALLOW)])
    stores, snapshot = await reopened(kit, stores)
    assert list(snapshot.scopes) == [PRESET, BARE, AGENT]
    # An empty allow list kept apart from no allow list.
    assert sorted(snapshot.restrictions, key=lambda r: r.restriction_id) == [
        EMPTY_ALLOW,
        RESTRICTION,
    ]
    await stores.history.close()


async def test_a_put_replaces_the_row_and_keeps_its_restrictions(kit: StoreKit) -> None:
    stores = kit.open_stores()
    await stores.catalog.apply([made(PRESET), made(AGENT), PutRestriction(RESTRICTION)])
    unparented = ScopeRow(AGENT.name, AGENT.create_time, Mode.NATIVE, agent_id=AGENT.agent_id)
    await stores.catalog.apply([PutScope(unparented)])
    stores, snapshot = await reopened(kit, stores)
    assert list(snapshot.scopes) == [PRESET, unparented]
    assert list(snapshot.restrictions) == [RESTRICTION]
    await stores.history.close()


async def test_deletes_remove_a_scope_with_its_restrictions_or_one_restriction(
    kit: StoreKit,
) -> None:
    stores = kit.open_stores()
    other = RestrictionRow("agents/bare", "r3", None, ("write",))
    await stores.catalog.apply(
        [made(PRESET), made(AGENT), made(BARE)]
        + [PutRestriction(r) for r in (RESTRICTION, other, EMPTY_ALLOW)]
    )
    await stores.catalog.apply([DeleteScope(AGENT.name, AGENT.agent_id)])
    await stores.catalog.apply([DeleteRestriction("presets/team", "r10")])
    stores, snapshot = await reopened(kit, stores)
    assert list(snapshot.scopes) == [PRESET, BARE]
    assert list(snapshot.restrictions) == [other]
    await stores.history.close()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(made(AGENT), id="create-a-stored-name"),
        pytest.param(
            PutScope(ScopeRow(AGENT.name, NOW, agent_id="f" * 32)), id="update-another-id"
        ),
        pytest.param(PutScope(BARE), id="update-a-missing-scope"),
        pytest.param(DeleteScope(AGENT.name, "f" * 32), id="delete-another-id"),
        pytest.param(DeleteScope(BARE.name, BARE.agent_id), id="delete-a-missing-scope"),
        pytest.param(
            PutRestriction(RestrictionRow(BARE.name, "r9", None, ("x",))), id="restrict-missing"
        ),
        pytest.param(DeleteRestriction(AGENT.name, "r404"), id="remove-a-missing-restriction"),
    ],
)
async def test_a_change_that_finds_otherwise_is_a_conflict_and_stores_nothing(
    kit: StoreKit, change: CatalogChange
) -> None:
    """What another registry sharing the store changed first: the change says which scope."""
    stores = kit.open_stores()
    await stores.catalog.apply([made(PRESET), made(AGENT)])
    with pytest.raises(CatalogConflict) as conflict:
        # A first change that would succeed: nothing of the whole is stored.
        await stores.catalog.apply([PutRestriction(EMPTY_ALLOW), change])
    assert conflict.value.scope in (AGENT.name, BARE.name)
    snapshot = await stores.catalog.load()
    assert (list(snapshot.scopes), list(snapshot.restrictions)) == ([PRESET, AGENT], [])
    await stores.catalog.apply([PutRestriction(EMPTY_ALLOW)])  # the store goes on
    await stores.history.close()


async def test_some_scopes_are_read_back_alone(kit: StoreKit) -> None:
    stores = kit.open_stores()
    await stores.catalog.apply([made(PRESET), made(AGENT), made(BARE), PutRestriction(RESTRICTION)])
    await stores.catalog.apply([PutRestriction(EMPTY_ALLOW)])
    some = await stores.catalog.load_scopes([AGENT.name, "agents/never"])
    assert (list(some.scopes), list(some.restrictions)) == ([AGENT], [RESTRICTION])
    everything = await stores.catalog.load_scopes(None)
    assert list(everything.scopes) == [PRESET, BARE, AGENT]
    assert len(everything.restrictions) == 2
    await stores.history.close()


def _record(agent: str, agent_id: str, call_id: str, kind: str, content: str = "") -> Record:
    return Record(
        kind=kind,
        agent=agent,
        agent_id=agent_id,
        call_id=call_id,
        root_call_id=call_id.partition(":")[0],
        parent_call_id=call_id.partition(":")[0] if ":" in call_id else "",
        name="t",
        content_json=content,
        time=time.time(),
    )


async def test_delete_history_deletes_one_agent_ids_records_and_spills(kit: StoreKit) -> None:
    stores = kit.open_stores()
    history = stores.history
    big = json.dumps([{"type": "text", "text": "x" * 100_000}])
    old = "1" * 32
    mine = [
        await history.append(_record("agents/coder", old, "c1", TOOL_CALL)),
        await history.append(_record("agents/coder", old, "c1:code:1", DISPATCH, big)),
    ]
    # The same name under its next id, and another agent: both untouched.
    kept = [
        await history.append(_record("agents/coder", "2" * 32, "c1", TOOL_CALL)),
        await history.append(_record("agents/other", "3" * 32, "c1", TOOL_RESULT, big)),
    ]
    assert mine[1].spilled and kept[1].spilled
    await stores.catalog.apply([made(ScopeRow("agents/coder", NOW, agent_id=old))])
    await stores.catalog.apply([DeleteScope("agents/coder", old), DeleteHistory(old)])
    assert await history.list(old, after_seq=0, limit=100) == []
    assert await history.read_spill(mine[1].spilled) is None
    assert list(await history.list("2" * 32, after_seq=0, limit=100)) == [kept[0]]
    assert list(await history.list("3" * 32, after_seq=0, limit=100)) == [kept[1]]
    assert await history.read_spill(kept[1].spilled) == big
    # Nothing of it is left open either: a restart closes no call of the deleted id.
    closed = await history.close_interrupted()
    assert {r.agent_id for r in closed} == {"2" * 32}
    await history.close()


async def test_a_change_on_a_broken_backend_fails_whole_and_the_store_recovers(
    kit: StoreKit,
) -> None:
    stores = kit.open_stores()
    await stores.catalog.apply([made(PRESET)])
    kit.break_backend()
    big = [made(ScopeRow(f"agents/a{n}", NOW, agent_id=f"{n:032x}")) for n in range(2000)]
    with pytest.raises(CodemodeError) as failed:
        await asyncio.wait_for(stores.catalog.apply([*big, DeleteScope(PRESET.name)]), 30)
    assert (failed.value.status, failed.value.reason) == (Status.UNAVAILABLE, HISTORY_UNAVAILABLE)
    kit.repair_backend()
    assert list((await stores.catalog.load()).scopes) == [PRESET]  # nothing of it, not half
    await stores.catalog.apply([made(AGENT)])
    stores, snapshot = await reopened(kit, stores)
    assert list(snapshot.scopes) == [PRESET, AGENT]
    await stores.history.close()


async def test_damaged_data_is_reported_corrupt_by_the_catalog(kit: StoreKit) -> None:
    stores = kit.open_stores()
    await stores.catalog.apply([made(PRESET), made(AGENT)])
    for n in range(200):  # several pages of history, so the damage reaches the tables
        await stores.history.append(_record("agents/coder", AGENT.agent_id, f"c{n}", TOOL_CALL))
    await stores.history.close()
    kit.corrupt()

    stores = kit.open_stores()
    for operation in (stores.catalog.load(), stores.catalog.apply([made(BARE)])):
        with pytest.raises(CodemodeError) as failed:
            await asyncio.wait_for(operation, 30)
        assert (failed.value.status, failed.value.reason) == (Status.DATA_LOSS, HISTORY_CORRUPT)
    await stores.history.close()
