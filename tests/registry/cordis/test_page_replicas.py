"""Page runners across two registries on one real PostgreSQL, over gRPC only: a pending
activation request armed by `cordis_run` on A is a record in the store, so a page (or the
console, which lists what is pending when it attaches) on B is told of it and answers it; the
Host half starts on A, which holds the attempt and applies the settlement, whichever replica's
page gave it; the first answer wins across replicas, and a stale, duplicate or premature one
(a success before any approval: a Client half cannot approve) is refused on either replica and
changes nothing; another agent's page on B neither sees nor answers the request; a request
whose asking replica is gone is interrupted, so no page waits on it. Plugin hosts are
in-process hosts of the seam (one set per registry). Every wait is a latch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psycopg
import pytest

from codemode_client.page_runner import PageRunner
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import cordis_peer_pb2 as peer_pb
from codemode_wire.api.registry.v1 import cordis_peer_pb2_grpc as peer_grpc
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.registry.conftest import BOTH
from tests.registry.cordis.conftest import CLOCK, CordisHarness
from tests.registry.cordis.hosts import InProcessHosts
from tests.registry.cordis.real_stack import program
from tests.registry.cordis.test_replicas import seen

AGENT, OTHER = "agents/alice", "agents/bob"
CLIENT = "return { apply(ctx) { ctx.log('hello') } }"
HANDLER_HOST = """\
async def greet(args):
    probe.seen.append("greet")
    return {"hello": args["name"]}

async def apply(ctx):
    harness.handle("greet", greet)

return apply
"""


def activations(h: CordisHarness) -> int:
    assert isinstance(h.hosts, InProcessHosts)
    return [entry[0] for entry in h.hosts.log].count("activate")


def rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT request_id, agent, plugin_id, run_id, state, approved_by, settled_by"
            " FROM cordis_activations ORDER BY position"
        ).fetchall()


async def steered(h: CordisHarness, agent: str) -> list[str]:
    page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
    return [r.content[0].text.text for r in page.records if r.kind == "agent/steer"]


async def plugin_view(h: CordisHarness, agent: str, plugin_id: str) -> Any:
    result = await h.call(agent, "cordis_inspect_self", {"pluginId": plugin_id})
    return result.error.code if result.is_error else jsonvalue.loads(result.value_json)


def attempt_status(h: CordisHarness, plugin_id: str) -> str:
    plugin = h.registry.cordis.runner.find(AGENT, plugin_id)
    assert plugin is not None and plugin.latest is not None
    return plugin.latest.status


@pytest.fixture
async def replicas(
    make_cordis: Any, pg_database: str
) -> AsyncIterator[tuple[CordisHarness, CordisHarness]]:
    settings = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "token_key": "6f" * 32,  # shared: the peer secret derives from it (host leases on)
        "cordis_activation_poll_s": 0.2,
    }
    async with make_cordis(**settings) as a, make_cordis(**settings) as b:
        for h in (a, b):
            follower = h.registry.cordis.runner.follower
            assert follower is not None

            async def reloads(follower: Any = follower) -> int:
                return int(follower.reloads)

            await seen(reloads, bool, "a Cordis reload")
        await a.agent("alice")
        await a.agent("bob")

        async def listed() -> bool:
            try:
                for agent in (AGENT, OTHER):
                    if (await b.call(agent, "cordis_inspect_self", {})).is_error:
                        return False
            except grpc.aio.AioRpcError:  # NOT_FOUND until B has heard of the agent
                return False
            return True

        await seen(listed, bool, "the agents on B")
        yield a, b


async def _defined_on_both(a: CordisHarness, b: CordisHarness, host: str = CLOCK) -> None:
    await a.define(AGENT, host, prefix="panel", client=CLIENT, name="Panel")
    await seen(
        lambda: plugin_view(b, AGENT, "panel-1"), lambda v: isinstance(v, dict), "the plugin on B"
    )


async def test_asked_on_a_approved_and_settled_from_a_page_on_b(
    replicas: tuple[CordisHarness, CordisHarness], pg_database: str
) -> None:
    a, b = replicas
    await _defined_on_both(a, b, HANDLER_HOST)
    async with PageRunner(a.channel, AGENT) as page_a, PageRunner(b.channel, AGENT) as page_b:
        asked = await a.ok(
            AGENT, "cordis_run", {"pluginId": "panel-1", "packageId": "pkg-1", "mode": "run"}
        )
        assert asked["status"] == "awaiting-approval"
        request = (await page_b.next_event("run_requested")).run_requested  # from the store
        assert (request.agent, request.plugin_id, request.plugin_run_id) == (
            AGENT,
            "panel-1",
            asked["pluginRunId"],
        )
        assert request.requires_approval and request.source.host == HANDLER_HOST
        assert (await page_a.next_event("run_requested")).run_requested == request
        # B's cordis_run of the plugin sees the pending request too.
        again = await b.run(AGENT, "panel-1", "pkg-1")
        assert again.is_error and again.error.code == "transition-in-flight"

        started = await page_b.run_host_half(request, approve_future_versions=True)
        assert started.accepted and started.started_here, started.message
        assert started.plugin_run_id == request.plugin_run_id
        assert (activations(a), activations(b)) == (1, 0)  # the asker started the Host half
        code = await page_b.client_code("panel-1", started.plugin_run_id)
        assert code.accepted and code.client_code.code == CLIENT
        settled = await page_b.settle(request.request_id, started.plugin_run_id)
        assert settled.accepted, settled.message
        for page in (page_a, page_b):  # both replicas' pages hear it resolved
            resolved = (await page.next_event("run_resolved")).run_resolved
            assert (resolved.request_id, resolved.outcome) == (request.request_id, "approved")
        [row] = rows(pg_database)
        assert row[4] == "succeeded" and row[5] == row[6]  # approved and settled by B's page
        assert row[5].startswith(b.registry.cordis.client_runs.store.asker_id)

    # A, which holds the attempt, committed it and steered the agent.
    view = await seen(
        lambda: plugin_view(a, AGENT, "panel-1"),
        lambda v: v.get("currentPackageId") == "pkg-1",
        "the settled pointer on A",
    )
    assert "nextPackageId" not in view
    assert attempt_status(a, "panel-1") == "running"
    texts = await seen(lambda: steered(a, AGENT), bool, "the steering record")
    assert texts[0].startswith("Cordis run panel-1/pkg-1 (") and "completed" in texts[0]
    # B's grant of future versions holds on A too (the grant went through A's runner).
    plugin_a = a.registry.cordis.runner.find(AGENT, "panel-1")
    assert plugin_a is not None and plugin_a.client_version_updates_approved

    # The page on B calls the Host half A runs (followed over the peer channel).
    async def run_on_b() -> Any:
        plugin = b.registry.cordis.runner.find(AGENT, "panel-1")
        return None if plugin is None or plugin.run is None else plugin.run.run_id

    await seen(run_on_b, lambda run: run == started.plugin_run_id, "A's run seen on B")
    async with PageRunner(b.channel, AGENT) as page_b:
        reply = await page_b.invoke("panel-1", started.plugin_run_id, "greet", {"name": "B"})
        assert reply.accepted and reply.value_json == '{"hello":"B"}', reply.message


async def test_stale_duplicate_and_premature_answers_are_refused_on_either_replica(
    replicas: tuple[CordisHarness, CordisHarness], pg_database: str
) -> None:
    a, b = replicas
    await _defined_on_both(a, b)
    async with PageRunner(a.channel, AGENT) as page_a, PageRunner(b.channel, AGENT) as page_b:
        asked = await a.ok(
            AGENT, "cordis_run", {"pluginId": "panel-1", "packageId": "pkg-1", "mode": "run"}
        )
        request = (await page_b.next_event("run_requested")).run_requested
        await page_a.next_event("run_requested")
        before = rows(pg_database)
        # A Client half reporting success before any approval: refused on both, nothing moves.
        for page in (page_a, page_b):
            early = await page.settle(request.request_id, asked["pluginRunId"])
            assert (early.accepted, early.code) == (False, "stale-run"), early.message
        assert rows(pg_database) == before and before[0][4] == "pending"
        assert activations(a) == 0

        # Both pages approve at once: one starts it, the other shares that start.
        first, second = await asyncio.gather(
            page_a.run_host_half(request), page_b.run_host_half(request)
        )
        assert first.accepted and second.accepted, (first.message, second.message)
        assert sorted([first.started_here, second.started_here]) == [False, True]
        assert activations(a) == 1
        # Both settle at once, one rejecting and one succeeding: one answer wins.
        run_id = first.plugin_run_id
        answers = await asyncio.gather(
            page_a.settle(request.request_id, run_id, "rejected"),
            page_b.settle(request.request_id, run_id),
        )
        assert [r.accepted for r in answers].count(True) == 1, [r.message for r in answers]
        settled = rows(pg_database)
        assert settled[0][4] in ("succeeded", "rejected")
        # Duplicates and late answers, on either replica and either way, change nothing.
        for page in (page_a, page_b):
            for outcome in ("success", "rejected", "client-half-failed"):
                late = await page.settle(request.request_id, run_id, outcome)
                assert (late.accepted, late.code) == (False, "request-unknown")
            stale = await page.run_host_half(request)
            assert (stale.accepted, stale.code) == (False, "request-unknown")
        assert rows(pg_database) == settled
    assert activations(a) == 1 and activations(b) == 0


async def test_another_agents_page_on_b_neither_sees_nor_answers_the_request(
    replicas: tuple[CordisHarness, CordisHarness], pg_database: str
) -> None:
    a, b = replicas
    await _defined_on_both(a, b)
    async with (
        PageRunner(b.channel, OTHER, "bob-page") as bob,
        PageRunner(b.channel, AGENT) as alice,
    ):
        await a.ok(
            AGENT, "cordis_run", {"pluginId": "panel-1", "packageId": "pkg-1", "mode": "run"}
        )
        request = (await alice.next_event("run_requested")).run_requested
        before = rows(pg_database)
        # Bob's page answers with alice's request id, every way: unknown, and nothing moves.
        forged = await bob.run_host_half(request)
        assert (forged.accepted, forged.code) == (False, "request-unknown")
        for outcome in ("success", "rejected", "host-half-failed"):
            answer = await bob.settle(request.request_id, request.plugin_run_id, outcome)
            assert (answer.accepted, answer.code) == (False, "request-unknown")
        assert (await bob.client_code("panel-1", request.plugin_run_id)).code == "stale-run"
        assert rows(pg_database) == before and activations(a) == 0
        # A request of bob's own, armed on A, is the first thing bob's page hears of.
        await a.define(OTHER, CLOCK, prefix="bobs", client=CLIENT, name="Bobs")
        await seen(
            lambda: plugin_view(b, OTHER, "bobs-2"), lambda v: isinstance(v, dict), "bob's plugin"
        )
        await a.ok(OTHER, "cordis_run", {"pluginId": "bobs-2", "packageId": "pkg-2", "mode": "run"})
        own = (await bob.next_event("run_requested")).run_requested
        assert (own.agent, own.plugin_id) == (OTHER, "bobs-2")
        # And alice's request is still hers to answer.
        assert (await alice.run_host_half(request)).accepted


async def test_a_page_attaching_later_on_b_lists_what_is_pending_like_the_console(
    replicas: tuple[CordisHarness, CordisHarness],
) -> None:
    a, b = replicas
    await _defined_on_both(a, b)
    await a.ok(AGENT, "cordis_run", {"pluginId": "panel-1", "packageId": "pkg-1", "mode": "run"})

    async def armed_on_b() -> bool:
        return bool(b.registry.cordis.client_runs.has_pending("panel-1"))

    await seen(armed_on_b, bool, "the request on B")
    # The console is a page runner: what it lists when it attaches is replayed from the store.
    async with PageRunner(b.channel, AGENT, "console") as console:
        request = (await console.next_event("run_requested")).run_requested
        assert request.plugin_id == "panel-1"
        rejected = await console.settle(request.request_id, "", "rejected")
        assert rejected.accepted, rejected.message
        resolved = (await console.next_event("run_resolved")).run_resolved
        assert resolved.outcome == "rejected"

    async def status() -> str:
        return attempt_status(a, "panel-1")

    await seen(status, lambda s: s == "rejected", "the rejection on A")
    assert "currentPackageId" not in await plugin_view(a, AGENT, "panel-1")
    texts = await seen(lambda: steered(a, AGENT), bool, "the steering record")
    assert "The user rejected Cordis run panel-1/pkg-1" in texts[0]


async def test_a_request_whose_asking_replica_is_gone_is_interrupted(
    make_cordis: Any, pg_database: str
) -> None:
    settings = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "token_key": "6f" * 32,
        "cordis_activation_poll_s": 0.2,
    }
    async with make_cordis(**settings) as b:

        async def pending_on_b() -> bool:
            return bool(b.registry.cordis.client_runs.has_pending("panel-1"))

        async def agent_on_b() -> bool:
            try:
                return not (await b.call(AGENT, "cordis_inspect_self", {})).is_error
            except grpc.aio.AioRpcError:  # NOT_FOUND until B has heard of the agent
                return False

        async with make_cordis(**settings) as a:
            await a.agent("alice")
            await a.define(AGENT, CLOCK, prefix="panel", client=CLIENT, name="Panel")
            await seen(agent_on_b, bool, "the agent on B")
            page_b = PageRunner(b.channel, AGENT)
            await page_b.attach()
            await a.ok(
                AGENT, "cordis_run", {"pluginId": "panel-1", "packageId": "pkg-1", "mode": "run"}
            )
            request = (await page_b.next_event("run_requested")).run_requested
            await seen(pending_on_b, bool, "the request on B")
        try:
            # A is gone (its history writer removed as it closed): B interrupts its request,
            # its page hears it cancelled, and an answer now is refused.
            resolved = (await page_b.next_event("run_resolved")).run_resolved
            assert (resolved.request_id, resolved.outcome) == (request.request_id, "cancelled")
            late = await page_b.run_host_half(request)
            assert (late.accepted, late.code) == (False, "request-unknown")
        finally:
            await page_b.close()
        [row] = rows(pg_database)
        assert (row[0], row[4]) == (request.request_id, "interrupted")
        assert not b.registry.cordis.client_runs.has_pending("panel-1")


async def _running_on_a_seen_on_b(a: CordisHarness, b: CordisHarness, page_b: PageRunner) -> str:
    """panel-1/pkg-1 asked on A, approved and settled by a page on B, so A holds its run and
    attempt and B follows it; returns the run id."""
    await _defined_on_both(a, b, HANDLER_HOST)
    await a.ok(AGENT, "cordis_run", {"pluginId": "panel-1", "packageId": "pkg-1", "mode": "run"})
    request = (await page_b.next_event("run_requested")).run_requested
    started = await page_b.run_host_half(request)
    assert started.accepted and started.started_here, started.message
    settled = await page_b.settle(request.request_id, started.plugin_run_id)
    assert settled.accepted, settled.message
    await seen(
        lambda: plugin_view(a, AGENT, "panel-1"),
        lambda v: v.get("state") == "running",
        "the settled run on A",
    )

    async def run_on_b() -> Any:
        plugin = b.registry.cordis.runner.find(AGENT, "panel-1")
        return None if plugin is None or plugin.run is None else plugin.run.run_id

    await seen(run_on_b, lambda run: run == started.plugin_run_id, "A's run seen on B")
    return str(started.plugin_run_id)


async def _client_half(h: CordisHarness) -> Any:
    view = await h.ok(AGENT, "cordis_inspect_self", {"pluginId": "panel-1", "packageId": "pkg-1"})
    return view["runtime"]["client"]


def _render_steers(texts: list[str]) -> list[str]:
    return [t for t in texts if "client-render-failed" in t]


def _any_render_steer(texts: list[str]) -> bool:
    return bool(_render_steers(texts))


async def test_a_render_failure_reported_on_b_reaches_the_run_on_a_once(
    replicas: tuple[CordisHarness, CordisHarness],
) -> None:
    a, b = replicas
    async with (
        PageRunner(b.channel, AGENT) as page_b,
        PageRunner(b.channel, OTHER, "bob-page") as bob,
    ):
        run_id = await _running_on_a_seen_on_b(a, b, page_b)
        # Another agent's page on B, and a stale run on either replica: refused, nothing moves.
        foreign = await bob.render_failure("panel-1", run_id, "not yours")
        assert (foreign.accepted, foreign.code) == (False, "stale-run"), foreign.message
        async with PageRunner(a.channel, AGENT) as page_a:
            for page in (page_a, page_b):
                stale = await page.render_failure("panel-1", "run-99", "old run")
                assert (stale.accepted, stale.code) == (False, "stale-run"), stale.message
        assert attempt_status(a, "panel-1") == "running"
        assert "renderFailure" not in await _client_half(a)
        assert _render_steers(await steered(a, AGENT)) == []
        # The owner applies the same rule to a forged peer report for another agent's page.
        stub = peer_grpc.CordisPeerServiceStub(a.channel)
        forged = peer_pb.PeerRenderFailureRequest(
            agent=OTHER, plugin_id="panel-1", run_id=run_id, message="forged"
        )
        token = a.registry.settings.cordis_peer_token()
        assert token is not None
        answer = await stub.PeerRenderFailure(forged, metadata=(("x-codemode-peer", token),))
        assert (answer.accepted, answer.code) == (False, "stale-run")
        with pytest.raises(grpc.aio.AioRpcError) as unauthenticated:
            await stub.PeerRenderFailure(forged)
        assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert attempt_status(a, "panel-1") == "running"

        # The page on B reports the run A holds, twice: A keeps it and its attempt fails.
        for _ in range(2):
            reply = await page_b.render_failure("panel-1", run_id, "TypeError: x is null", "at f")
            assert reply.accepted and reply.plugin_run_id == run_id, reply.message
    assert attempt_status(a, "panel-1") == "failed"
    failure = (await _client_half(a))["renderFailure"]
    assert failure["message"] == "TypeError: x is null" and failure["pluginRunId"] == run_id
    assert (await plugin_view(a, AGENT, "panel-1"))["state"] == "failed"
    plugin_b = b.registry.cordis.runner.find(AGENT, "panel-1")
    assert plugin_b is not None and plugin_b.run is not None
    assert plugin_b.run.render_failure is None  # B's mirror keeps nothing: A holds it
    # One steering record, written by A (the history is shared, so B reads the same).
    texts = await seen(lambda: steered(b, AGENT), _any_render_steer, "the render steer")
    [steer] = _render_steers(texts)
    assert "TypeError: x is null\nat f" in steer
    assert _render_steers(await steered(a, AGENT)) == [steer]


async def test_a_panel_gesture_on_b_shares_the_run_a_holds_or_is_refused_naming_a(
    replicas: tuple[CordisHarness, CordisHarness],
) -> None:
    a, b = replicas
    async with PageRunner(b.channel, AGENT) as page_b:
        run_id = await _running_on_a_seen_on_b(a, b, page_b)
        # The same package: A's run, shared; nothing starts on B and A's attempt runs on.
        same = await page_b.panel_run("panel-1", "pkg-1")
        assert same.accepted and not same.started_here, same.message
        assert same.plugin_run_id == run_id
        await a.define(AGENT, HANDLER_HOST, existing="panel-1", client=CLIENT, name="Panel")
        await seen(
            lambda: plugin_view(b, AGENT, "panel-1"),
            lambda v: "pkg-2" in jsonvalue.dumps(v),
            "pkg-2 on B",
        )
        # Another package: refused, naming the registry that runs it; nothing changes.
        other = await page_b.panel_run("panel-1", "pkg-2", "update")
        assert (other.accepted, other.code) == (False, "runs-elsewhere"), other.message
        placement = a.registry.cordis.runner._placement
        assert placement is not None
        assert placement.address in other.message and run_id in other.message
        assert (activations(a), activations(b)) == (1, 0)
        assert attempt_status(a, "panel-1") == "running"
        plugin_b = b.registry.cordis.runner.find(AGENT, "panel-1")
        assert plugin_b is not None and plugin_b.run is not None
        assert plugin_b.run.run_id == run_id
        # As the refusal says: stopped from B (retracted on A), a run from B starts it on B.
        assert (await page_b.stop("panel-1")).accepted
        assert attempt_status(a, "panel-1") == "stopped"
        moved = await page_b.panel_run("panel-1", "pkg-1")
        assert moved.accepted and moved.started_here, moved.message
        assert moved.plugin_run_id != run_id
        assert (activations(a), activations(b)) == (1, 1)


MANIFEST: Any = [
    {
        "id": "Slots",
        "description": "The page's plugin slots.",
        "methods": [
            {
                "name": "listSubTree",
                "description": "The slot tree.",
                "inputSchema": {"type": "object", "properties": {}},
                "outputSchema": {
                    "type": "object",
                    "properties": {"slots": {"type": "array", "items": {"type": "string"}}},
                    "required": ["slots"],
                },
            }
        ],
    }
]
QUERY = {"platform": "client", "provider": "Slots", "method": "listSubTree"}


@pytest.fixture
async def runtime() -> AsyncIterator[str]:
    running = await start_runtime(RuntimeSettings(listen="127.0.0.1:0", pool_size=2))
    try:
        yield running.address
    finally:
        await running.stop(0)


def _settings(pg_database: str, runtime: str) -> dict[str, Any]:
    return {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "token_key": "6f" * 32,
        "cordis_activation_poll_s": 0.2,
        "runtime_targets": [runtime],
    }


async def _clients_listed(h: CordisHarness) -> list[str]:
    listed = await h.ok(AGENT, "cordis_inspect_list", {})
    return [p["id"] for p in listed["providers"] if p["platform"] == "client"]


async def _ready(a: CordisHarness, b: CordisHarness) -> None:
    await a.agent("alice", mode=BOTH)

    async def agent_on_b() -> bool:
        try:
            return not (await b.call(AGENT, "cordis_inspect_self", {})).is_error
        except grpc.aio.AioRpcError:  # NOT_FOUND until B has heard of the agent
            return False

    await seen(agent_on_b, bool, "the agent on B")


async def test_a_page_on_b_answers_a_client_half_call_of_a_program_on_a(
    make_cordis: Any, pg_database: str, runtime: str
) -> None:
    async with (
        make_cordis(**_settings(pg_database, runtime)) as a,
        make_cordis(**_settings(pg_database, runtime)) as b,
    ):
        await _ready(a, b)
        # A plugin whose host A owns (A holds its lease and runs it).
        await a.define(AGENT)
        await a.ok(
            AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}
        )
        assert activations(a) == 1
        async with PageRunner(b.channel, AGENT) as page_b:
            assert (await page_b.sync_manifest(MANIFEST)).accepted
            # A lists the manifest B's page synced (no page of the agent is attached to A).
            await seen(lambda: _clients_listed(a), lambda ids: ids == ["Slots"], "B's manifest")
            # A program on A calls the plugin's tool (its host on A) and the client half (a
            # page on B).
            code = (
                "t = await tools.clock_now({})\n"
                f"q = await tools.cordis_inspect_query({QUERY!r})\n"
                "return {'time': t['time'], 'data': q['data']}"
            )
            run = asyncio.ensure_future(program(a, AGENT, code, "p1"))
            asked = (await page_b.next_event("inspect_query")).inspect_query
            assert (asked.agent, asked.provider, asked.method) == (AGENT, "Slots", "listSubTree")
            invalid = await page_b.answer_query(asked.query_id, {"slots": "main"})
            assert (invalid.accepted, invalid.code) == (False, "invalid-output")  # checked on B
            assert not run.done()
            assert (await page_b.answer_query(asked.query_id, {"slots": ["main"]})).accepted
            value = await run
            assert value["result"] == {"time": "12:00", "data": {"slots": ["main"]}}
            page = await a.stub.ListHistory(rpb.ListHistoryRequest(agent=AGENT))
            dispatched = [r for r in page.records if r.kind == "tool/code-dispatch"]
            assert [(r.tool_name, r.is_error) for r in dispatched] == [
                ("clock_now", False),
                ("cordis_inspect_query", False),
            ]

            # The caller's cancellation reaches B's pages: the query is withdrawn there.
            call = a.stub.ExecuteToolCall(
                rpb.ExecuteToolCallRequest(
                    agent=AGENT,
                    call_id="query-cancelled",
                    tool_name="cordis_inspect_query",
                    arguments_json=jsonvalue.dumps(QUERY),
                )
            )
            asked = (await page_b.next_event("inspect_query")).inspect_query
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                async for _ in call:
                    pass
            resolved = (await page_b.next_event("inspect_query_resolved")).inspect_query_resolved
            assert (resolved.query_id, resolved.outcome) == (asked.query_id, "cancelled")
            late = await page_b.answer_query(asked.query_id, {"slots": []})
            assert (late.accepted, late.code) == (False, "query-unknown")

            # The caller's deadline goes with the query: when it passes, B's pages are told.
            timed = a.stub.ExecuteToolCall(
                rpb.ExecuteToolCallRequest(
                    agent=AGENT,
                    call_id="query-deadline",
                    tool_name="cordis_inspect_query",
                    arguments_json=jsonvalue.dumps(QUERY),
                ),
                timeout=10,
            )
            asked = (await page_b.next_event("inspect_query")).inspect_query
            with contextlib.suppress(grpc.aio.AioRpcError):  # DEADLINE_EXCEEDED, or its result
                async for _ in timed:
                    pass
            resolved = (await page_b.next_event("inspect_query_resolved")).inspect_query_resolved
            assert (resolved.query_id, resolved.outcome) == (asked.query_id, "cancelled")

            # Another agent's program on A reaches none of alice's pages.
            await a.agent("bob", mode=BOTH)
            listed = await a.ok(OTHER, "cordis_inspect_list", {})
            assert not [p for p in listed["providers"] if p["platform"] == "client"]
            foreign = await a.call(OTHER, "cordis_inspect_query", QUERY, "bob-query")
            assert foreign.is_error and foreign.error.code == "provider-missing"
            # And the peer RPC answers only registries holding the peer secret.
            stub = peer_grpc.CordisPeerServiceStub(b.channel)
            forged = peer_pb.PeerClientQueryRequest(
                agent=AGENT, provider="Slots", method="listSubTree", input_json="{}"
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.PeerClientQuery(forged)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as wrong:
                await stub.PeerClientQuery(forged, metadata=(("x-codemode-peer", "guess"),))
            assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert b.registry.cordis.client_queries._queries == {}  # nothing reached the pages


async def test_the_pages_replica_dying_fails_the_carried_call_aborted_and_recorded(
    make_cordis: Any, pg_database: str, runtime: str
) -> None:
    async with make_cordis(**_settings(pg_database, runtime)) as a:
        async with make_cordis(**_settings(pg_database, runtime)) as b:
            await _ready(a, b)
            page_b = PageRunner(b.channel, AGENT)
            await page_b.attach()
            assert (await page_b.sync_manifest(MANIFEST)).accepted
            await seen(lambda: _clients_listed(a), lambda ids: ids == ["Slots"], "B's manifest")
            query = asyncio.ensure_future(a.call(AGENT, "cordis_inspect_query", QUERY, "lost"))
            await page_b.next_event("inspect_query")
        # B is gone mid-query: the call fails ABORTED (its outcome unknown), recorded.
        await page_b.close()
        result = await query
        assert result.is_error and result.error.code == "ABORTED", result.error.message
        page = await a.stub.ListHistory(rpb.ListHistoryRequest(agent=AGENT))
        [recorded] = [r for r in page.records if r.kind == "tool/result" and r.call_id == "lost"]
        assert recorded.is_error and recorded.error_code == "ABORTED"
        # With no page anywhere any more, A lists no client provider.
        await seen(lambda: _clients_listed(a), lambda ids: ids == [], "B's pages gone")


async def test_a_carried_call_to_a_registry_the_store_says_is_gone_fails_aborted(
    make_cordis: Any, pg_database: str, runtime: str
) -> None:
    """A registry that vanished without closing its connections is noticed through the store
    (its history writer lease gone), not by waiting on it: the call fails ABORTED, and the
    query is withdrawn from the pages there if they still listen."""
    stalled = {**_settings(pg_database, runtime), "history_writer_lease_s": 600.0}
    async with (
        make_cordis(**_settings(pg_database, runtime)) as a,
        make_cordis(**stalled) as b,  # renews its writer lease only every 200 s
    ):
        await _ready(a, b)
        async with PageRunner(b.channel, AGENT) as page_b:
            assert (await page_b.sync_manifest(MANIFEST)).accepted
            await seen(lambda: _clients_listed(a), lambda ids: ids == ["Slots"], "B's manifest")
            query = asyncio.ensure_future(a.call(AGENT, "cordis_inspect_query", QUERY, "gone"))
            asked = (await page_b.next_event("inspect_query")).inspect_query
            with psycopg.connect(pg_database, autocommit=True) as conn:
                conn.execute(
                    "DELETE FROM history_writers WHERE id = %s",
                    (b.registry.cordis.client_runs.store.asker_id,),
                )
            result = await query
            assert result.is_error and result.error.code == "ABORTED", result.error.message
            assert "was lost while the query waited" in result.error.message
            resolved = (await page_b.next_event("inspect_query_resolved")).inspect_query_resolved
            assert (resolved.query_id, resolved.outcome) == (asked.query_id, "cancelled")
