"""The durable catalog through gRPC: presets, agents, modes, languages, self-modification and
restrictions declared over the API are there after a registry restart on the same database;
settings-declared scopes merge over the stored ones; each agent has a stable id that keys its
history (a re-created name starts empty, the old history stays readable by id, or is deleted
with the agent when configured); a change the store cannot write answers with the store's error
and changes nothing (a real full disk). The restart tests run on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from tests.registry.conftest import BOTH, CODE, NATIVE, Harness, echo_tool, error_info_of
from tests.registry.history.disk import require, small_disk


async def create_agent(h: Harness, agent_id: str, **fields: Any) -> scope_pb2.Agent:
    response = await h.stub.CreateAgent(
        rpb.CreateAgentRequest(agent_id=agent_id, agent=scope_pb2.Agent(**fields))
    )
    agent: scope_pb2.Agent = response.agent
    return agent


async def get_agent(h: Harness, name: str) -> scope_pb2.Agent:
    agent: scope_pb2.Agent = (await h.stub.GetAgent(rpb.GetAgentRequest(name=name))).agent
    return agent


async def failure(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def history(h: Harness, agent: str = "", agent_id: str = "") -> list[tuple[str, str]]:
    page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, agent_id=agent_id))
    return [(r.call_id, r.kind) for r in page.records]


async def test_api_declared_scopes_survive_a_restart(
    make_registry: Any, database: dict[str, Any]
) -> None:
    async with make_registry(**database) as h:
        echo_tool(h.registry, "read")
        echo_tool(h.registry, "write")
        await h.stub.CreatePreset(
            rpb.CreatePresetRequest(
                preset_id="team", preset=scope_pb2.Preset(mode=BOTH, code_language="python")
            )
        )
        made = await create_agent(
            h,
            "coder",
            preset="presets/team",
            mode=CODE,
            code_language="typescript",
            self_modification=True,
        )
        assert len(made.agent_id) == 32
        plain = await create_agent(h, "plain")
        await h.stub.SetPresentationMode(
            rpb.SetPresentationModeRequest(scope="agents/plain", mode=NATIVE)
        )
        restricted = await h.stub.AddRestriction(
            rpb.AddRestrictionRequest(scope="agents/coder", deny=["write"])
        )
        # A restriction removed again stays removed.
        gone = await h.stub.AddRestriction(
            rpb.AddRestrictionRequest(scope="agents/plain", deny=["read"])
        )
        await h.stub.RemoveRestriction(
            rpb.RemoveRestrictionRequest(scope="agents/plain", restriction_id=gone.restriction_id)
        )
        before = (await h.stub.ListAgents(rpb.ListAgentsRequest())).agents

    async with make_registry(**database) as h:
        # Tools are not stored: their provider brings them back (here, in-process).
        echo_tool(h.registry, "read")
        echo_tool(h.registry, "write")
        after = (await h.stub.ListAgents(rpb.ListAgentsRequest())).agents
        assert list(after) == list(before)
        coder = await get_agent(h, "agents/coder")
        assert coder == made
        assert (coder.preset, coder.mode, coder.code_language) == (
            "presets/team",
            CODE,
            "typescript",
        )
        assert coder.HasField("self_modification") and coder.self_modification
        assert coder.effective_self_modification
        assert (await get_agent(h, "agents/plain")).mode == NATIVE
        assert (await get_agent(h, "agents/plain")).agent_id == plain.agent_id
        preset = await h.stub.GetPreset(rpb.GetPresetRequest(name="presets/team"))
        assert (preset.preset.mode, preset.preset.code_language) == (BOTH, "python")
        # The restriction is in force, and known by its id; the removed one is not.
        assert "write" not in await h.visible("agents/coder")
        assert {"read", "write"} <= set(await h.visible("agents/plain"))
        # A new restriction does not reuse a stored id.
        newer = await h.stub.AddRestriction(
            rpb.AddRestrictionRequest(scope="agents/plain", deny=["write"])
        )
        assert newer.restriction_id not in {restricted.restriction_id, gone.restriction_id}
        await h.stub.RemoveRestriction(
            rpb.RemoveRestrictionRequest(
                scope="agents/coder", restriction_id=restricted.restriction_id
            )
        )
        assert "write" in await h.visible("agents/coder")
        # Deleting the preset (forced) unparents its agent, durably too.
        await h.stub.DeletePreset(rpb.DeletePresetRequest(name="presets/team", force=True))

    async with make_registry(**database) as h:
        coder = await get_agent(h, "agents/coder")
        assert (coder.preset, coder.agent_id) == ("", made.agent_id)
        error = await failure(h.stub.GetPreset(rpb.GetPresetRequest(name="presets/team")))
        assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_settings_merge_over_the_stored_scopes(
    make_registry: Any, database: dict[str, Any]
) -> None:
    presets = [{"id": "team", "mode": "code"}]
    agents = [{"id": "declared", "preset": "team"}]
    async with make_registry(**database, presets=presets, agents=agents) as h:
        first = await get_agent(h, "agents/declared")
        # Declared over the API on a settings-declared agent: a mode its settings leave open.
        await h.stub.SetPresentationMode(
            rpb.SetPresentationModeRequest(scope="agents/declared", mode=BOTH)
        )
    # The settings now declare a language, and no parent.
    agents = [{"id": "declared", "code_language": "typescript"}]
    async with make_registry(**database, presets=presets, agents=agents) as h:
        again = await get_agent(h, "agents/declared")
        assert again.agent_id == first.agent_id  # the stored identity is kept
        assert again.mode == BOTH  # the stored declaration where the settings give none
        assert (again.preset, again.code_language) == ("", "typescript")  # the settings win
    async with make_registry(**database) as h:
        # No longer in the settings: the stored agent stays, as the settings last left it.
        kept = await get_agent(h, "agents/declared")
        assert (kept.agent_id, kept.code_language, kept.mode) == (
            first.agent_id,
            "typescript",
            BOTH,
        )


async def test_a_recreated_name_starts_an_empty_history(
    make_registry: Any, database: dict[str, Any]
) -> None:
    async with make_registry(**database) as h:
        echo_tool(h.registry)
        old = await create_agent(h, "coder")
        await h.execute("echo", {"n": 1}, agent="agents/coder", call_id="old-call")
        assert await history(h, "agents/coder") == [
            ("old-call", "tool/call"),
            ("old-call", "tool/result"),
        ]
        await h.stub.DeleteAgent(rpb.DeleteAgentRequest(name="agents/coder"))
        new = await create_agent(h, "coder")
        assert new.agent_id != old.agent_id
        assert await history(h, "agents/coder") == []
        # The watch of the new agent starts with its own first record, not the old ones.
        watch = h.stub.WatchHistory(rpb.WatchHistoryRequest(agent="agents/coder"))
        first = asyncio.ensure_future(watch.read())
        await h.execute("echo", {"n": 2}, agent="agents/coder", call_id="new-call")
        record = (await asyncio.wait_for(first, 30)).record
        assert (record.call_id, record.kind, record.agent_id) == (
            "new-call",
            "tool/call",
            new.agent_id,
        )
        watch.cancel()
        # The old history stays readable by id, for operators.
        assert await history(h, agent_id=old.agent_id) == [
            ("old-call", "tool/call"),
            ("old-call", "tool/result"),
        ]
        page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent_id=old.agent_id))
        result_seq = page.records[-1].seq  # (seq is the store's, shared with other histories)
        content = await h.stub.GetRecordContent(
            rpb.GetRecordContentRequest(agent_id=old.agent_id, seq=result_seq)
        )
        assert content.content
        # Both given: they must agree.
        error = await failure(
            h.stub.ListHistory(rpb.ListHistoryRequest(agent="agents/coder", agent_id=old.agent_id))
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info_of(error)
        assert info is not None and info.reason == "AGENT_ID_MISMATCH"
    async with make_registry(**database) as h:  # and across a restart
        assert (await get_agent(h, "agents/coder")).agent_id == new.agent_id
        assert await history(h, "agents/coder") == [
            ("new-call", "tool/call"),
            ("new-call", "tool/result"),
        ]
        assert len(await history(h, agent_id=old.agent_id)) == 2


async def test_history_is_deleted_with_its_agent_when_configured(make_registry: Any) -> None:
    async with make_registry(delete_history_with_agent=True) as h:
        echo_tool(h.registry)
        old = await create_agent(h, "coder")
        kept = await create_agent(h, "other")
        await h.execute("echo", agent="agents/coder", call_id="c1")
        await h.execute("echo", agent="agents/other", call_id="c1")
        await h.stub.DeleteAgent(rpb.DeleteAgentRequest(name="agents/coder"))
        assert await history(h, agent_id=old.agent_id) == []
        assert len(await history(h, agent_id=kept.agent_id)) == 2


async def test_a_change_the_store_cannot_write_fails_and_changes_nothing(
    make_registry: Any, tmp_path: Path
) -> None:
    with small_disk(tmp_path / "disk") as maybe_disk:
        disk = require(maybe_disk)
        db = str(disk.root / "history.sqlite3")
        async with make_registry(history_path=db) as h:
            echo_tool(h.registry, "read")
            await h.preset("team")
            kept = await create_agent(h, "kept", preset="presets/team")
            disk.fill()
            attempts = [
                h.stub.CreateAgent(rpb.CreateAgentRequest(agent_id="new")),
                h.stub.CreatePreset(rpb.CreatePresetRequest(preset_id="new")),
                h.stub.SetPresentationMode(
                    rpb.SetPresentationModeRequest(scope="agents/kept", mode=CODE)
                ),
                h.stub.AddRestriction(
                    rpb.AddRestrictionRequest(scope="agents/kept", deny=["read"])
                ),
                h.stub.DeleteAgent(rpb.DeleteAgentRequest(name="agents/kept")),
                h.stub.DeletePreset(rpb.DeletePresetRequest(name="presets/team", force=True)),
            ]
            for attempt in attempts:
                error = await failure(attempt)
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
                info = error_info_of(error)
                assert info is not None and info.reason == "HISTORY_UNAVAILABLE"
            # Nothing changed in memory...
            assert await get_agent(h, "agents/kept") == kept
            assert "read" in await h.visible("agents/kept")
            for name in ("agents/new", "presets/new"):
                get = h.stub.GetAgent if name.startswith("agents/") else h.stub.GetPreset
                request = (
                    rpb.GetAgentRequest(name=name)
                    if name.startswith("agents/")
                    else rpb.GetPresetRequest(name=name)
                )
                assert (await failure(get(request))).code() == grpc.StatusCode.NOT_FOUND
            disk.free()
            # ...and the next change works once there is room again.
            await h.stub.SetPresentationMode(
                rpb.SetPresentationModeRequest(scope="agents/kept", mode=CODE)
            )
        async with make_registry(history_path=db) as h:  # nor in the store
            agents = (await h.stub.ListAgents(rpb.ListAgentsRequest())).agents
            assert [(a.name, a.preset, a.mode) for a in agents] == [
                ("agents/kept", "presets/team", CODE)
            ]
            presets = (await h.stub.ListPresets(rpb.ListPresetsRequest())).presets
            assert [p.name for p in presets] == ["presets/team"]
