"""Two registries on one real PostgreSQL, over gRPC: a catalog change made on one (presets,
agents with their preset, mode, language and self-modification, restrictions, deletes, a
deleted and re-created name) is seen on the other, through LISTEN/NOTIFY; a change the other
missed (its LISTEN connection lost) is there once it reconnects. Every wait is a latch polled
with a generous bound; the measured propagation time is printed, never asserted."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import psycopg
import pytest

from codemode_client import ToolProvider
from codemode_wire.api.registry.v1 import presentation_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from tests.registry.conftest import BOTH, CODE, Harness, echo_tool

T = TypeVar("T")
_POLLS = 1500  # x 20 ms: a generous bound on a loaded machine (the target is within a second)


async def seen(probe: Callable[[], Awaitable[T]], until: Callable[[T], bool], what: str) -> T:
    """Polls `probe` until `until` holds for its value (a latch); prints how long it took."""
    started = time.monotonic()
    value: T | None = None
    for _ in range(_POLLS):
        with contextlib.suppress(grpc.aio.AioRpcError):
            value = await probe()
            if until(value):
                print(f"{what}: seen on the other replica after {time.monotonic() - started:.3f} s")
                return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what}: not seen on the other replica; last: {value!r}")


async def code_of(call: Awaitable[Any]) -> grpc.StatusCode | None:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return None


@pytest.fixture
async def replicas(make_registry: Any, pg_database: str) -> AsyncIterator[tuple[Harness, Harness]]:
    settings = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "runtime_languages": ["python", "typescript"],
    }
    async with make_registry(**settings) as a, make_registry(**settings) as b:
        for h in (a, b):  # a provider connected to both replicas
            echo_tool(h.registry, "read")
            echo_tool(h.registry, "write")
            await _listening(h)
        yield a, b


async def _listening(h: Harness) -> None:
    """Once the replica's LISTEN holds it reloads everything (for what it missed before):
    after that, a row written without a notification stays unheard of (the tests' "not heard
    yet")."""
    follower = h.registry.follower
    assert follower is not None
    for _ in range(_POLLS):
        if follower.reloads:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the replica never followed the catalog")


async def agent_on(h: Harness, name: str) -> scope_pb2.Agent:
    agent: scope_pb2.Agent = (await h.stub.GetAgent(rpb.GetAgentRequest(name=name))).agent
    return agent


async def visible_on(h: Harness, scope: str) -> rpb.ListVisibleToolsResponse:
    response: rpb.ListVisibleToolsResponse = await h.stub.ListVisibleTools(
        rpb.ListVisibleToolsRequest(scope=scope)
    )
    return response


def names(response: rpb.ListVisibleToolsResponse) -> list[str]:
    return [tool.name for tool in response.tools]


async def test_catalog_changes_on_one_replica_are_seen_on_the_other(
    replicas: tuple[Harness, Harness],
) -> None:
    a, b = replicas
    await a.stub.CreatePreset(
        rpb.CreatePresetRequest(preset_id="team", preset=scope_pb2.Preset(mode=BOTH))
    )
    await seen(
        lambda: b.stub.GetPreset(rpb.GetPresetRequest(name="presets/team")),
        lambda r: r.preset.name == "presets/team",
        "a created preset",
    )
    made = (
        await a.stub.CreateAgent(
            rpb.CreateAgentRequest(
                agent_id="coder",
                agent=scope_pb2.Agent(
                    preset="presets/team", code_language="typescript", self_modification=True
                ),
            )
        )
    ).agent
    there = await seen(
        lambda: agent_on(b, "agents/coder"), lambda r: bool(r.agent_id), "a created agent"
    )
    assert (there.agent_id, there.preset, there.code_language) == (
        made.agent_id,
        "presets/team",
        "typescript",
    )
    assert there.self_modification and there.effective_mode == BOTH

    # A tool a provider registered into the agent's scope on B (revoked with the scope below).
    echo_tool(b.registry, "own", scope="agents/coder")
    await a.stub.SetPresentationMode(
        rpb.SetPresentationModeRequest(scope="agents/coder", mode=CODE)
    )
    await seen(lambda: visible_on(b, "agents/coder"), lambda r: r.effective_mode == CODE, "a mode")

    added = await a.stub.AddRestriction(
        rpb.AddRestrictionRequest(scope="agents/coder", deny=["write"])
    )
    listed = await seen(
        lambda: visible_on(b, "agents/coder"),
        lambda r: "write" not in names(r),
        "a restriction",
    )
    assert {"read", "own", "run_code"} <= set(names(listed))
    sdk = await b.stub.GetSdk(ppb.GetSdkRequest(scope="agents/coder"))
    assert sdk.language == "typescript" and "read" in sdk.text and "write" not in sdk.text

    await a.stub.RemoveRestriction(
        rpb.RemoveRestrictionRequest(scope="agents/coder", restriction_id=added.restriction_id)
    )
    await seen(lambda: visible_on(b, "agents/coder"), lambda r: "write" in names(r), "a removal")

    # Deleted and re-created on A: a new identity on both, and B's old layer (its tool) gone.
    await a.stub.DeleteAgent(rpb.DeleteAgentRequest(name="agents/coder"))
    assert (
        await seen(
            lambda: code_of(b.stub.GetAgent(rpb.GetAgentRequest(name="agents/coder"))),
            lambda code: code is grpc.StatusCode.NOT_FOUND,
            "a deleted agent",
        )
        is grpc.StatusCode.NOT_FOUND
    )
    again = (
        await a.stub.CreateAgent(
            rpb.CreateAgentRequest(agent_id="coder", agent=scope_pb2.Agent(preset="presets/team"))
        )
    ).agent
    assert again.agent_id != made.agent_id
    renewed = await seen(
        lambda: agent_on(b, "agents/coder"),
        lambda r: r.agent_id == again.agent_id,
        "a re-created agent",
    )
    assert renewed.code_language == "" and not renewed.HasField("self_modification")
    assert "own" not in names(await visible_on(b, "agents/coder"))

    # A preset deleted with force on A: gone on B, its agent unparented there too.
    await a.stub.DeletePreset(rpb.DeletePresetRequest(name="presets/team", force=True))
    await seen(lambda: agent_on(b, "agents/coder"), lambda r: r.preset == "", "an unparented agent")
    assert (
        await code_of(b.stub.GetPreset(rpb.GetPresetRequest(name="presets/team")))
        is grpc.StatusCode.NOT_FOUND
    )
    # And the other way round: B's changes reach A.
    await b.stub.CreateAgent(rpb.CreateAgentRequest(agent_id="back", agent=scope_pb2.Agent()))
    await seen(lambda: agent_on(a, "agents/back"), lambda r: bool(r.agent_id), "B's agent")


async def test_a_change_missed_while_not_listening_is_reloaded_on_reconnect(
    replicas: tuple[Harness, Harness], pg_database: str
) -> None:
    """A row no notification announced (written while B's LISTEN connection is gone, or by
    hand) reaches B when its LISTEN connection comes back: a reconnect reloads everything."""
    a, b = replicas
    await a.stub.CreateAgent(rpb.CreateAgentRequest(agent_id="known", agent=scope_pb2.Agent()))
    await seen(lambda: agent_on(b, "agents/known"), lambda r: bool(r.agent_id), "an agent")
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(  # no NOTIFY: only a full reload finds it
            "INSERT INTO catalog_scopes (name, agent_id, preset, create_time)"
            " VALUES ('agents/silent', 'f00d', '', 1.0)"
        )
        conn.execute("DELETE FROM catalog_scopes WHERE name = 'agents/known'")
        # Every replica's LISTEN connection is cut; each reconnects and reloads.
        ended = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
        ).fetchall()
    assert ended, "no LISTEN connection found"
    silent = await seen(
        lambda: agent_on(b, "agents/silent"), lambda r: r.agent_id == "f00d", "an unannounced row"
    )
    assert silent.name == "agents/silent"
    assert (
        await code_of(b.stub.GetAgent(rpb.GetAgentRequest(name="agents/known")))
        is grpc.StatusCode.NOT_FOUND
    )


def _sql(dsn: str, statement: str, *params: object) -> None:
    """A change another registry committed whose notification has not arrived (none is sent)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.encode(), params)


async def test_a_change_on_a_replica_that_had_not_heard_answers_as_the_store_is(
    replicas: tuple[Harness, Harness], pg_database: str
) -> None:
    """B acts on a scope another registry changed a moment ago (the store holds it, B has not
    heard): the store refuses B's write, B reloads the scope and answers from what is stored,
    instead of overwriting the other registry's change."""
    _, b = replicas
    # Created elsewhere: B's create of the name is ALREADY_EXISTS, and B now knows that agent.
    _sql(
        pg_database,
        "INSERT INTO catalog_scopes (name, agent_id, preset, create_time)"
        " VALUES ('agents/twin', 'a1', '', 1.0)",
    )
    assert (
        await code_of(b.stub.CreateAgent(rpb.CreateAgentRequest(agent_id="twin")))
        is grpc.StatusCode.ALREADY_EXISTS
    )
    assert (await agent_on(b, "agents/twin")).agent_id == "a1"

    # Deleted and re-created elsewhere: B's mode change applies to the agent as it now is.
    made = (await b.stub.CreateAgent(rpb.CreateAgentRequest(agent_id="moved"))).agent
    _sql(pg_database, "UPDATE catalog_scopes SET agent_id = 'b2' WHERE name = 'agents/moved'")
    await b.stub.SetPresentationMode(
        rpb.SetPresentationModeRequest(scope="agents/moved", mode=CODE)
    )
    now = await agent_on(b, "agents/moved")
    assert (now.agent_id, now.mode) == ("b2", CODE) and made.agent_id != "b2"

    # Deleted elsewhere: B's delete, and B's restriction, find no agent.
    for agent_id in ("gone", "fenced"):
        await b.stub.CreateAgent(rpb.CreateAgentRequest(agent_id=agent_id))
        _sql(pg_database, "DELETE FROM catalog_scopes WHERE name = %s", f"agents/{agent_id}")
    assert (
        await code_of(b.stub.DeleteAgent(rpb.DeleteAgentRequest(name="agents/gone")))
        is grpc.StatusCode.NOT_FOUND
    )
    assert (
        await code_of(
            b.stub.AddRestriction(rpb.AddRestrictionRequest(scope="agents/fenced", deny=["read"]))
        )
        is grpc.StatusCode.NOT_FOUND
    )
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT count(*) FROM catalog_restrictions").fetchone() == (0,)


async def test_two_replicas_creating_one_name_at_once_agree_on_one_agent(
    replicas: tuple[Harness, Harness],
) -> None:
    a, b = replicas
    for n in range(10):
        request = rpb.CreateAgentRequest(agent_id=f"race-{n}")
        outcomes = await asyncio.gather(
            a.stub.CreateAgent(request), b.stub.CreateAgent(request), return_exceptions=True
        )
        made = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
        assert len(made) == 1 and len(refused) == 1, outcomes
        assert refused[0].code() is grpc.StatusCode.ALREADY_EXISTS
        winner: str = made[0].agent.agent_id
        for h in (a, b):
            await seen(
                functools.partial(agent_on, h, f"agents/race-{n}"),
                functools.partial(_is_agent, winner),
                "the one agent",
            )


def _is_agent(agent_id: str, agent: scope_pb2.Agent) -> bool:
    return bool(agent.agent_id == agent_id)


async def test_a_reloaded_agent_brings_the_preset_this_replica_had_missed(
    replicas: tuple[Harness, Harness], pg_database: str
) -> None:
    """A notification names an agent whose preset B never heard of (made while B was not
    listening): B reads the preset along with the agent instead of unparenting it."""
    _, b = replicas
    _sql(
        pg_database,
        "INSERT INTO catalog_scopes (name, agent_id, preset, mode, create_time) VALUES"
        " ('presets/quiet', '', '', 'code', 1.0),"
        " ('agents/child', 'c3', 'presets/quiet', NULL, 2.0)",
    )
    _sql(
        pg_database, "SELECT pg_notify('codemode_catalog', %s)", '{"w": "x", "s": ["agents/child"]}'
    )
    child = await seen(lambda: agent_on(b, "agents/child"), lambda r: bool(r.agent_id), "a child")
    assert (child.preset, child.effective_mode) == ("presets/quiet", CODE)


async def test_a_provider_registers_into_an_agent_made_elsewhere_a_moment_ago(
    replicas: tuple[Harness, Harness], pg_database: str
) -> None:
    """The agent is stored, B has not heard yet: B reads it when a provider registers into it,
    instead of refusing the registration (AGENT_NOT_FOUND ends a provider's stream)."""
    _, b = replicas
    _sql(
        pg_database,
        "INSERT INTO catalog_scopes (name, agent_id, preset, create_time)"
        " VALUES ('agents/fresh', 'd4', '', 1.0)",
    )
    provider = ToolProvider(b.channel, "fresh")

    @provider.tool(scope="agents/fresh")
    async def lookup(args: Any, ctx: Any) -> Any:
        return {}

    async with provider:
        assert "lookup" in names(await visible_on(b, "agents/fresh"))
    assert (await agent_on(b, "agents/fresh")).agent_id == "d4"
