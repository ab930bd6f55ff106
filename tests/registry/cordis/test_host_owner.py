"""One live plugin host per running plugin across registries sharing one real PostgreSQL, over
gRPC only: the registry that activates a plugin holds its host lease and runs its host; the
other registry lists the plugin's tools too and forwards their calls (from a program, after its
own pipeline) to the owner over the authenticated peer channel, as it does a page runner's
handler calls; a stop anywhere retracts the host in its owner. When the owner is lost mid-call
the call fails ABORTED and is recorded, the survivor takes the expired lease over, reactivates
the current package and steers the agent, and a later call works on the survivor. The peer
channel refuses callers without the shared secret. Plugin hosts are in-process hosts of the
seam (one set per registry); programs run on a real runtime. Every wait is a latch."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psycopg
import pytest

from codemode_client.channel import open_channel
from codemode_client.page_runner import PageRunner
from codemode_wire.api.registry.v1 import cordis_peer_pb2 as peer_pb
from codemode_wire.api.registry.v1 import cordis_peer_pb2_grpc as peer_grpc
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.domain.cordis.placement import HostPlacement
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.registry.conftest import BOTH
from tests.registry.cordis.conftest import CLOCK, CordisHarness
from tests.registry.cordis.hosts import InProcessHosts
from tests.registry.cordis.real_stack import program
from tests.registry.cordis.test_replicas import seen

AGENT = "agents/coder"
GATED = CLOCK.replace(
    'probe.seen.append("now")', 'probe.seen.append("now")\n    await probe.gate("g").wait()'
)
HANDLER_HOST = """\
async def greet(args):
    probe.seen.append("greet")
    return {"hello": args["name"]}

async def apply(ctx):
    harness.handle("greet", greet)

return apply
"""
CLIENT = "return { apply(ctx) { ctx.log('hello') } }"


def hosts_of(h: CordisHarness) -> InProcessHosts:
    assert isinstance(h.hosts, InProcessHosts)
    return h.hosts


def placement_of(h: CordisHarness) -> HostPlacement:
    placement = h.registry.cordis.runner.placement
    assert placement is not None
    return placement


def activations(h: CordisHarness) -> int:
    return [entry[0] for entry in hosts_of(h).log].count("activate")


def lease_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT plugin_id, owner, address, epoch FROM cordis_host_leases ORDER BY plugin_id"
        ).fetchall()


async def visible(h: CordisHarness) -> list[str]:
    return await h.visible(AGENT)


@pytest.fixture
async def runtime() -> AsyncIterator[str]:
    running = await start_runtime(RuntimeSettings(listen="127.0.0.1:0", pool_size=2))
    try:
        yield running.address
    finally:
        await running.stop(0)


@pytest.fixture
async def replicas(
    make_cordis: Any, pg_database: str, runtime: str
) -> AsyncIterator[tuple[CordisHarness, CordisHarness]]:
    settings = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "token_key": "5e" * 32,  # shared by the replicas: the peer secret derives from it
        "cordis_host_lease_s": 3.0,
        "runtime_targets": [runtime],
    }
    async with make_cordis(**settings) as a, make_cordis(**settings) as b:
        for h in (a, b):
            follower = h.registry.cordis.runner.follower
            assert follower is not None

            async def reloads(follower: Any = follower) -> int:
                return int(follower.reloads)

            await seen(reloads, bool, "a Cordis reload")
        await a.agent("coder", mode=BOTH)

        async def listed() -> bool:
            try:
                result = await b.call(AGENT, "cordis_inspect_self", {})
            except grpc.aio.AioRpcError:  # NOT_FOUND until B has heard of the agent
                return False
            return not result.is_error

        await seen(listed, bool, "the agent on B")
        yield a, b


async def test_the_lease_owner_runs_the_host_and_the_other_replica_forwards_to_it(
    replicas: tuple[CordisHarness, CordisHarness], pg_database: str
) -> None:
    a, b = replicas
    await a.define(AGENT)
    started = await a.ok(
        AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}
    )
    assert started["status"] == "running"
    [(plugin_id, owner, address, epoch)] = lease_rows(pg_database)
    assert (plugin_id, owner, address, epoch) == (
        "clock-1",
        placement_of(a).instance,
        placement_of(a).address,
        1,
    )
    # B lists the tool of the plugin A runs, and a program on B calls it: it runs on A.
    await seen(lambda: visible(b), lambda names: "clock_now" in names, "the tool on B")
    value = await program(b, AGENT, "return await tools.clock_now({'a': 1})", "p1")
    assert value == {"logs": [], "result": {"time": "12:00", "args": {"a": 1}}}
    assert hosts_of(a).probe.seen == ["now"]
    assert activations(a) == 1 and activations(b) == 0
    # Recorded on B like any nested call of a tool.
    page = await b.stub.ListHistory(rpb.ListHistoryRequest(agent=AGENT))
    dispatched = [r for r in page.records if r.kind == "tool/code-dispatch"]
    assert [(r.tool_name, r.is_error) for r in dispatched] == [("clock_now", False)]

    # A stop through B retracts the host in A (its effects disposed), and releases the lease.
    await b.ok(AGENT, "cordis_stop", {"pluginId": "clock-1"})
    assert "disposed clock" in hosts_of(a).probe.seen
    assert lease_rows(pg_database) == []
    await seen(lambda: visible(a), lambda names: "clock_now" not in names, "the tool gone on A")
    await seen(lambda: visible(b), lambda names: "clock_now" not in names, "the tool gone on B")

    # Run again through B: B owns it now, and A forwards to B.
    await b.ok(AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"})
    assert [row[1] for row in lease_rows(pg_database)] == [placement_of(b).instance]
    await seen(lambda: visible(a), lambda names: "clock_now" in names, "the tool on A")
    value = await program(a, AGENT, "return await tools.clock_now({})", "p2")
    assert value["result"]["time"] == "12:00"
    assert activations(a) == 1 and activations(b) == 1
    assert hosts_of(b).probe.seen == ["now"]


async def test_an_owner_lost_mid_call_fails_the_call_aborted_and_a_survivor_takes_over(
    replicas: tuple[CordisHarness, CordisHarness], pg_database: str
) -> None:
    a, b = replicas
    await a.define(AGENT, GATED)
    await a.ok(AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"})
    await seen(lambda: visible(b), lambda names: "clock_now" in names, "the tool on B")
    code = (
        "try:\n    return await tools.clock_now({})\nexcept Exception as exc:\n    return str(exc)"
    )
    call = asyncio.ensure_future(program(b, AGENT, code, "in-flight"))

    async def held() -> list[str]:
        return list(hosts_of(a).probe.seen)

    await seen(held, lambda s: s == ["now"], "the call held in A's host")
    # A is lost: it stops renewing its lease and its server goes away with the call in flight.
    keeper = a.registry.cordis.runner._keeper
    assert keeper is not None
    keeper.cancel()
    await a.running.server.stop(0)

    failed = await call  # the program caught the tool's failure
    assert failed["result"].startswith(
        'the call of tool "clock_now" of dynamic plugin clock-1 was lost with the registry '
        "running its host"
    ), failed
    page = await b.stub.ListHistory(rpb.ListHistoryRequest(agent=AGENT))
    [dispatch] = [r for r in page.records if r.kind == "tool/code-dispatch"]
    assert (dispatch.tool_name, dispatch.is_error, dispatch.error_code) == (
        "clock_now",
        True,
        "ABORTED",
    )

    # Once A's lease expires, B takes it over and reactivates the current package.
    hosts_of(b).probe.gate("g").set()

    async def owners() -> list[Any]:
        return [(row[1], row[3]) for row in lease_rows(pg_database)]

    taken = await seen(
        owners, lambda rows: rows == [(placement_of(b).instance, 2)], "B holding the lease"
    )
    assert taken == [(placement_of(b).instance, 2)]
    await seen(lambda: visible(b), lambda names: "clock_now" in names, "the tool on B again")
    assert activations(b) == 1

    async def steered() -> list[str]:
        page = await b.stub.ListHistory(rpb.ListHistoryRequest(agent=AGENT))
        return [r.content[0].text.text for r in page.records if r.kind == "agent/steer"]

    [steer] = await seen(steered, lambda texts: len(texts) == 1, "the steering record")
    assert "ran on a registry that was lost" in steer
    assert "reactivated on another registry as run-2" in steer
    value = await program(b, AGENT, "return await tools.clock_now({'again': True})", "later")
    assert value == {"logs": [], "result": {"time": "12:00", "args": {"again": True}}}


async def test_an_owner_that_stops_renewing_is_fenced_out_and_its_calls_in_flight_fail(
    replicas: tuple[CordisHarness, CordisHarness], pg_database: str
) -> None:
    """A stalls (it stops renewing; its connections stay open, its host keeps the call): once
    its lease expires B forgets A's run, so the call in flight on B fails ABORTED without
    waiting for A, and B takes over; A, renewing late, finds the lease taken and retracts."""
    a, b = replicas
    await a.define(AGENT, GATED)
    await a.ok(AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"})
    await seen(lambda: visible(b), lambda names: "clock_now" in names, "the tool on B")
    runner_a = a.registry.cordis.runner
    keeper = runner_a._keeper
    assert keeper is not None
    call = asyncio.ensure_future(b.call(AGENT, "clock_now", {}, "stalled"))

    async def held() -> list[str]:
        return list(hosts_of(a).probe.seen)

    await seen(held, lambda s: s == ["now"], "the call held in A's host")
    keeper.cancel()
    result = await call
    assert result.is_error and result.error.code == "ABORTED", result.error.message
    assert (await b.settled(AGENT, "stalled")).error_code == "ABORTED"

    async def owners() -> list[Any]:
        return [(row[1], row[3]) for row in lease_rows(pg_database)]

    await seen(owners, lambda rows: rows == [(placement_of(b).instance, 2)], "B's lease")
    await seen(lambda: visible(b), lambda names: "clock_now" in names, "B's own run")
    assert activations(b) == 1
    # A's late renewal is refused (epoch 2 is B's): A retracts its host, B keeps running.
    assert "disposed clock" not in hosts_of(a).probe.seen
    await runner_a._renew(placement_of(a))
    assert "disposed clock" in hosts_of(a).probe.seen
    assert await owners() == [(placement_of(b).instance, 2)]
    hosts_of(b).probe.gate("g").set()
    assert (await b.ok(AGENT, "clock_now", {}, "after"))["time"] == "12:00"


async def test_a_page_on_one_replica_invokes_a_handler_of_a_host_the_other_runs(
    replicas: tuple[CordisHarness, CordisHarness],
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
    assert activations(a) == 1

    async def run_on_b() -> Any:
        plugin = b.registry.cordis.runner.find(AGENT, "panel-1")
        return None if plugin is None or plugin.run is None else plugin.run.run_id

    await seen(run_on_b, lambda run: run == started.plugin_run_id, "A's run seen on B")
    async with PageRunner(b.channel, AGENT) as page_b:
        reply = await page_b.invoke("panel-1", started.plugin_run_id, "greet", {"name": "B"})
        assert reply.accepted, reply.message
        assert reply.value_json == '{"hello":"B"}'
        stale = await page_b.invoke("panel-1", "run-99", "greet", {"name": "B"})
        assert (stale.accepted, stale.code) == (False, "stale-run")
    assert hosts_of(a).probe.seen == ["greet"] and activations(b) == 0


async def test_the_peer_channel_refuses_callers_without_the_shared_secret(
    replicas: tuple[CordisHarness, CordisHarness],
) -> None:
    a, _b = replicas
    await a.define(AGENT)
    await a.ok(AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"})
    stub = peer_grpc.CordisPeerServiceStub(a.channel)
    request = peer_pb.PeerCallToolRequest(
        plugin_id="clock-1", run_id="run-1", tool="clock_now", arguments_json="{}"
    )
    for metadata in ((), (("x-codemode-peer", "guess"),)):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.PeerCallTool(request, metadata=metadata)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.PeerFollowHost(
                peer_pb.PeerFollowHostRequest(plugin_id="clock-1"), metadata=metadata
            ):
                pass
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert hosts_of(a).probe.seen == []  # nothing ran


ALICE, EVE = "alice-token-0123456789abcdef", "eve-token-0123456789abcdef"


def _token(principal: str, token: str) -> dict[str, str]:
    return {"principal": principal, "sha256": hashlib.sha256(token.encode()).hexdigest()}


def _as(h: CordisHarness, token: str) -> CordisHarness:
    """`h`'s registry, called with a bearer token."""
    other = CordisHarness(h.running, open_channel(h.running.address, bearer_token=token))
    other.hosts = h.hosts
    return other


async def test_a_forwarded_call_is_authorized_on_the_callers_registry_exactly_as_a_direct_one(
    make_cordis: Any, pg_database: str
) -> None:
    """Authorization on: eve may execute only another agent's tools. Her call of the plugin's
    tool on B is refused there, with nothing forwarded to A; alice's runs on A."""
    settings = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "token_key": "5e" * 32,
        "cordis_host_lease_s": 3.0,
        "auth": {"tokens": [_token("alice", ALICE), _token("eve", EVE)]},
        "grants": [
            {
                "principals": ["token:alice"],
                "permissions": ["manage", "execute", "cordis"],
                "resources": ["*"],
            },
            {"principals": ["token:eve"], "permissions": ["execute"], "resources": ["agents/eve"]},
        ],
    }
    async with make_cordis(**settings) as a0, make_cordis(**settings) as b0:
        a, b, eve = _as(a0, ALICE), _as(b0, ALICE), _as(b0, EVE)
        try:
            await a.agent("coder", mode=BOTH)
            await a.define(AGENT)
            await a.ok(
                AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}
            )
            await seen(lambda: visible(b), lambda names: "clock_now" in names, "the tool on B")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await eve.call(AGENT, "clock_now", {}, "eve-1")
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert hosts_of(a).probe.seen == []  # nothing reached the owner
            assert (await b.ok(AGENT, "clock_now", {}, "alice-1"))["time"] == "12:00"
            assert hosts_of(a).probe.seen == ["now"]
        finally:
            for h in (a, b, eve):
                await h.channel.close()


async def test_a_registry_shutting_down_hands_its_plugins_over_at_once(
    make_cordis: Any, pg_database: str
) -> None:
    """With a lease far longer than the test, A's clean shutdown still hands the plugin to B:
    A expires its leases as it closes, B hears of it and takes the plugin over."""
    settings = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "token_key": "5e" * 32,
        "cordis_host_lease_s": 3600.0,
    }
    async with make_cordis(**settings) as b:
        async with make_cordis(**settings) as a:
            await a.agent("coder", mode=BOTH)
            await a.define(AGENT)
            await a.ok(
                AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}
            )
            await seen(lambda: visible(b), lambda names: "clock_now" in names, "the tool on B")
            assert activations(b) == 0
        # A is closed (its host retracted): B runs the plugin now.
        assert "disposed clock" in hosts_of(a).probe.seen

        async def owners() -> list[Any]:
            return [(row[1], row[3]) for row in lease_rows(pg_database)]

        await seen(owners, lambda rows: rows == [(placement_of(b).instance, 2)], "B's lease")
        await seen(lambda: visible(b), lambda names: "clock_now" in names, "B's own run")
        assert activations(b) == 1
        assert (await b.ok(AGENT, "clock_now", {}))["time"] == "12:00"
        assert hosts_of(b).probe.seen == ["now"]
