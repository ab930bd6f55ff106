"""What a survivor reactivates when the registry owning a plugin's host is lost, over gRPC with
two registries on one real PostgreSQL: a plugin with a Client half has its Host half taken over
too (its tools and handlers answer on the survivor) and waits at `client-pending` until a page
attached to the survivor loads the Client half of the new run and settles it, with no new
approval; the reactivated host acts as the principal that activated the lost run, read from the
lease in the store, even on a survivor that never heard from the lost owner, and another
tenant's calls and runs meanwhile never put its principal on that host. Plugin hosts are the
in-process hosts of the seam; A is "lost" by stopping its renewals and its server. Every wait
is a latch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from codemode_client.page_runner import PageRunner
from codemode_common.principals import Principal
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.cordis.model import Attempt
from tests.registry.conftest import BOTH
from tests.registry.cordis.conftest import CordisHarness
from tests.registry.cordis.test_host_owner import (
    AGENT,
    CLIENT,
    HANDLER_HOST,
    _as,
    _token,
    activations,
    hosts_of,
    lease_rows,
    placement_of,
    visible,
)
from tests.registry.cordis.test_replicas import inspect, seen

LEASE_S = 2.0


def _lose(h: CordisHarness) -> Any:
    """`h` stops renewing its leases and its server goes away (its process lives on)."""
    keeper = h.registry.cordis.runner._keeper
    assert keeper is not None
    keeper.cancel()
    return h.running.server.stop(0)


async def _owner_of(dsn: str) -> list[tuple[str, int]]:
    return [(row[1], row[3]) for row in lease_rows(dsn)]


async def _steers(h: CordisHarness) -> list[str]:
    page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=AGENT))
    return [r.content[0].text.text for r in page.records if r.kind == "agent/steer"]


def _latest(h: CordisHarness, plugin_id: str, agent: str = AGENT) -> Attempt:
    plugin = h.registry.cordis.runner.find(agent, plugin_id)
    assert plugin is not None and plugin.latest is not None
    return plugin.latest


@pytest.fixture
async def replicas(
    make_cordis: Any, pg_database: str
) -> AsyncIterator[tuple[CordisHarness, CordisHarness]]:
    settings = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "token_key": "5e" * 32,
        "cordis_host_lease_s": LEASE_S,
    }
    async with make_cordis(**settings) as a, make_cordis(**settings) as b:
        await a.agent("coder", mode=BOTH)

        async def listed() -> bool:
            try:
                result = await b.call(AGENT, "cordis_inspect_self", {})
            except grpc.aio.AioRpcError:  # NOT_FOUND until B has heard of the agent
                return False
            return not result.is_error

        await seen(listed, bool, "the agent on B")
        yield a, b


async def test_a_plugin_with_a_client_half_has_its_host_half_taken_over(
    replicas: tuple[CordisHarness, CordisHarness], pg_database: str
) -> None:
    a, b = replicas
    await a.define(AGENT, HANDLER_HOST, prefix="panel", client=CLIENT, name="Panel")
    async with PageRunner(a.channel, AGENT) as page_a:
        asked = await a.ok(
            AGENT, "cordis_run", {"pluginId": "panel-1", "packageId": "pkg-1", "mode": "run"}
        )
        assert asked["status"] == "awaiting-approval"
        request = (await page_a.next_event("run_requested")).run_requested
        started = await page_a.run_host_half(request)
        assert started.accepted, started.message
        assert (await page_a.settle(request.request_id, started.plugin_run_id)).accepted
    assert started.plugin_run_id == "run-1" and activations(a) == 1

    async def run_on_b() -> Any:
        plugin = b.registry.cordis.runner.find(AGENT, "panel-1")
        return None if plugin is None or plugin.run is None else plugin.run.run_id

    await seen(run_on_b, lambda run: run == "run-1", "A's run seen on B")
    await _lose(a)
    await seen(
        lambda: _owner_of(pg_database),
        lambda rows: rows == [(placement_of(b).instance, 2)],
        "B holding the lease",
    )
    await seen(run_on_b, lambda run: run == "run-2", "B's own run")
    assert activations(b) == 1
    texts = await seen(
        lambda: _steers(b), lambda texts: any("was lost" in t for t in texts), "the steer"
    )
    [steer] = [text for text in texts if "was lost" in text]
    assert steer.startswith("Cordis plugin panel-1 (run-1) ran on a registry that was lost")
    assert "reactivated on another registry as run-2" in steer
    assert "its Client half waits (client-pending) for a page" in steer
    plugin = await inspect(b, {"pluginId": "panel-1"})
    assert plugin["currentPackageId"] == "pkg-1", plugin
    assert _latest(b, "panel-1").status == "client-pending"

    # The Host half answers on B; a page attached to B loads the Client half of the new run
    # and settles it (no approval asked: pkg-1's grant holds), and the plugin runs.
    async with PageRunner(b.channel, AGENT) as page_b:
        reply = await page_b.invoke("panel-1", "run-2", "greet", {"name": "B"})
        assert (reply.accepted, reply.value_json) == (True, '{"hello":"B"}'), reply.message
        stale = await page_b.invoke("panel-1", "run-1", "greet", {"name": "B"})
        assert (stale.accepted, stale.code) == (False, "stale-run")
        code = await page_b.client_code("panel-1", "run-2")
        assert code.accepted and code.client_code.code == CLIENT, code.message
        assert (await page_b.settle("", "run-2", plugin_id="panel-1")).accepted
    latest = _latest(b, "panel-1")
    assert (latest.status, latest.host.status, latest.client.status) == (
        "running",
        "running",
        "running",
    )
    assert hosts_of(b).probe.seen == ["greet"]


ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"


async def test_the_survivor_reactivates_as_the_stored_activator_never_another_tenant(
    make_cordis: Any, pg_database: str
) -> None:
    """Authorization on. Alice runs her plugin on A; bob, another tenant with rights on his own
    agent only, works on B meanwhile (a call of alice's tool, a run naming her plugin, a plugin
    of his own). A is lost before B (started only then) ever followed it, so nothing but the
    lease in the store says who activated it: B's reactivated host acts as alice, sees what
    she may call, and bob's principal is on no host of alice's agent."""
    settings = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "token_key": "5e" * 32,
        "cordis_host_lease_s": LEASE_S,
        "auth": {"tokens": [_token("alice", ALICE), _token("bob", BOB)]},
        "grants": [
            {
                "principals": ["token:alice"],
                "permissions": ["manage", "execute", "cordis"],
                "resources": ["*"],
            },
            {
                "principals": ["token:bob"],
                "permissions": ["execute", "cordis"],
                "resources": ["agents/bob"],
            },
        ],
    }
    alice = Principal("token", "alice")
    async with make_cordis(**settings) as a0:
        a = _as(a0, ALICE)
        try:
            await a.agent("coder", mode=BOTH)
            await a.agent("bob", mode=BOTH)
            await a.define(AGENT)
            await a.ok(
                AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}
            )
            [first] = hosts_of(a).hosts.values()
            assert first.spec.visible_tools  # alice's view of her agent
            [lease] = await placement_of(a0).leases.load()
            assert (lease.owner, lease.epoch, lease.principal) == (
                placement_of(a0).instance,
                1,
                alice,
            )
            await _lose(a0)
            async with make_cordis(**settings) as b0:
                b, bob = _as(b0, ALICE), _as(b0, BOB)
                try:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await bob.call(AGENT, "clock_now", {}, "bob-1")
                    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                    hijack = await bob.call(
                        "agents/bob",
                        "cordis_run",
                        {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"},
                        "bob-2",
                    )
                    assert hijack.is_error  # alice's plugin is no plugin of bob's agent
                    mine = await bob.define("agents/bob", prefix="bobby")
                    await bob.ok(
                        "agents/bob",
                        "cordis_run",
                        {
                            "pluginId": mine["pluginId"],
                            "packageId": mine["packageId"],
                            "mode": "run",
                        },
                        "bob-3",
                    )
                    await seen(
                        lambda: _owner_of(pg_database),
                        lambda rows: (placement_of(b0).instance, 2) in rows,
                        "B holding alice's lease",
                    )
                    await seen(
                        lambda: visible(b), lambda names: "clock_now" in names, "B's own run"
                    )
                    assert _latest(b0, "clock-1").principal == alice
                    [again] = [
                        h for h in hosts_of(b0).hosts.values() if h.spec.plugin_id == "clock-1"
                    ]
                    assert again.spec.visible_tools == first.spec.visible_tools
                    bobs = _latest(b0, mine["pluginId"], "agents/bob")
                    assert bobs.principal == Principal("token", "bob")
                    stored = {
                        lease.plugin_id: lease.principal
                        for lease in await placement_of(b0).leases.load()
                    }
                    assert stored == {mine["pluginId"]: Principal("token", "bob"), "clock-1": alice}
                    assert (await b.ok(AGENT, "clock_now", {}, "alice-1"))["time"] == "12:00"
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await bob.call(AGENT, "clock_now", {}, "bob-4")
                    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                finally:
                    for h in (b, bob):
                        await h.channel.close()
        finally:
            await a.channel.close()
