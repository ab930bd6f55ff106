"""Page runners over real gRPC (`PageRunnerService.Attach`, the Python client's `PageRunner`):
activation requests and their settle rules, grants, direct panel gestures, `invoke` codes,
render failures, client inspect manifests and queries (docs/cordis.md).
Host halves run in the in-process plugin hosts of the seam; the TypeScript client's half of
these rules is clients/typescript/test/page-runner.test.ts (real runtime)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from codemode_client import RegistryClient, agent_message
from codemode_client.agent_messages import AgentMessage
from codemode_client.page_runner import PageRunner
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import page_runner_pb2 as ppb
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.cordis.page_runners import REVIEW_SOURCE_CHARS
from registry_service.domain.cordis.steering import INSPECT_DIRECTION
from registry_service.domain.records import AGENT_INJECT, AGENT_STEER
from tests.registry.cordis.conftest import CordisHarness, until
from tests.registry.cordis.hosts import InProcessHosts

CLIENT = "return { apply(ctx) { ctx.log('hello') } }"
PANEL_HOST = """\
async def greet(args):
    probe.seen.append("greet")
    return {"hello": args["name"]}

def boom(args):
    raise ValueError("no greeting today")

tool = harness.define_tool(
    name="panel_echo",
    description="Echo.",
    parameters={"type": "object", "properties": {}, "additionalProperties": True},
    execute=greet,
)

async def apply(ctx):
    harness.handle("greet", greet)
    harness.handle("boom", boom)
    harness.register_tool(tool)

return apply
"""
BROKEN_HOST = "async def apply(ctx):\n    raise RuntimeError('cannot start')\n\nreturn apply\n"


def _hosts(cordis: CordisHarness) -> InProcessHosts:
    assert isinstance(cordis.hosts, InProcessHosts)
    return cordis.hosts


@contextlib.asynccontextmanager
async def _page(cordis: CordisHarness, agent: str) -> AsyncIterator[PageRunner]:
    async with PageRunner(cordis.channel, agent) as page:
        yield page


async def _defined(
    cordis: CordisHarness, agent: str, host: str | None = PANEL_HOST, **kwargs: Any
) -> Any:
    return await cordis.define(agent, host, prefix="panel", client=CLIENT, name="Panel", **kwargs)


async def _run(cordis: CordisHarness, agent: str, package: str = "pkg-1", mode: str = "run") -> Any:
    return await cordis.ok(
        agent, "cordis_run", {"pluginId": "panel-1", "packageId": package, "mode": mode}
    )


async def _messages(cordis: CordisHarness, agent: str, count: int) -> list[AgentMessage]:
    """The agent's steer/inject records, once `count` of them are written."""
    client = RegistryClient(cordis.channel)
    found: list[AgentMessage] = []

    async def written() -> bool:
        nonlocal found
        records = await client.history(agent)
        typed = [agent_message(r) for r in records if r.kind in (AGENT_STEER, AGENT_INJECT)]
        found = [m for m in typed if m is not None]
        return len(found) >= count

    for _ in range(500):
        if await written():
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} steer/inject records were not written: {found}")


async def _state(cordis: CordisHarness, agent: str) -> Any:
    return await cordis.ok(agent, "cordis_inspect_self", {"pluginId": "panel-1"})


async def _settled_run(cordis: CordisHarness, page: PageRunner, agent: str) -> str:
    """Runs panel-1/pkg-1 to `running` through a request; returns its run id."""
    await _run(cordis, agent)
    request = (await page.next_event("run_requested")).run_requested
    started = await page.run_host_half(request)
    assert started.accepted, started.message
    settled = await page.settle(request.request_id, started.plugin_run_id)
    assert settled.accepted, settled.message
    return started.plugin_run_id


async def test_a_request_carries_its_source_to_review_and_an_approved_run_commits_and_steers(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page:
        out = await _run(cordis, agent)
        assert out["status"] == "awaiting-approval"
        event = await page.next_event("run_requested")
        request = event.run_requested
        assert request == ppb.RunRequested(
            request_id="approval-1",
            agent=agent,
            plugin_id="panel-1",
            package_id="pkg-1",
            plugin_run_id="run-1",
            mode="run",
            name="Panel",
            purpose="Tell the time.",
            requires_approval=True,
            has_host_half=True,
            source=ppb.PackageSource(host=PANEL_HOST, client=CLIENT, truncated=False),
        )
        early = await page.client_code("panel-1", "run-1")
        assert not early.accepted and early.code == "stale-run"  # no active run yet
        started = await page.run_host_half(request)
        assert started.accepted and started.started_here and started.plugin_run_id == "run-1"
        assert (await _state(cordis, agent))["state"] == "client-pending"
        code = await page.client_code("panel-1", "run-1")
        assert code.accepted
        assert code.client_code == ppb.ClientCode(
            code=CLIENT,
            name="Panel",
            plugin_id="panel-1",
            package_id="pkg-1",
            plugin_run_id="run-1",
        )
        wrong = await page.client_code("panel-1", "run-7")
        assert not wrong.accepted and not wrong.HasField("client_code")
        settled = await page.settle("approval-1", "run-1")
        assert settled.accepted
        resolved = (await page.next_event("run_resolved")).run_resolved
        assert (resolved.request_id, resolved.outcome) == ("approval-1", "approved")
        again = await page.settle("approval-1", "run-1")  # duplicate: refused, changes nothing
        assert not again.accepted and again.code == "request-unknown"
    plugin = await _state(cordis, agent)
    assert plugin["state"] == "running" and plugin["currentPackageId"] == "pkg-1"
    assert "nextPackageId" not in plugin
    [steer] = await _messages(cordis, agent, 1)
    assert steer.kind == "steer" and steer.source == "cordis-host-runner"
    assert steer.text == (
        "Cordis run panel-1/pkg-1 (run-1) completed successfully. currentPackageId is pkg-1. "
        "Continue using the running Plugin."
    )
    assert steer.metadata == {"pluginId": "panel-1", "packageId": "pkg-1", "pluginRunId": "run-1"}


async def test_a_source_too_long_to_review_whole_is_cut_and_says_so(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    long_client = "// " + "é" * REVIEW_SOURCE_CHARS + "\n" + CLIENT  # the payload after the cut
    await cordis.define(agent, None, prefix="panel", client=long_client, name="Panel")
    async with _page(cordis, agent) as page:
        await _run(cordis, agent)
        first = (await page.next_event("run_requested")).run_requested
    async with _page(cordis, agent) as later:  # replayed to a page that attaches later, the same
        replayed = (await later.next_event("run_requested")).run_requested
    for request in (first, replayed):
        assert request.source == ppb.PackageSource(
            host="", client=long_client[:REVIEW_SOURCE_CHARS], truncated=True
        )
        assert CLIENT not in request.source.client


async def test_a_rejection_runs_nothing_and_steers_the_agent_not_to_ask_again(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page:
        await _run(cordis, agent)
        request = (await page.next_event("run_requested")).run_requested
        rejected = await page.settle(request.request_id, outcome="rejected")
        assert rejected.accepted
        assert (await page.next_event("run_resolved")).run_resolved.outcome == "rejected"
        late = await page.run_host_half(request)  # answered already: refused
        assert not late.accepted and late.code == "request-unknown"
    assert _hosts(cordis).log == []  # nothing executed
    view = await cordis.ok(
        agent, "cordis_inspect_self", {"pluginId": "panel-1", "packageId": "pkg-1"}
    )
    assert view["plugin"]["state"] == "failed"
    assert view["runtime"]["client"]["status"] == "stopped"
    [steer] = await _messages(cordis, agent, 1)
    assert steer.text == (
        "The user rejected Cordis run panel-1/pkg-1 (run-1). Do not request the same "
        "activation again unless the user asks."
    )


async def test_unknown_and_stale_answers_are_refused_and_leave_the_request_pending(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page:
        await _run(cordis, agent)
        request = (await page.next_event("run_requested")).run_requested
        unknown = await page.settle("approval-99", "run-1")
        assert not unknown.accepted and unknown.code == "request-unknown"
        mismatch = await page.run_host_half(
            ppb.RunRequested(
                request_id=request.request_id, plugin_id="panel-1", package_id="pkg-9", mode="run"
            )
        )
        assert not mismatch.accepted and mismatch.code == "request-mismatch"
        early = await page.settle(request.request_id, "run-1")  # success before a run exists
        assert not early.accepted and early.code == "stale-run"
        started = await page.run_host_half(request)
        stale = await page.settle(request.request_id, "run-2", "client-half-failed")
        assert not stale.accepted and stale.code == "stale-run"
        assert (await _state(cordis, agent))["state"] == "client-pending"  # still pending
        assert (await page.settle(request.request_id, started.plugin_run_id)).accepted
    assert (await _state(cordis, agent))["state"] == "running"


async def test_a_request_is_answerable_by_a_page_attaching_after_the_tool_returned(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    await _run(cordis, agent)  # the tool call is over; no page is attached yet
    async with _page(cordis, agent) as page:
        request = (await page.next_event("run_requested")).run_requested  # replayed on attach
        assert request.request_id == "approval-1"
        started = await page.run_host_half(request)
        assert (await page.settle(request.request_id, started.plugin_run_id)).accepted
    assert (await _state(cordis, agent))["state"] == "running"


async def test_pages_of_another_agent_hear_nothing_and_cannot_answer(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    other = await cordis.agent("other")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as mine, _page(cordis, other) as theirs:
        await _run(cordis, agent)
        request = (await mine.next_event("run_requested")).run_requested
        refused = await theirs.run_host_half(request)
        assert not refused.accepted and refused.code == "request-unknown"
        started = await mine.run_host_half(request)
        foreign = await theirs.client_code("panel-1", started.plugin_run_id)
        assert not foreign.accepted
        assert not (await theirs.settle(request.request_id, started.plugin_run_id)).accepted
        assert (await mine.settle(request.request_id, started.plugin_run_id)).accepted
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(theirs.next_event(), 0.2)


async def test_grants_per_package_and_for_future_versions_skip_the_approval(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page:
        await _settled_run(cordis, page, agent)  # approved once: pkg-1 is granted
        await cordis.ok(agent, "cordis_stop", {"pluginId": "panel-1"})
        again = await _run(cordis, agent)
        assert again["status"] == "starting"  # the package's grant applies
        request = (await page.next_event("run_requested")).run_requested
        assert not request.requires_approval
        started = await page.run_host_half(request, approve_future_versions=True)
        assert started.accepted and started.plugin_run_id == "run-2"
        await page.settle(request.request_id, started.plugin_run_id)
        resolved = (await page.next_event("run_resolved")).run_resolved
        assert resolved.outcome == "completed"  # approval-free, whatever the verdict
        await _defined(cordis, agent, existing="panel-1")  # pkg-2: a new version
        update = await _run(cordis, agent, "pkg-2", "update")
        assert update["status"] == "awaiting-approval"  # future versions were not approved
        request = (await page.next_event("run_requested")).run_requested
        started = await page.run_host_half(request, approve_future_versions=True)
        assert (await page.settle(request.request_id, started.plugin_run_id)).accepted
        await _defined(cordis, agent, existing="panel-1")  # pkg-3
        assert (await _run(cordis, agent, "pkg-3", "update"))["status"] == "starting"


async def test_a_grant_is_kept_when_the_host_half_fails_and_the_failure_steers(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent, host=BROKEN_HOST)
    async with _page(cordis, agent) as page:
        await _run(cordis, agent)
        request = (await page.next_event("run_requested")).run_requested
        started = await page.run_host_half(request)
        assert not started.accepted and started.code == "host-half-failed"
        assert "cannot start" in started.message
        settled = await page.settle(
            request.request_id, outcome="host-half-failed", message=started.message
        )
        assert settled.accepted
        assert (await page.next_event("run_resolved")).run_resolved.outcome == "failed"
        plugin = await _state(cordis, agent)
        assert plugin["state"] == "failed" and plugin["nextPackageId"] == "pkg-1"
        assert "currentPackageId" not in plugin
        assert (await _run(cordis, agent))["status"] == "starting"  # the grant was recorded
    [steer] = await _messages(cordis, agent, 1)
    lines = steer.text.split("\n")
    assert lines[0] == (
        "Cordis run panel-1/pkg-1 (run-1) failed after cordis_run returned awaiting-approval: "
        "host-half-failed"
    )
    assert "cannot start" in lines[1]
    assert lines[-3:] == ["currentPackageId: none", "nextPackageId: pkg-1", INSPECT_DIRECTION]


async def test_a_client_failure_of_the_starting_page_retracts_its_host_half(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page:
        await _run(cordis, agent)
        request = (await page.next_event("run_requested")).run_requested
        started = await page.run_host_half(request)
        assert "panel_echo" in await cordis.visible(agent)
        failed = await page.settle(
            request.request_id, started.plugin_run_id, "client-half-failed", message="bad JSX"
        )
        assert failed.accepted
        await until(lambda: ("retracted", "run-1") in _hosts(cordis).log, "the retract")
        assert "panel_echo" not in await cordis.visible(agent)
        view = await cordis.ok(
            agent, "cordis_inspect_self", {"pluginId": "panel-1", "packageId": "pkg-1"}
        )
        assert view["runtime"]["client"]["status"] == "failed"
        assert view["runtime"]["client"]["error"]["phase"] == "client-apply"
    [steer] = await _messages(cordis, agent, 1)
    assert steer.text.startswith(
        "Cordis run panel-1/pkg-1 (run-1) failed after cordis_run returned awaiting-approval: "
        "client-half-failed\nbad JSX\n"
    )


async def test_concurrent_pages_share_one_activation(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    hosts = _hosts(cordis)
    hosts.activation_gate = asyncio.Event()
    async with _page(cordis, agent) as first, _page(cordis, agent) as second:
        await _run(cordis, agent)
        request = (await first.next_event("run_requested")).run_requested
        assert (await second.next_event("run_requested")).run_requested == request
        one = asyncio.ensure_future(first.run_host_half(request))
        await until(lambda: bool(hosts.log), "the activation")
        two = asyncio.ensure_future(second.run_host_half(request))
        await asyncio.sleep(0.05)
        hosts.activation_gate.set()
        a, b = await one, await two
        assert a.accepted and b.accepted and a.plugin_run_id == b.plugin_run_id == "run-1"
        assert (a.started_here, b.started_here) == (True, False)
        assert [e for e in hosts.log if e[0] == "activate"] == [("activate", "run-1", "pkg-1")]
        assert (await second.settle(request.request_id, "run-1")).accepted  # first valid wins
        assert not (await first.settle(request.request_id, "run-1")).accepted


async def test_an_attaching_panel_page_failing_does_not_stop_the_running_plugin(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as first, _page(cordis, agent) as second:
        run_id = await _settled_run(cordis, first, agent)
        attached = await second.panel_run("panel-1", "pkg-1")
        assert attached.accepted and not attached.started_here and attached.plugin_run_id == run_id
        failed = await second.settle(
            "", run_id, "client-half-failed", message="no DOM here", plugin_id="panel-1"
        )
        assert failed.accepted
        assert (await _state(cordis, agent))["state"] == "running"
        assert ("retract-start", run_id) not in _hosts(cordis).log


async def test_answers_after_stop_are_refused_and_the_request_is_cancelled(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page:
        await _run(cordis, agent)
        request = (await page.next_event("run_requested")).run_requested
        await cordis.ok(agent, "cordis_stop", {"pluginId": "panel-1"})
        resolved = (await page.next_event("run_resolved")).run_resolved
        assert (resolved.request_id, resolved.outcome) == ("approval-1", "cancelled")
        assert not (await page.run_host_half(request)).accepted
        assert not (await page.settle(request.request_id, "run-1")).accepted
        assert (await _state(cordis, agent))["state"] == "failed"  # latest run: cancelled
        direct = await page.panel_run("panel-1", "pkg-1")  # a fresh direct run gets run-2
        assert direct.accepted and direct.started_here and direct.plugin_run_id == "run-2"


async def test_direct_panel_gestures_grant_and_inject_context(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page:
        await _run(cordis, agent)
        blocked = await page.panel_run("panel-1", "pkg-1")  # a request is pending
        assert not blocked.accepted and blocked.code == "transition-in-flight"
        request = (await page.next_event("run_requested")).run_requested
        await page.settle(request.request_id, outcome="rejected")
        started = await page.panel_run("panel-1", "pkg-1")
        assert started.accepted and started.started_here
        assert (await page.settle("", started.plugin_run_id, plugin_id="panel-1")).accepted
        assert (await _state(cordis, agent))["currentPackageId"] == "pkg-1"
        await page.stop("panel-1")
        assert (await _run(cordis, agent))["status"] == "starting"  # the click granted pkg-1
        request = (await page.next_event("run_requested")).run_requested
        await page.settle(request.request_id, outcome="rejected")
        removed = await page.remove("panel-1")
        assert removed.accepted
        gone = await page.stop("panel-1")
        assert not gone.accepted and gone.code == "plugin-missing"
    messages = await _messages(cordis, agent, 5)
    assert [(m.kind, m.text.split(";")[0]) for m in messages] == [
        ("steer", "The user rejected Cordis run panel-1/pkg-1 (run-1). Do not request the same "
         "activation again unless the user asks."),
        ("inject", "The user ran Cordis run panel-1/pkg-1 (run-2) from the plugin panel"),
        ("inject", "The user stopped Cordis Plugin panel-1 from the plugin panel"),
        ("steer", "The user rejected Cordis run panel-1/pkg-1 (run-3). Do not request the same "
         "activation again unless the user asks."),
        ("inject", "The user removed Cordis Plugin panel-1 and all of its Packages from the "
         "plugin panel."),
    ]  # fmt: skip
    assert messages[1].text.endswith("it completed successfully. currentPackageId is pkg-1.")


async def test_invoke_reaches_host_handlers_with_the_reference_codes(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page:
        idle = await page.invoke("panel-1", "run-1", "greet", {"name": "Ada"})
        assert not idle.accepted and idle.code == "plugin-not-running"
        run_id = await _settled_run(cordis, page, agent)
        ok = await page.invoke("panel-1", run_id, "greet", {"name": "Ada"})
        assert ok.accepted and jsonvalue.loads(ok.value_json) == {"hello": "Ada"}
        stale = await page.invoke("panel-1", "run-0", "greet", {"name": "Ada"})
        assert not stale.accepted and stale.code == "stale-run"
        missing = await page.invoke("panel-1", run_id, "nope")
        assert not missing.accepted and missing.code == "method-not-found"
        for _ in range(2):
            failed = await page.invoke("panel-1", run_id, "boom", {})
            assert not failed.accepted and failed.code == "handler-error"
            assert failed.message == "ValueError: no greeting today" and failed.stack
    assert _hosts(cordis).probe.seen == ["greet"]
    messages = await _messages(cordis, agent, 2)
    await asyncio.sleep(0.1)
    messages = await _messages(cordis, agent, 2)
    assert len(messages) == 2  # the completion, then one steer for both handler failures
    assert messages[1].text.startswith(
        f"Cordis run panel-1/pkg-1 ({run_id}) failed after cordis_run returned running: "
        "handler-error\nhost.call('boom') failed: ValueError: no greeting today"
    )


async def test_render_failures_are_kept_per_run_dropped_for_foreign_agents_and_cleared(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    other = await cordis.agent("other")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page, _page(cordis, other) as theirs:
        run_id = await _settled_run(cordis, page, agent)
        foreign = await theirs.render_failure("panel-1", run_id, "not yours")
        assert not foreign.accepted
        stale = await page.render_failure("panel-1", "run-9", "old run")
        assert not stale.accepted
        for _ in range(2):
            assert (await page.render_failure("panel-1", run_id, "TypeError: x is null")).accepted

        async def client_view() -> Any:
            view = await cordis.ok(
                agent, "cordis_inspect_self", {"pluginId": "panel-1", "packageId": "pkg-1"}
            )
            return view["runtime"]["client"]

        failure = (await client_view())["renderFailure"]
        assert failure["phase"] == "client-render" and failure["message"] == "TypeError: x is null"
        assert failure["pluginRunId"] == run_id
        assert (await _state(cordis, agent))["state"] == "failed"
        await page.stop("panel-1")
        assert "renderFailure" not in await client_view()  # cleared by the stop
    messages = await _messages(cordis, agent, 3)
    steers = [m for m in messages if m.kind == "steer"]
    assert len(steers) == 2  # the completion and one render failure (reported twice)
    assert "client-render-failed\nTypeError: x is null" in steers[1].text


MANIFEST: JsonValue = [
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


async def test_client_manifests_sync_wholesale_and_queries_take_the_first_valid_answer(
    cordis: CordisHarness,
) -> None:
    agent = await cordis.agent("maker")
    other = await cordis.agent("other")
    async with _page(cordis, agent) as page:
        bad = await page.sync_manifest([{"id": "Slots", "description": "", "methods": []}])
        assert not bad.accepted and bad.code == "invalid-manifest"
        assert (await page.sync_manifest(MANIFEST)).accepted
        listed = await cordis.ok(agent, "cordis_inspect_list", {})
        clients = [p for p in listed["providers"] if p["platform"] == "client"]
        assert [p["id"] for p in clients] == ["Slots"]
        others = await cordis.ok(other, "cordis_inspect_list", {})
        assert not [p for p in others["providers"] if p["platform"] == "client"]

        query = asyncio.ensure_future(
            cordis.call(
                agent,
                "cordis_inspect_query",
                {"platform": "client", "provider": "Slots", "method": "listSubTree"},
            )
        )
        asked = (await page.next_event("inspect_query")).inspect_query
        assert (asked.query_id, asked.provider, asked.method) == (
            "inspect-1",
            "Slots",
            "listSubTree",
        )
        failed = await page.answer_query(asked.query_id, ok=False, message="no DOM")
        assert not failed.accepted and failed.code == "answer-failed"
        invalid = await page.answer_query(asked.query_id, {"slots": "main"})
        assert not invalid.accepted and invalid.code == "invalid-output"
        assert not query.done()  # both left it pending
        assert (await page.answer_query(asked.query_id, {"slots": ["main"]})).accepted
        result = await query
        assert not result.is_error, result.error.message
        assert jsonvalue.loads(result.value_json) == {
            "platform": "client",
            "provider": "Slots",
            "method": "listSubTree",
            "data": {"slots": ["main"]},
        }
        assert not (await page.answer_query(asked.query_id, {"slots": []})).accepted
        resolved = (await page.next_event("inspect_query_resolved")).inspect_query_resolved
        assert (resolved.query_id, resolved.outcome) == ("inspect-1", "answered")
        assert (await page.sync_manifest([])).accepted  # wholesale: now empty
        listed = await cordis.ok(agent, "cordis_inspect_list", {})
        assert not [p for p in listed["providers"] if p["platform"] == "client"]


async def test_a_cancelled_client_query_resolves_as_cancelled(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    async with _page(cordis, agent) as page:
        assert (await page.sync_manifest(MANIFEST)).accepted
        call = cordis.stub.ExecuteToolCall(
            rpb.ExecuteToolCallRequest(
                agent=agent,
                call_id="query-cancelled",
                tool_name="cordis_inspect_query",
                arguments_json=jsonvalue.dumps(
                    {"platform": "client", "provider": "Slots", "method": "listSubTree"}
                ),
            )
        )
        asked = (await page.next_event("inspect_query")).inspect_query
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            async for _ in call:
                pass
        resolved = (await page.next_event("inspect_query_resolved")).inspect_query_resolved
        assert (resolved.query_id, resolved.outcome) == (asked.query_id, "cancelled")
        late = await page.answer_query(asked.query_id, {"slots": []})
        assert not late.accepted and late.code == "query-unknown"


async def test_deleting_the_agent_cancels_its_pending_requests(cordis: CordisHarness) -> None:
    agent = await cordis.agent("maker")
    await _defined(cordis, agent)
    async with _page(cordis, agent) as page:
        await _run(cordis, agent)
        request = (await page.next_event("run_requested")).run_requested
        await cordis.stub.DeleteAgent(rpb.DeleteAgentRequest(name=agent))
        resolved = (await page.next_event("run_resolved")).run_resolved
        assert (resolved.request_id, resolved.outcome) == (request.request_id, "cancelled")
        assert not (await page.run_host_half(request)).accepted
    assert not cordis.registry.cordis.client_runs.has_pending("panel-1")
