"""Two registries on one real PostgreSQL, over gRPC only: Cordis records (plugins, packages,
pointers, grants, ids) written through one replica are seen on the other through
LISTEN/NOTIFY; ids never collide when both define at once; a write of a replica that had not
heard of another's change is refused and changes nothing; a replica that missed notifications
reloads when its LISTEN connection comes back. Plugin hosts run on the replica that activates
(in-process hosts of the seam, one set per replica): these replicas share no peer secret, so
no host lease (test_host_owner.py has the replicas that do). Every wait is a latch polled with a
generous bound; nothing is timed."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import psycopg
import pytest

from codemode_client.page_runner import PageRunner
from codemode_wire import jsonvalue
from registry_service.domain.change_follow import ChangeFollower
from tests.registry.cordis.conftest import CLOCK, CordisHarness
from tests.registry.cordis.hosts import InProcessHosts

T = TypeVar("T")
AGENT = "agents/coder"
CLIENT = "return { apply(ctx) { ctx.log('hello') } }"
_POLLS = 1500  # x 20 ms
_PAGE_STEP_S = 45.0  # one page-runner step's bound: a stall fails naming the step (no timing)


async def seen(probe: Callable[[], Awaitable[T]], until: Callable[[T], bool], what: str) -> T:
    """Polls `probe` until `until` holds for its value (a latch)."""
    value: T | None = None
    for _ in range(_POLLS):
        value = await probe()
        if until(value):
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what}: not seen on the other replica; last: {value!r}")


def inspected(holds: Callable[[dict[str, Any]], bool]) -> Callable[[Any], bool]:
    """`holds` of an `inspect` view; an error code (the answer for a plugin the other replica
    has not heard of yet, on a loaded host) is "not yet"."""
    return lambda value: isinstance(value, dict) and holds(value)


async def page_step(work: Awaitable[T], what: str) -> T:
    """A page runner's wait (an event, a reply), bounded: a stall fails saying which."""
    try:
        return await asyncio.wait_for(work, _PAGE_STEP_S)
    except TimeoutError:
        raise AssertionError(f"the page runner: {what} within {_PAGE_STEP_S:g} s") from None


async def inspect(h: CordisHarness, arguments: dict[str, Any] | None = None) -> Any:
    """`cordis_inspect_self` on `h`: the value, or the error result's code."""
    result = await h.call(AGENT, "cordis_inspect_self", arguments or {})
    return result.error.code if result.is_error else jsonvalue.loads(result.value_json)


def plugin_ids(listed: Any) -> list[str]:
    return [] if isinstance(listed, str) else [p["pluginId"] for p in listed["plugins"]]


def hosts_of(h: CordisHarness) -> InProcessHosts:
    assert isinstance(h.hosts, InProcessHosts)
    return h.hosts


def _sql(dsn: str, statement: str, *params: object) -> list[tuple[Any, ...]]:
    """What another registry committed without its notification having arrived (none is
    sent), or a look at the stored rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement.encode(), params)
        return cursor.fetchall() if cursor.description else []


async def _reloads(follower: ChangeFollower) -> int:
    return follower.reloads


def _value(result: Any) -> Any:
    return jsonvalue.loads(result.value_json)


@pytest.fixture
async def replicas(
    make_cordis: Any, pg_database: str
) -> AsyncIterator[tuple[CordisHarness, CordisHarness]]:
    settings = {"history_store": "postgres", "history_dsn": pg_database}
    async with make_cordis(**settings) as a, make_cordis(**settings) as b:
        for h in (a, b):  # both follow the store (their LISTENs hold) before the test acts
            follower = h.registry.cordis.runner.follower
            assert follower is not None
            await seen(functools.partial(_reloads, follower), bool, "a Cordis reload")
        await a.agent("coder")

        async def agent_on_b() -> bool:
            try:
                return not isinstance(await inspect(b), str)
            except grpc.aio.AioRpcError:  # NOT_FOUND until B has heard of the agent
                return False

        await seen(agent_on_b, bool, "the agent")
        yield a, b


async def test_a_plugin_defined_on_one_replica_runs_on_the_other_and_pointers_follow(
    replicas: tuple[CordisHarness, CordisHarness],
) -> None:
    a, b = replicas
    defined = await a.define(AGENT)
    assert (defined["pluginId"], defined["packageId"]) == ("clock-1", "pkg-1")
    await seen(lambda: inspect(b), lambda r: plugin_ids(r) == ["clock-1"], "a defined plugin")
    view = await inspect(b, {"pluginId": "clock-1", "packageId": "pkg-1"})
    assert view["code"] == {"host": CLOCK}
    [reference] = b.registry.cordis.references(AGENT, "look at @clock-1")
    assert reference.available

    # Activated through B: the host runs on B, its tool is in B's catalog and answers there.
    run = await b.ok(
        AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}
    )
    assert run["status"] == "running"
    assert "clock_now" in await b.visible(AGENT)
    assert (await b.ok(AGENT, "clock_now", {}))["time"] == "12:00"
    assert [e[0] for e in hosts_of(b).log].count("activate") == 1
    assert hosts_of(a).log == []
    # The pointers B moved are A's too.
    plugin = await seen(
        lambda: inspect(a, {"pluginId": "clock-1"}),
        inspected(lambda r: r.get("currentPackageId") == "pkg-1"),
        "the current pointer",
    )
    assert "nextPackageId" not in plugin

    # A second package defined on A is there on B; an update through B moves both views.
    await a.define(AGENT, CLOCK.replace("12:00", "13:00"), existing="clock-1")
    await seen(
        lambda: inspect(b, {"pluginId": "clock-1"}),
        lambda r: [p["packageId"] for p in r["packages"]] == ["pkg-1", "pkg-2"],
        "a second package",
    )
    updated = await b.ok(
        AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-2", "mode": "update"}
    )
    assert updated["currentPackageId"] == "pkg-2"
    assert (await b.ok(AGENT, "clock_now", {}))["time"] == "13:00"
    await seen(
        lambda: inspect(a, {"pluginId": "clock-1"}),
        inspected(lambda r: r.get("currentPackageId") == "pkg-2"),
        "the updated pointer",
    )

    # Undefined through A: B forgets it, and retracts the host it ran (its tool goes).
    await a.ok(AGENT, "cordis_undefine", {"pluginId": "clock-1"})
    await seen(lambda: inspect(b), lambda r: plugin_ids(r) == [], "an undefined plugin")
    assert "clock_now" not in await b.visible(AGENT)
    assert await inspect(b, {"pluginId": "clock-1"}) == "plugin-missing"


async def test_a_grant_given_on_one_replica_holds_on_the_other(
    replicas: tuple[CordisHarness, CordisHarness],
) -> None:
    a, b = replicas
    await b.define(AGENT, CLOCK, prefix="panel", client=CLIENT, name="Panel")
    async with PageRunner(b.channel, AGENT) as page:
        asked = await b.ok(
            AGENT, "cordis_run", {"pluginId": "panel-1", "packageId": "pkg-1", "mode": "run"}
        )
        assert asked["status"] == "awaiting-approval"
        requested = await page_step(page.next_event("run_requested"), "no run request")
        request = requested.run_requested
        started = await page_step(
            page.run_host_half(request, approve_future_versions=True), "no host-half reply"
        )
        assert started.accepted, started.message
        settled = await page_step(
            page.settle(request.request_id, started.plugin_run_id), "no settle reply"
        )
        assert settled.accepted, settled.message
    await seen(
        lambda: inspect(a, {"pluginId": "panel-1"}),
        inspected(lambda r: r.get("currentPackageId") == "pkg-1"),
        "the settled pointer",
    )
    # A later version, run through A: approved already (B's grant of future versions).
    await a.define(AGENT, CLOCK, existing="panel-1", client=CLIENT, name="Panel")
    await seen(
        lambda: inspect(b, {"pluginId": "panel-1"}),
        inspected(lambda r: r["packageCount"] == 2),
        "the second package",
    )
    await b.ok(AGENT, "cordis_stop", {"pluginId": "panel-1"})
    again = await a.ok(
        AGENT, "cordis_run", {"pluginId": "panel-1", "packageId": "pkg-2", "mode": "update"}
    )
    assert again["status"] == "starting"  # no approval asked


async def _define(h: CordisHarness, prefix: str, call_id: str) -> Any:
    arguments = {
        "plugin": {"kind": "new", "idPrefix": prefix},
        "name": "Clock",
        "purpose": "Tell the time.",
        "code": {"host": CLOCK},
    }
    return await h.ok(AGENT, "cordis_define", arguments, call_id)


async def test_ids_never_collide_when_both_replicas_define_at_once(
    replicas: tuple[CordisHarness, CordisHarness],
) -> None:
    a, b = replicas
    made = await asyncio.gather(
        *(
            _define(h, prefix, f"d{n}")
            for n in range(8)
            for h, prefix in ((a, "left"), (b, "right"))
        )
    )
    plugins = [m["pluginId"] for m in made]
    packages = [m["packageId"] for m in made]
    assert len(set(plugins)) == len(plugins) == 16
    assert len(set(packages)) == len(packages) == 16
    # One counter for every prefix: the numbers are 1..16, each once.
    assert sorted(int(p.rsplit("-", 1)[1]) for p in plugins) == list(range(1, 17))
    for h in (a, b):
        await seen(
            functools.partial(inspect, h),
            lambda r: sorted(plugin_ids(r)) == sorted(plugins),
            "all",
        )
    # Runs started at once on both (only the first tool name registers per agent and
    # replica, so each replica runs its own plugins): their run ids differ too.
    runs = await asyncio.gather(
        *(
            h.call(
                AGENT,
                "cordis_run",
                {"pluginId": m["pluginId"], "packageId": m["packageId"], "mode": "run"},
                f"r{n}",
            )
            for n, (h, m) in enumerate(zip((a, b) * 4, made, strict=False))
        )
    )
    run_ids = [_value(r)["pluginRunId"] for r in runs if not r.is_error]
    failed_ids = [r.error.message for r in runs if r.is_error]
    assert run_ids and len(set(run_ids)) == len(run_ids), (run_ids, failed_ids)
    with psycopg.connect(a.registry.settings.history_dsn.get_secret_value()) as conn:
        [(last,)] = conn.execute("SELECT last FROM cordis_ids WHERE kind = 'runs'").fetchall()
    assert last == len(runs)  # every attempt drew one number, none twice


async def test_a_stale_write_is_refused_and_changes_nothing(
    replicas: tuple[CordisHarness, CordisHarness], pg_database: str
) -> None:
    a, b = replicas
    await a.define(AGENT)  # clock-1/pkg-1
    await a.define(AGENT, CLOCK.replace("12:00", "13:00"), existing="clock-1")  # pkg-2
    await seen(
        lambda: inspect(b, {"pluginId": "clock-1"}),
        inspected(lambda r: r["packageCount"] == 2),
        "packages",
    )
    # Another registry activated pkg-1 a moment ago; B has not heard (no notification).
    _sql(
        pg_database,
        "UPDATE cordis_plugins SET current_package = 'pkg-1', revision = revision + 1"
        " WHERE plugin_id = 'clock-1'",
    )
    stored = _sql(pg_database, "SELECT current_package, next_package, revision FROM cordis_plugins")
    refused = await b.run(AGENT, "clock-1", "pkg-2")  # "run" is right by B's stale view
    assert refused.is_error and refused.error.code == "stale-state", refused.error.message
    assert "changed by another registry" in refused.error.message
    assert (
        _sql(pg_database, "SELECT current_package, next_package, revision FROM cordis_plugins")
        == stored
    )
    assert hosts_of(b).log == []  # nothing started
    # B read the plugin again: it now answers as the store is, and an update works.
    view = await inspect(b, {"pluginId": "clock-1"})
    assert view["currentPackageId"] == "pkg-1" and "nextPackageId" not in view
    assert not (await b.run(AGENT, "clock-1", "pkg-2", "update")).is_error

    # Removed elsewhere without B hearing: B's define on it stores no package.
    await a.define(AGENT, prefix="gone")  # gone-2/pkg-3
    await seen(lambda: inspect(b), lambda r: "gone-2" in plugin_ids(r), "another plugin")
    for table in ("cordis_plugins", "cordis_packages"):
        _sql(pg_database, f"DELETE FROM {table} WHERE plugin_id = 'gone-2'")
    result = await b.call(
        AGENT,
        "cordis_define",
        {
            "plugin": {"kind": "existing", "pluginId": "gone-2"},
            "name": "Gone",
            "purpose": "Late.",
            "code": {"host": CLOCK},
        },
    )
    assert result.is_error and result.error.code == "plugin-missing"
    assert _sql(pg_database, "SELECT count(*) FROM cordis_packages WHERE plugin_id = 'gone-2'") == [
        (0,)
    ]
    assert "gone-2" not in plugin_ids(await inspect(b))


async def test_a_replica_that_missed_notifications_reloads_on_reconnect(
    replicas: tuple[CordisHarness, CordisHarness], pg_database: str
) -> None:
    a, b = replicas
    await a.define(AGENT)  # clock-1/pkg-1 (seen on B through its notification)
    await seen(lambda: inspect(b), lambda r: plugin_ids(r) == ["clock-1"], "a plugin")
    owner_id = _sql(pg_database, "SELECT owner_id FROM cordis_plugins")[0][0]
    # Written with no notification, as if B's LISTEN connection had been down meanwhile.
    _sql(
        pg_database,
        "INSERT INTO cordis_plugins VALUES ('quiet-9', %s, %s, NULL, NULL, false, 1)",
        AGENT,
        owner_id,
    )
    _sql(
        pg_database,
        "INSERT INTO cordis_packages (plugin_id, package_id, name, purpose, host)"
        " VALUES ('quiet-9', 'pkg-9', 'Quiet', 'Unannounced.', 'return apply')",
    )
    _sql(
        pg_database,
        "UPDATE cordis_plugins SET next_package = 'pkg-1', revision = 2"
        " WHERE plugin_id = 'clock-1'",
    )
    assert plugin_ids(await inspect(b)) == ["clock-1"]  # not heard of
    ended = _sql(
        pg_database,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE 'LISTEN%%'",
    )
    assert ended, "no LISTEN connection found"
    await seen(
        lambda: inspect(b), lambda r: plugin_ids(r) == ["clock-1", "quiet-9"], "unannounced rows"
    )
    assert (await inspect(b, {"pluginId": "clock-1"}))["nextPackageId"] == "pkg-1"
