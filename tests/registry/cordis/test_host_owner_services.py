"""Services between plugins whose hosts run in different registries sharing one real
PostgreSQL (real plugin hosts on a real runtime each): a consumer started on one registry sees
the service a plugin running on the other provides, starts (not `waiting`), and its calls of the
provider's methods cross to the provider's registry; when the provider stops, the consumer
parks again. Every wait is a latch."""

from __future__ import annotations

from typing import Any

import grpc

from tests.registry.cordis.conftest import CordisHarness
from tests.registry.cordis.real_stack import real_stack
from tests.registry.cordis.test_replicas import seen
from tests.registry.cordis.test_services import CONSUMER_PY, PROVIDER_PY

AGENT = "agents/coder"


def run_of(h: CordisHarness, plugin_id: str) -> Any:
    plugin = h.registry.cordis.runner.find(AGENT, plugin_id)
    return None if plugin is None else plugin.run


async def state(h: CordisHarness, plugin_id: str) -> Any:
    view = await h.ok(AGENT, "cordis_inspect_self", {"pluginId": plugin_id})
    return view["state"]


async def test_a_consumer_on_one_registry_calls_a_provider_the_other_runs(
    pg_database: str,
) -> None:
    settings: dict[str, Any] = {
        "history_store": "postgres",
        "history_dsn": pg_database,
        "token_key": "5e" * 32,
        "cordis_host_lease_s": 3.0,
    }
    async with real_stack(**settings) as a, real_stack(**settings) as b:
        await a.agent("coder")

        async def on_b() -> bool:
            try:
                return not (await b.call(AGENT, "cordis_inspect_self", {})).is_error
            except grpc.aio.AioRpcError:
                return False

        await seen(on_b, bool, "the agent on B")
        provider = await a.define(AGENT, PROVIDER_PY, prefix="count", name="Counter")
        consumer = await a.define(AGENT, CONSUMER_PY, prefix="tally", name="Tally")
        started = await a.ok(
            AGENT,
            "cordis_run",
            {"pluginId": provider["pluginId"], "packageId": provider["packageId"], "mode": "run"},
        )
        assert started["status"] == "running"

        async def provider_on_b() -> Any:
            return run_of(b, provider["pluginId"])

        await seen(provider_on_b, lambda run: run is not None, "A's provider seen on B")
        # Started on B, its host on B: it injects the service A's plugin provides.
        await seen(
            lambda: b.visible(AGENT), lambda names: "count_up" not in names, "no consumer yet"
        )
        ran = await b.ok(
            AGENT,
            "cordis_run",
            {"pluginId": consumer["pluginId"], "packageId": consumer["packageId"], "mode": "run"},
        )
        assert ran["status"] == "running"
        assert await state(b, consumer["pluginId"]) == "running"  # not waiting
        first = await b.ok(AGENT, "count_up", {"k": 2})
        assert first == {"total": 2, "unit": "apples"}
        # From A, the consumer's tool runs on B, whose call of the counter runs on A.
        await seen(lambda: a.visible(AGENT), lambda names: "count_up" in names, "on A")
        second = await a.ok(AGENT, "count_up", {"k": 3})
        assert second == {"total": 5, "unit": "apples"}

        # The provider stops (through B): the consumer parks again, its tool gone.
        await b.ok(AGENT, "cordis_stop", {"pluginId": provider["pluginId"]})
        await seen(lambda: state(b, consumer["pluginId"]), lambda s: s == "waiting", "parked again")
        assert "count_up" not in await b.visible(AGENT)
