"""Durable Cordis state: with a store that outlives the process (a SQLite file, PostgreSQL)
plugins, packages, grants, pointers and id counters survive a registry restart in its history
database, with `cordis_durable` unset or true; runs are not restarted and `cordis_run`
reactivates. `cordis_durable: false` keeps them in memory: a restart forgets everything. A
whole-state snapshot an older registry saved is imported once as records."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.config import AgentSetting, ConfigError, RegistrySettings
from registry_service.registry import build_registry
from tests.registry.cordis.conftest import CLOCK
from tests.registry.cordis.hosts import InProcessHosts

BROKEN = "async def apply(ctx):\n    raise RuntimeError('clock face missing')\n\nreturn apply\n"
AGENT = "agents/coder"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The history store settings of one registry database, kept across its restarts."""
    if request.param == "sqlite":
        return {"history_path": str(tmp_path / "history.sqlite3")}
    dsn = request.getfixturevalue("pg_database")
    return {"history_store": "postgres", "history_dsn": dsn}


def _settings(store: dict[str, Any], durable: bool | None) -> dict[str, Any]:
    durable_setting = {} if durable is None else {"cordis_durable": durable}
    return {
        **store,
        **durable_setting,
        "agents": [AgentSetting(id="coder", self_modification=True)],
    }


async def _before_restart(make_cordis: Any, settings: dict[str, Any]) -> None:
    async with make_cordis(**settings) as h:
        await h.define(AGENT)  # clock-1/pkg-1
        assert not (await h.run(AGENT, "clock-1", "pkg-1")).is_error  # run-1
        await h.define(AGENT, BROKEN, existing="clock-1", name="Broken")  # pkg-2
        assert (await h.run(AGENT, "clock-1", "pkg-2", "update")).is_error  # run-2 fails
        await h.define(AGENT, prefix="gone")  # gone-2/pkg-3
        await h.ok(AGENT, "cordis_undefine", {"pluginId": "gone-2"})


@pytest.mark.parametrize("durable", [None, True], ids=["unset", "true"])
async def test_plugins_packages_and_pointers_survive_a_restart_runs_do_not(
    make_cordis: Any, store: dict[str, Any], durable: bool | None
) -> None:
    settings = _settings(store, durable=durable)
    await _before_restart(make_cordis, settings)
    async with make_cordis(**settings) as h:
        assert isinstance(h.hosts, InProcessHosts)
        assert h.hosts.log == []  # nothing was reactivated by the start
        assert "clock_now" not in await h.visible(AGENT)
        plugins = await h.ok(AGENT, "cordis_inspect_self", {})
        assert [p["pluginId"] for p in plugins["plugins"]] == ["clock-1"]  # gone-2 stays gone
        plugin = await h.ok(AGENT, "cordis_inspect_self", {"pluginId": "clock-1"})
        assert plugin["state"] == "stopped"
        assert (plugin["currentPackageId"], plugin["nextPackageId"]) == ("pkg-1", "pkg-2")
        assert [p["packageId"] for p in plugin["packages"]] == ["pkg-1", "pkg-2"]
        view = await h.ok(
            AGENT, "cordis_inspect_self", {"pluginId": "clock-1", "packageId": "pkg-2"}
        )
        assert view["code"] == {"host": BROKEN} and view["name"] == "Broken"
        [reference] = h.registry.cordis.references(AGENT, "look at @clock-1 please")
        assert reference.available
        # cordis_run reactivates; the counters went on where they were (no id is reused).
        run = await h.ok(
            AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}
        )
        assert run["status"] == "running" and run["pluginRunId"] == "run-3"
        assert "nextPackageId" not in run
        assert "clock_now" in await h.visible(AGENT)
        fresh = await h.define(AGENT, CLOCK.replace("clock_now", "clock_later"), prefix="later")
        assert (fresh["pluginId"], fresh["packageId"]) == ("later-3", "pkg-4")
    async with make_cordis(**settings) as h:  # the reactivation's pointers were saved too
        plugin = await h.ok(AGENT, "cordis_inspect_self", {"pluginId": "clock-1"})
        assert plugin["currentPackageId"] == "pkg-1" and "nextPackageId" not in plugin


async def test_with_the_setting_off_a_restart_forgets_every_plugin(
    make_cordis: Any, store: dict[str, Any]
) -> None:
    settings = _settings(store, durable=False)
    await _before_restart(make_cordis, settings)
    async with make_cordis(**settings) as h:
        assert (await h.ok(AGENT, "cordis_inspect_self", {}))["plugins"] == []
        [reference] = h.registry.cordis.references(AGENT, "look at @clock-1 please")
        assert not reference.available
        assert (await h.define(AGENT))["pluginId"] == "clock-1"  # a fresh process, fresh ids


def test_durability_needs_a_database_file() -> None:
    settings = RegistrySettings(history_path=":memory:", cordis_durable=True)
    with pytest.raises(ConfigError, match="set history_path to a file"):
        build_registry(settings)


async def test_plugins_belong_to_the_agent_id_not_to_a_later_agent_of_the_name(
    make_cordis: Any, store: dict[str, Any]
) -> None:
    durable = {**store, "cordis_durable": True}
    async with make_cordis(**durable) as h:
        await h.agent("owner")
        await h.agent("keeper")
        await h.define("agents/owner")  # clock-1
        await h.define("agents/keeper", prefix="kept")  # kept-2
    # Deleted and re-created while the Cordis state was not kept (the setting off): the saved
    # state still names agents/owner, but its owner is gone.
    async with make_cordis(**store) as h:
        await h.stub.DeleteAgent(rpb.DeleteAgentRequest(name="agents/owner"))
        await h.agent("owner")
    async with make_cordis(**durable) as h:
        assert (await h.ok("agents/owner", "cordis_inspect_self", {}))["plugins"] == []
        [reference] = h.registry.cordis.references("agents/owner", "look at @clock-1")
        assert not reference.available
        kept = await h.ok("agents/keeper", "cordis_inspect_self", {})
        assert [p["pluginId"] for p in kept["plugins"]] == ["kept-2"]


LEGACY = {
    "version": 1,
    "counters": {"plugins": 4, "packages": 6, "runs": 9, "approvals": 2, "inspects": 0},
    "plugins": [
        {
            "pluginId": "clock-4",
            "owner": AGENT,
            "ownerId": "",
            "packages": [
                {"packageId": "pkg-5", "name": "Clock", "purpose": "Old.", "host": CLOCK},
                {"packageId": "pkg-6", "name": "Clock", "purpose": "Newer.", "host": BROKEN},
            ],
            "current": "pkg-5",
            "next": "pkg-6",
            "approvedClientPackages": [],
            "clientVersionUpdatesApproved": False,
        }
    ],
}


def _put_snapshot(store: dict[str, Any], body: str) -> None:
    """What a registry of the version before records left: its one stored snapshot."""
    if "history_dsn" in store:
        with psycopg.connect(store["history_dsn"], autocommit=True) as conn:
            conn.execute("INSERT INTO cordis_state (id, body) VALUES (1, %s)", (body,))
        return
    with contextlib.closing(sqlite3.connect(store["history_path"])) as db:
        db.execute("INSERT INTO cordis_state (id, body) VALUES (1, ?)", (body,))
        db.commit()


async def test_an_older_registrys_snapshot_is_imported_once_as_records(
    make_cordis: Any, store: dict[str, Any]
) -> None:
    settings = _settings(store, durable=None)
    async with make_cordis(**settings):
        pass  # the database, migrated
    _put_snapshot(store, jsonvalue.dumps(LEGACY))
    for _ in range(2):  # imported by the first start; the second finds the records
        async with make_cordis(**settings) as h:
            plugin = await h.ok(AGENT, "cordis_inspect_self", {"pluginId": "clock-4"})
            assert (plugin["currentPackageId"], plugin["nextPackageId"]) == ("pkg-5", "pkg-6")
            assert [p["packageId"] for p in plugin["packages"]] == ["pkg-5", "pkg-6"]
    async with make_cordis(**settings) as h:  # the counters went on past the snapshot's
        fresh = await h.define(AGENT, prefix="later")
        assert (fresh["pluginId"], fresh["packageId"]) == ("later-5", "pkg-7")
