"""Resource RPCs, bad input of every kind, health, reflection."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from codemode_client import unbatched
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import scope_pb2
from registry_service.domain.execution import ProgramLog
from tests.registry.conftest import CODE, Harness, echo_tool
from tests.registry.test_scopes import expect_error

INVALID = grpc.StatusCode.INVALID_ARGUMENT


async def test_pagination_walks_every_agent_once(harness: Harness) -> None:
    names = [await harness.agent(f"agent-{i:02d}") for i in range(7)]
    seen: list[str] = []
    token = ""
    while True:
        page = await harness.stub.ListAgents(rpb.ListAgentsRequest(page_size=3, page_token=token))
        seen.extend(a.name for a in page.agents)
        token = page.next_page_token
        if not token:
            break
    assert seen == names
    await expect_error(
        harness.stub.ListAgents(rpb.ListAgentsRequest(page_token="garbage")),
        INVALID,
        "INVALID_PAGE_TOKEN",
    )
    await expect_error(
        harness.stub.ListAgents(rpb.ListAgentsRequest(page_size=-1)), INVALID, "INVALID_PAGE_SIZE"
    )


async def test_pagination_walks_every_preset_once(harness: Harness) -> None:
    names = [await harness.preset(f"preset-{i:02d}") for i in range(7)]
    await harness.agent("unrelated")  # agents are another collection
    seen: list[str] = []
    pages: list[int] = []
    token = ""
    while True:
        page = await harness.stub.ListPresets(rpb.ListPresetsRequest(page_size=3, page_token=token))
        seen.extend(p.name for p in page.presets)
        pages.append(len(page.presets))
        token = page.next_page_token
        if not token:
            break
    assert seen == names and pages == [3, 3, 1]
    everything = await harness.stub.ListPresets(rpb.ListPresetsRequest())
    assert [p.name for p in everything.presets] == names and not everything.next_page_token
    await expect_error(
        harness.stub.ListPresets(rpb.ListPresetsRequest(page_token="garbage")),
        INVALID,
        "INVALID_PAGE_TOKEN",
    )
    await expect_error(
        harness.stub.ListPresets(rpb.ListPresetsRequest(page_size=-1)),
        INVALID,
        "INVALID_PAGE_SIZE",
    )


async def test_page_tokens_do_not_cross_collections(harness: Harness) -> None:
    for i in range(3):
        await harness.agent(f"agent-{i}")
        await harness.preset(f"preset-{i}")
    agents = await harness.stub.ListAgents(rpb.ListAgentsRequest(page_size=1))
    presets = await harness.stub.ListPresets(rpb.ListPresetsRequest(page_size=1))
    await expect_error(
        harness.stub.ListPresets(rpb.ListPresetsRequest(page_token=agents.next_page_token)),
        INVALID,
        "INVALID_PAGE_TOKEN",
    )
    await expect_error(
        harness.stub.ListAgents(rpb.ListAgentsRequest(page_token=presets.next_page_token)),
        INVALID,
        "INVALID_PAGE_TOKEN",
    )


async def test_preset_crud(harness: Harness) -> None:
    name = await harness.preset("p1", mode=CODE)
    got = await harness.stub.GetPreset(rpb.GetPresetRequest(name=name))
    assert got.preset.mode == CODE and got.preset.create_time.seconds > 0
    listed = await harness.stub.ListPresets(rpb.ListPresetsRequest())
    assert [p.name for p in listed.presets] == [name]
    await harness.stub.DeletePreset(rpb.DeletePresetRequest(name=name))
    await expect_error(
        harness.stub.GetPreset(rpb.GetPresetRequest(name=name)),
        grpc.StatusCode.NOT_FOUND,
        "PRESET_NOT_FOUND",
    )


@pytest.mark.parametrize(
    ("call", "code", "reason"),
    [
        (
            lambda s: s.CreateAgent(rpb.CreateAgentRequest(agent_id="Bad_Id")),
            INVALID,
            "INVALID_RESOURCE_ID",
        ),
        (
            lambda s: s.CreateAgent(
                rpb.CreateAgentRequest(agent_id="a", agent=scope_pb2.Agent(preset="presets/none"))
            ),
            grpc.StatusCode.NOT_FOUND,
            "PRESET_NOT_FOUND",
        ),
        (
            lambda s: s.CreateAgent(
                rpb.CreateAgentRequest(agent_id="a", agent=scope_pb2.Agent(preset="agents/x"))
            ),
            INVALID,
            "INVALID_RESOURCE_NAME",
        ),
        (
            lambda s: s.CreateAgent(
                rpb.CreateAgentRequest(
                    agent_id="a",
                    agent=scope_pb2.Agent(mode=scope_pb2.PresentationMode.ValueType(9)),
                )
            ),
            INVALID,
            "INVALID_MODE",
        ),
        (
            lambda s: s.GetAgent(rpb.GetAgentRequest(name="agents/missing")),
            grpc.StatusCode.NOT_FOUND,
            "AGENT_NOT_FOUND",
        ),
        (
            lambda s: s.GetAgent(rpb.GetAgentRequest(name="presets/x")),
            INVALID,
            "INVALID_RESOURCE_NAME",
        ),
        (
            lambda s: s.DeleteAgent(rpb.DeleteAgentRequest(name="agents/missing")),
            grpc.StatusCode.NOT_FOUND,
            "AGENT_NOT_FOUND",
        ),
        (
            lambda s: s.ListVisibleTools(rpb.ListVisibleToolsRequest(scope="nonsense")),
            INVALID,
            "INVALID_RESOURCE_NAME",
        ),
        (
            lambda s: s.SetPresentationMode(rpb.SetPresentationModeRequest(scope="agents/x")),
            INVALID,
            "INVALID_MODE",
        ),
    ],
)
async def test_bad_resource_requests(
    harness: Harness, call: Any, code: grpc.StatusCode, reason: str
) -> None:
    await expect_error(call(harness.stub), code, reason)
    assert (await harness.stub.ListAgents(rpb.ListAgentsRequest())).agents == []


async def test_duplicate_agent(harness: Harness) -> None:
    await harness.agent("a")
    await expect_error(
        harness.stub.CreateAgent(rpb.CreateAgentRequest(agent_id="a")),
        grpc.StatusCode.ALREADY_EXISTS,
        "AGENT_EXISTS",
    )


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ("{not json", "INVALID_JSON"),
        ('{"x": NaN}', "INVALID_JSON"),
        ('{"x": Infinity}', "INVALID_JSON"),
        ('{"x": -0}', "INVALID_JSON"),
        ('{"x": 1e999}', "INVALID_JSON"),
        ('{"x": 1, "x": 2}', "INVALID_JSON"),
    ],
)
async def test_non_lossless_arguments_are_rejected(
    harness: Harness, arguments: str, reason: str
) -> None:
    echo_tool(harness.registry, "t")
    stream = harness.stub.ExecuteToolCall(
        rpb.ExecuteToolCallRequest(call_id="c", tool_name="t", arguments_json=arguments)
    )
    await expect_error(stream.read(), INVALID, reason)


async def test_big_integers_round_trip_exactly(harness: Harness) -> None:
    echo_tool(harness.registry, "t")
    big = 2**53 + 1
    _, result = await harness.execute("t", raw=f'{{"n": {big}, "m": -{10**30}}}')
    assert result.value_json == f'{{"echo":{{"n":{big},"m":-{10**30}}}}}'


async def test_deeply_nested_arguments_do_not_crash(harness: Harness) -> None:
    echo_tool(harness.registry, "t")
    depth = 100_000
    raw = '{"a":' + "[" * depth + "]" * depth + "}"
    _, result = await harness.execute("t", raw=raw)
    assert not result.is_error
    assert result.value_json == '{"echo":' + raw + "}"


@pytest.mark.parametrize(
    ("request_kwargs", "reason"),
    [
        ({"call_id": "", "tool_name": "t"}, "MISSING_CALL_ID"),
        ({"call_id": "c", "tool_name": ""}, "MISSING_TOOL_NAME"),
        ({"call_id": "c", "tool_name": "t", "agent": "agents/ghost"}, "AGENT_NOT_FOUND"),
        ({"call_id": "c", "tool_name": "t", "progress_events": 99}, "INVALID_PROGRESS_EVENTS"),
    ],
)
async def test_bad_execute_requests(
    harness: Harness, request_kwargs: dict[str, Any], reason: str
) -> None:
    echo_tool(harness.registry, "t")
    stream = harness.stub.ExecuteToolCall(rpb.ExecuteToolCallRequest(**request_kwargs))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stream.read()
    from tests.registry.test_scopes import reason_of

    assert reason_of(caught.value) == reason
    if reason != "AGENT_NOT_FOUND":
        assert caught.value.code() == INVALID
    _, result = await harness.execute("t", call_id="c")  # nothing was left behind
    assert not result.is_error


@pytest.mark.parametrize(
    ("progress", "kinds"),
    [
        (rpb.PROGRESS_EVENTS_UNSPECIFIED, ["started"]),
        (rpb.PROGRESS_EVENTS_ALL, ["started"]),
        (rpb.PROGRESS_EVENTS_APPROVALS, []),
        (rpb.PROGRESS_EVENTS_NONE, []),
    ],
)
async def test_progress_events_choose_what_precedes_the_result(
    harness: Harness, progress: rpb.ProgressEvents.ValueType, kinds: list[str]
) -> None:
    echo_tool(harness.registry, "t")
    events, result = await harness.execute("t", {"x": 1}, progress=progress)
    assert [e.WhichOneof("event") for e in events] == kinds
    assert result.value_json == '{"echo":{"x":1}}'


def _chatty_tool(harness: Harness) -> None:
    """A tool that emits three progress events in one step, then answers."""

    async def body(invocation: Any) -> Any:
        for text in ("a", "b", "c"):
            invocation.emit(ProgramLog(text))
        return "done"

    harness.registry.register_tool("chatty", body, description="emits three logs")


@pytest.mark.parametrize("batch", [False, True])
async def test_batch_progress_sends_events_that_are_ready_together_as_one_message(
    harness: Harness, batch: bool
) -> None:
    _chatty_tool(harness)
    request = rpb.ExecuteToolCallRequest(call_id="c", tool_name="chatty", batch_progress=batch)
    messages = [m async for m in harness.stub.ExecuteToolCall(request)]
    assert messages[-1].WhichOneof("event") == "result"
    assert messages[-1].result.value_json == '"done"'
    kinds = [m.WhichOneof("event") for m in messages[:-1]]
    flat = [e for m in messages for e in unbatched(m)]
    # The same events in the same order either way; the result is never inside a batch.
    assert [e.WhichOneof("event") for e in flat] == ["started", "log", "log", "log", "result"]
    assert [e.log.text for e in flat if e.WhichOneof("event") == "log"] == ["a", "b", "c"]
    if batch:  # the three logs were queued in one step, so they travel in one message
        batches = [m.batch for m in messages if m.WhichOneof("event") == "batch"]
        assert any([e.log.text for e in b.events][-3:] == ["a", "b", "c"] for b in batches)
        assert all(len(b.events) >= 2 for b in batches)
        inner = [e.WhichOneof("event") for b in batches for e in b.events]
        assert "batch" not in inner and "result" not in inner
    else:
        assert kinds == ["started", "log", "log", "log"]


async def test_oversize_message_is_refused(make_registry: Any) -> None:
    async with make_registry(max_message_bytes=64 * 1024) as h:
        echo_tool(h.registry, "t")
        stream = h.stub.ExecuteToolCall(
            rpb.ExecuteToolCallRequest(
                call_id="c", tool_name="t", arguments_json='"' + "x" * 100_000 + '"'
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stream.read()
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_port_in_use_is_refused(harness: Harness, make_registry: Any) -> None:
    with pytest.raises(OSError, match="cannot bind registry"):
        async with make_registry(listen=harness.running.address):
            pass


async def test_health_and_reflection(harness: Harness) -> None:
    health = health_pb2_grpc.HealthStub(harness.channel)
    response = await health.Check(
        health_pb2.HealthCheckRequest(service="codemode.registry.v1.RegistryService")
    )
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(harness.channel)
    call = reflection.ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    answer = await call.read()
    names = {s.name for s in answer.list_services_response.service}
    assert "codemode.registry.v1.RegistryService" in names
    assert "codemode.registry.v1.PageRunnerService" in names
    call.cancel()


async def test_a_result_too_large_to_send_is_a_clear_error(make_registry: Any) -> None:
    async with make_registry(max_message_bytes=64 * 1024) as h:

        async def big(invocation: Any) -> Any:
            return "x" * 40_000  # sent twice (value and rendered text): over 64 KiB

        async def fits(invocation: Any) -> Any:
            return "x" * 20_000

        h.registry.register_tool("big", big)
        h.registry.register_tool("fits", fits)
        _, result = await h.execute("big")
        assert result.is_error and result.error.code == "RESULT_TOO_LARGE"
        assert "max_message_bytes (65536)" in result.error.message
        _, ok = await h.execute("fits")
        assert not ok.is_error and len(ok.value_json) == 20_002
