"""`cordis_run` for host-only packages, through the PluginHosts seam: plan
refusals, run/update/rollback, pointers (invariant 2), one physical run with retract-then-start
and quiescence (invariant 3), dynamic tools as ordinary pipeline tools (invariant 6)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from tests.registry.conftest import result_text
from tests.registry.cordis.conftest import CLOCK, CordisHarness, clock_v2, until
from tests.registry.cordis.hosts import InProcessHosts

BROKEN = "async def apply(ctx):\n    raise RuntimeError('clock face missing')\n\nreturn apply\n"


def _hosts(h: CordisHarness) -> InProcessHosts:
    assert h.hosts is not None
    return h.hosts


async def test_host_only_runs_inside_the_call_and_its_tool_is_the_owners(
    cordis: CordisHarness,
) -> None:
    owner = await cordis.agent("owner")
    other = await cordis.agent("other")
    await cordis.define(owner)
    result = await cordis.run(owner, "clock-1", "pkg-1")
    assert not result.is_error, result.error.message
    assert result_text(result) == "clock-1/pkg-1 is running (run-1)."
    assert jsonvalue.loads(result.value_json) == {
        "status": "running",
        "pluginId": "clock-1",
        "packageId": "pkg-1",
        "pluginRunId": "run-1",
        "currentPackageId": "pkg-1",
        "host": {"status": "running", "provides": [], "waitingFor": []},
        "client": {"status": "absent", "waitingFor": []},
    }
    assert "clock_now" in await cordis.visible(owner)
    assert "clock_now" not in await cordis.visible(other)
    # Listed with its schema, called like any tool, recorded in both history layers' outer one.
    now = await cordis.ok(owner, "clock_now", {"zone": "utc"}, call_id="t1")
    assert now == {"time": "12:00", "args": {"zone": "utc"}}
    history = await cordis.stub.ListHistory(rpb.ListHistoryRequest(agent=owner, call_id="t1"))
    assert [r.kind for r in history.records] == ["tool/call", "tool/result"]
    assert (await cordis.call(other, "clock_now", {})).error.code == "UNKNOWN_TOOL"
    summary = await cordis.ok(owner, "cordis_inspect_self", {})
    assert summary["plugins"] == [
        {
            "pluginId": "clock-1",
            "name": "Clock",
            "packageCount": 1,
            "state": "running",
            "currentPackageId": "pkg-1",
            "activeRun": {"pluginRunId": "run-1", "packageId": "pkg-1"},
        }
    ]


async def test_plan_refusals(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    await cordis.define(agent, clock_v2(), existing="clock-1")  # pkg-2

    async def refused(package: str, mode: str) -> tuple[str, str]:
        result = await cordis.run(agent, "clock-1", package, mode)
        assert result.is_error
        return result.error.code, result.error.message

    assert await refused("pkg-9", "run") == (
        "package-missing",
        'plugin "clock-1" has no package "pkg-9"',
    )
    assert await refused("pkg-1", "update") == (
        "invalid-mode",
        'plugin "clock-1" has no successful version yet; start "pkg-1" with mode "run"',
    )
    assert not (await cordis.run(agent, "clock-1", "pkg-1")).is_error
    assert await refused("pkg-1", "update") == (
        "invalid-mode",
        'package "pkg-1" is already current; use mode "run"',
    )
    assert await refused("pkg-2", "run") == (
        "invalid-mode",
        'package "pkg-2" differs from current "pkg-1"; use mode "update"',
    )
    # Refusals mint no attempt and move nothing.
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    assert plugin["activeRun"] == {"pluginRunId": "run-1", "packageId": "pkg-1"}
    assert "nextPackageId" not in plugin


async def test_a_start_in_flight_refuses_a_second_one(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    hosts = _hosts(cordis)
    hosts.activation_gate = asyncio.Event()
    first = asyncio.ensure_future(cordis.run(agent, "clock-1", "pkg-1"))
    await until(lambda: bool(hosts.log), "the activation")
    second = await cordis.call(
        agent, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}, "c2"
    )
    assert (second.error.code, second.error.message) == (
        "transition-in-flight",
        'plugin "clock-1" is already starting',
    )
    state = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"}, "c3")
    assert state["state"] == "client-pending"  # starting-host reads as client-pending
    assert state["nextPackageId"] == "pkg-1"
    hosts.activation_gate.set()
    assert not (await first).is_error
    assert hosts.max_live_per_plugin["clock-1"] == 1


async def test_failed_update_keeps_current_sets_next_and_rollback_clears_it(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    await cordis.define(agent, BROKEN, existing="clock-1", name="Broken clock")  # pkg-2
    assert not (await cordis.run(agent, "clock-1", "pkg-1")).is_error
    failed = await cordis.run(agent, "clock-1", "pkg-2", "update")
    assert failed.is_error
    assert (failed.error.code, failed.error.message) == (
        "host-half-failed",
        "RuntimeError: clock face missing",
    )
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    assert plugin["currentPackageId"] == "pkg-1"
    assert plugin["nextPackageId"] == "pkg-2"
    assert plugin["state"] == "failed"
    assert "activeRun" not in plugin  # the old run is not restarted
    assert "clock_now" not in await cordis.visible(agent)
    [current, target] = plugin["packages"]
    assert (current["isCurrent"], current["isNext"]) == (True, False)
    assert (target["isCurrent"], target["isNext"]) == (False, True)
    view = await cordis.ok(
        agent, "cordis_inspect_self", {"pluginId": "clock-1", "packageId": "pkg-2"}
    )
    assert view["runtime"]["host"]["status"] == "failed"
    assert view["runtime"]["host"]["error"] == {
        "phase": "host-apply",
        "message": "RuntimeError: clock face missing",
        "pluginId": "clock-1",
        "packageId": "pkg-2",
        "pluginRunId": "run-2",
    }
    # Rollback: run the current package again; next is cleared, the tool is back.
    rolled = await cordis.run(agent, "clock-1", "pkg-1", "run")
    rolled_value: Any = jsonvalue.loads(rolled.value_json)
    assert rolled_value["pluginRunId"] == "run-3"
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    assert plugin["currentPackageId"] == "pkg-1"
    assert "nextPackageId" not in plugin
    assert "clock_now" in await cordis.visible(agent)


@pytest.mark.parametrize(
    ("source", "phase", "message"),
    [
        ("x = 1", "host-load", "the Host half returned `None` — did you forget `return`?"),
        (
            "return 42",
            "host-load",
            "the Host half must return a Plugin function or an object with apply(ctx)",
        ),
    ],
)
async def test_load_failures_carry_their_phase(
    cordis: CordisHarness, source: str, phase: str, message: str
) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent, source)
    result = await cordis.run(agent, "clock-1", "pkg-1")
    assert result.error.message == message
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    assert plugin["state"] == "failed" and "currentPackageId" not in plugin
    assert plugin["nextPackageId"] == "pkg-1"
    view = await cordis.ok(
        agent, "cordis_inspect_self", {"pluginId": "clock-1", "packageId": "pkg-1"}
    )
    assert view["runtime"]["host"]["error"]["phase"] == phase


async def test_update_retracts_the_old_run_to_quiescence_before_starting(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    slow = CLOCK.replace(
        'probe.seen.append("now")', 'probe.seen.append("now")\n    await probe.gate("g").wait()'
    )
    await cordis.define(agent, slow)
    await cordis.define(agent, clock_v2(), existing="clock-1")
    await cordis.run(agent, "clock-1", "pkg-1")
    hosts = _hosts(cordis)
    in_flight = asyncio.ensure_future(cordis.call(agent, "clock_now", {}, "slow-call"))
    await until(lambda: "now" in hosts.probe.seen, "the call")
    updated = await cordis.run(agent, "clock-1", "pkg-2", "update")
    assert not updated.is_error, updated.error.message
    settled = await in_flight
    assert settled.is_error  # settled by the retract, never left hanging
    log = hosts.log
    order = [
        ("retract-start", "run-1"),
        ("call-cancelled", "run-1", "clock_now"),
        ("call-settled", "run-1", "clock_now"),
        ("dispose", "run-1", "clock"),
        ("retracted", "run-1"),
        ("activate", "run-2", "pkg-2"),
        ("started", "run-2"),
    ]
    assert [log.index(step) for step in order] == sorted(log.index(step) for step in order)
    assert log.index(("retracted", "run-1")) < log.index(("activate", "run-2", "pkg-2"))
    assert hosts.max_live_per_plugin["clock-1"] == 1
    assert await cordis.ok(agent, "clock_now", {}) == {"time": "v2", "args": {}}
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    assert plugin["currentPackageId"] == "pkg-2" and "nextPackageId" not in plugin


async def test_stop_is_idempotent_keeps_versions_and_awaits_quiescence(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    await cordis.run(agent, "clock-1", "pkg-1")
    stopped = await cordis.call(agent, "cordis_stop", {"pluginId": "clock-1"})
    assert result_text(stopped) == (
        "Dynamic Plugin clock-1 is stopped; its definition and versions remain."
    )
    assert jsonvalue.loads(stopped.value_json) == {"pluginId": "clock-1"}
    hosts = _hosts(cordis)
    assert hosts.log[-1] == ("retracted", "run-1")  # retracted before the answer
    assert hosts.probe.seen[-1] == "disposed clock"
    assert "clock_now" not in await cordis.visible(agent)
    assert (await cordis.call(agent, "clock_now", {})).error.code == "UNKNOWN_TOOL"
    again = await cordis.call(agent, "cordis_stop", {"pluginId": "clock-1"})
    assert not again.is_error  # not-running counts as success
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    assert plugin["state"] == "stopped" and plugin["currentPackageId"] == "pkg-1"
    # Restart with run: the self-registered tool is restored.
    assert not (await cordis.run(agent, "clock-1", "pkg-1")).is_error
    assert "clock_now" in await cordis.visible(agent)
    missing = await cordis.call(agent, "cordis_stop", {"pluginId": "nope-9"})
    assert missing.error.code == "plugin-missing"


async def test_undefine_stops_and_forgets(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    await cordis.run(agent, "clock-1", "pkg-1")
    removed = await cordis.call(agent, "cordis_undefine", {"pluginId": "clock-1"})
    assert result_text(removed) == "Removed dynamic Plugin clock-1 and all of its Packages."
    assert jsonvalue.loads(removed.value_json) == {"pluginId": "clock-1", "wasRunning": True}
    assert _hosts(cordis).log[-1] == ("retracted", "run-1")
    assert "clock_now" not in await cordis.visible(agent)
    gone = await cordis.call(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    assert gone.error.code == "plugin-missing"


async def test_a_rule_gates_cordis_run_like_any_tool(make_cordis: Any, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  - tool: cordis_run\n    action: deny\n    reason: no plugins today\n"
        "  - tool: clock_*\n    action: deny\n    reason: no clocks\n"
    )
    async with make_cordis(policy_rules=rules) as h:
        agent = await h.agent("maker")
        await h.define(agent)
        denied = await h.run(agent, "clock-1", "pkg-1")
        assert denied.is_error and "no plugins today" in denied.error.message
        assert _hosts(h).log == []  # the body never ran
        # Activate behind the rule's back: the dynamic tool is still subject to the rules.
        registry_cordis = h.registry.cordis.runner
        from registry_service.domain.signals import AbortController

        await registry_cordis.run(agent, "clock-1", "pkg-1", "run", AbortController().signal)
        blocked = await h.call(agent, "clock_now", {})
        assert blocked.is_error and "no clocks" in blocked.error.message
        assert "now" not in _hosts(h).probe.seen


async def test_output_is_validated_against_the_tools_output_schema(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    typed = CLOCK.replace(
        "execute=now,", 'execute=now,\n    output_schema={"type": "object", "required": ["iso"]},'
    )
    await cordis.define(agent, typed)
    await cordis.run(agent, "clock-1", "pkg-1")
    result = await cordis.call(agent, "clock_now", {})
    assert result.is_error and result.error.code == "INVALID_TOOL_OUTPUT"
    bad_args = await cordis.call(agent, "clock_now", [])
    assert bad_args.error.code in ("INVALID_ARGS", "INVALID_ARGUMENTS")


async def test_cancelling_a_call_reaches_the_host(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    slow = CLOCK.replace(
        'probe.seen.append("now")', 'probe.seen.append("now")\n    await probe.gate("g").wait()'
    )
    await cordis.define(agent, slow)
    await cordis.run(agent, "clock-1", "pkg-1")
    request = rpb.ExecuteToolCallRequest(
        agent=agent, call_id="cancel-me", tool_name="clock_now", arguments_json="{}"
    )
    call = cordis.stub.ExecuteToolCall(request)
    hosts = _hosts(cordis)
    await until(lambda: "now" in hosts.probe.seen, "the call")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        async for _ in call:
            pass
    await until(lambda: ("call-cancelled", "run-1", "clock_now") in hosts.log, "the cancel")
    record = await cordis.settled(agent, "cancel-me")
    assert record.is_error


async def test_a_crashed_host_fails_its_attempt_and_removes_its_tools(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    await cordis.run(agent, "clock-1", "pkg-1")
    _hosts(cordis).hosts["run-1"].crash()
    assert "clock_now" not in await cordis.visible(agent)
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    assert plugin["state"] == "failed" and "activeRun" not in plugin
    assert plugin["currentPackageId"] == "pkg-1"
    view = await cordis.ok(
        agent, "cordis_inspect_self", {"pluginId": "clock-1", "packageId": "pkg-1"}
    )
    assert view["runtime"]["host"]["error"]["message"] == (
        "the plugin host stopped unexpectedly: worker exited with code 137"
    )
    assert not (await cordis.run(agent, "clock-1", "pkg-1")).is_error  # run reactivates


async def test_deleting_the_agent_retracts_its_hosts(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    await cordis.run(agent, "clock-1", "pkg-1")
    await cordis.stub.DeleteAgent(rpb.DeleteAgentRequest(name=agent))
    hosts = _hosts(cordis)
    await until(lambda: not hosts.live, "the retract")
    assert hosts.log[-1] == ("retracted", "run-1")
    again = await cordis.agent("maker")
    assert (await cordis.ok(again, "cordis_inspect_self", {}))["plugins"] == []


async def test_registry_shutdown_unwinds_every_host_half(make_cordis: Any) -> None:
    async with make_cordis() as h:
        agent = await h.agent("maker")
        await h.define(agent)
        await h.define(agent, prefix="alarm")
        await h.run(agent, "clock-1", "pkg-1")
        assert (await h.run(agent, "alarm-2", "pkg-2")).is_error  # clock_now collides
        hosts = _hosts(h)
    assert not hosts.live
    assert hosts.log[-1] == ("retracted", "run-1")


async def test_a_colliding_tool_fails_the_start_with_the_replace_recipe(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    await cordis.define(agent, prefix="alarm")
    await cordis.run(agent, "clock-1", "pkg-1")
    result = await cordis.run(agent, "alarm-2", "pkg-2")
    assert result.error.code == "host-half-failed"
    assert 'tool "clock_now" is already registered' in result.error.message
    assert 'update that plugin (cordis_run mode="update") or stop it first' in result.error.message
    assert ("retracted", "run-2") in _hosts(cordis).log  # disposed before the error returned
    assert await cordis.ok(agent, "clock_now", {}) == {"time": "12:00", "args": {}}


async def test_without_plugin_hosts_run_is_a_clear_tool_error(make_cordis: Any) -> None:
    async with make_cordis(hosts=None) as h:
        agent = await h.agent("maker")
        await h.define(agent)
        result = await h.run(agent, "clock-1", "pkg-1")
        assert result.is_error and result.error.code == "plugin-hosts-unavailable"
        assert "no plugin hosts configured" in result.error.message
        plugin = await h.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
        assert plugin["state"] == "defined" and "nextPackageId" not in plugin


async def test_a_client_bearing_run_awaits_approval_and_runs_nothing(
    cordis: CordisHarness,
) -> None:
    """The tool never waits for a page: without a grant it returns awaiting-approval at once,
    and nothing has run (the page runner tests settle such requests)."""
    agent = await cordis.agent("maker")
    await cordis.define(agent, CLOCK, client="return { apply(ctx) {} }")
    result = await cordis.ok(
        agent, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}
    )
    assert result == {
        "status": "awaiting-approval",
        "pluginId": "clock-1",
        "packageId": "pkg-1",
        "pluginRunId": "run-1",
        "mode": "run",
        "nextPackageId": "pkg-1",
    }
    assert _hosts(cordis).log == []
    view = await cordis.ok(
        agent, "cordis_inspect_self", {"pluginId": "clock-1", "packageId": "pkg-1"}
    )
    assert view["code"] == {"host": CLOCK, "client": "return { apply(ctx) {} }"}
    assert view["plugin"]["state"] == "awaiting-approval"
    assert view["runtime"]["client"] == {"status": "pending", "waitingFor": []}
    again = await cordis.run(agent, "clock-1", "pkg-1")
    assert again.is_error and again.error.code == "transition-in-flight"
    assert again.error.message == 'dynamic plugin "clock-1" already has a pending run request'


async def test_a_tool_registered_later_appears_and_one_removed_goes(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    later = CLOCK + "\n"  # registers clock_now; then the test adds and removes through the host
    await cordis.define(agent, later)
    await cordis.run(agent, "clock-1", "pkg-1")
    host = _hosts(cordis).hosts["run-1"]
    from tests.registry.cordis.hosts import _Harness

    harness = _Harness(host)

    async def echo(args: Any) -> Any:
        return args

    harness.register_tool(
        harness.define_tool(
            name="clock_echo", description="echo", parameters={"type": "object"}, execute=echo
        )
    )
    assert {"clock_now", "clock_echo"} <= set(await cordis.visible(agent))
    assert await cordis.ok(agent, "clock_echo", {"a": 1}) == {"a": 1}
    harness.unregister_tool("clock_now")
    assert "clock_now" not in await cordis.visible(agent)
    assert (await cordis.call(agent, "clock_now", {})).error.code == "UNKNOWN_TOOL"


async def test_resolve_plugin_references_rpc(cordis: CordisHarness) -> None:
    owner = await cordis.agent("owner")
    other = await cordis.agent("other")
    await cordis.define(owner)
    reply = await cordis.stub.ResolvePluginReferences(
        rpb.ResolvePluginReferencesRequest(
            agent=owner, text="fix @clock-1 and @clock-1 please, not x@clock-1 or @gone-7"
        )
    )
    assert [(c.plugin_id, c.available) for c in reply.contexts] == [
        ("clock-1", True),
        ("gone-7", False),
    ]
    assert reply.contexts[0].text == (
        "<cordis_dynamic_plugin_context>\n"
        "{\n"
        '  "pluginId": "clock-1",\n'
        '  "packageId": "pkg-1",\n'
        '  "name": "Clock",\n'
        '  "purpose": "Tell the time."\n'
        "}\n"
        "\n"
        "The user explicitly referenced @clock-1. Use Package pkg-1 as the base for this "
        "modification.\n"
        'Before modifying it, call cordis_inspect_self with pluginId="clock-1" and '
        'packageId="pkg-1" to read the exact metadata and source.\n'
        'Use cordis_define with plugin.kind="existing" and the original pluginId="clock-1" to '
        "append an immutable Package.\n"
        "Do not create a new Plugin for this request. After cordis_define succeeds, call "
        'cordis_run mode="run" with the returned packageId.\n'
        "</cordis_dynamic_plugin_context>"
    )
    assert "code" not in reply.contexts[0].text and "probe" not in reply.contexts[0].text
    foreign = await cordis.stub.ResolvePluginReferences(
        rpb.ResolvePluginReferencesRequest(agent=other, text="@clock-1")
    )
    assert foreign.contexts[0].text == (
        "<cordis_dynamic_plugin_context>\n"
        "The user explicitly referenced @clock-1, but this Plugin is unavailable in the current "
        "Session.\n"
        "It may have been removed, belong to another Session, or have been lost when the "
        "registry process restarted.\n"
        "Do not claim that it was updated or silently create a replacement Plugin. Tell the "
        "user that the reference is currently unavailable.\n"
        "</cordis_dynamic_plugin_context>"
    )
    await cordis.run(owner, "clock-1", "pkg-1")
    ran = await cordis.stub.ResolvePluginReferences(
        rpb.ResolvePluginReferencesRequest(agent=owner, text="@clock-1")
    )
    assert 'cordis_run mode="update"' in ran.contexts[0].text
    assert '"latestRun": {' in ran.contexts[0].text
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await cordis.stub.ResolvePluginReferences(
            rpb.ResolvePluginReferencesRequest(agent="agents/nobody", text="@clock-1")
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_dynamic_tool_call_has_the_same_span_as_any_tool(make_cordis: Any) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.registry.conftest import echo_tool

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with make_cordis(tracer_provider=provider) as h:
        agent = await h.agent("maker")
        echo_tool(h.registry, "echo")
        await h.define(agent)
        await h.run(agent, "clock-1", "pkg-1")
        exporter.clear()
        await h.ok(agent, "clock_now", {}, "dyn")
        await h.ok(agent, "echo", {}, "static")
        spans = {s.name: s for s in exporter.get_finished_spans()}
        assert {"execute_tool clock_now", "execute_tool echo"} <= set(spans)
        dynamic, static = spans["execute_tool clock_now"], spans["execute_tool echo"]
        assert set(dynamic.attributes or {}) == set(static.attributes or {})
        assert [e.name for e in dynamic.events] == [e.name for e in static.events]
    provider.shutdown()


async def test_a_plugin_waiting_for_a_service_counts_as_a_successful_start(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    consumer = (
        "class Plugin:\n"
        "    inject = ['weather']\n"
        "    async def apply(self, ctx):\n"
        "        pass\n"
        "\n"
        "return Plugin()\n"
    )
    await cordis.define(agent, consumer, prefix="umbr")
    result = await cordis.run(agent, "umbr-1", "pkg-1")
    value: Any = jsonvalue.loads(result.value_json)
    assert value["status"] == "running"
    assert value["host"] == {"status": "waiting", "provides": [], "waitingFor": ["weather"]}
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "umbr-1"})
    assert plugin["state"] == "waiting" and plugin["currentPackageId"] == "pkg-1"


async def test_the_host_half_sees_the_owners_tool_schemas_only(cordis: CordisHarness) -> None:
    from tests.registry.conftest import echo_tool

    owner = await cordis.agent("owner")
    other = await cordis.agent("other")
    echo_tool(cordis.registry, "mine", scope=owner)
    echo_tool(cordis.registry, "theirs", scope=other)
    looker = (
        "async def apply(ctx):\n"
        "    for view in ctx.schemas():\n"
        "        probe.seen.append(view['name'])\n"
        "\n"
        "return apply\n"
    )
    await cordis.define(owner, looker, prefix="look")
    await cordis.run(owner, "look-1", "pkg-1")
    seen = _hosts(cordis).probe.seen
    assert "mine" in seen and "cordis_run" in seen
    assert "theirs" not in seen and "run_code" not in seen


async def test_a_cancelled_run_call_still_ends_its_start_consistently(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await cordis.define(agent)
    hosts = _hosts(cordis)
    hosts.activation_gate = asyncio.Event()
    call = cordis.stub.ExecuteToolCall(
        rpb.ExecuteToolCallRequest(
            agent=agent,
            call_id="run-cancelled",
            tool_name="cordis_run",
            arguments_json='{"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}',
        )
    )
    await until(lambda: bool(hosts.log), "the activation")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        async for _ in call:
            pass
    hosts.activation_gate.set()
    await until(lambda: ("started", "run-1") in hosts.log, "the start")
    await cordis.settled(agent, "run-cancelled")
    plugin = await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "clock-1"})
    # The start was not abandoned half-way: either it committed (a live, listed run) or nothing.
    assert plugin["state"] == "running" and plugin["currentPackageId"] == "pkg-1"
    assert "clock_now" in await cordis.visible(agent)
    assert hosts.live == {"run-1"}
