"""Plugin hosts count against their tenant in admission control, through the real registry and
a real runtime: an agent holds at most `max_plugin_hosts` (default 4) live hosts, and live hosts
hold the registry's sandboxes (`limits.max_concurrent_runs`) as runs do. An activation over a
limit fails with the Cordis reason `resource-exhausted` and starts nothing, so one agent's
plugins cannot take the sandboxes another agent's `run_code` needs."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from codemode_wire import jsonvalue
from tests.registry.conftest import BOTH, error_info_of
from tests.registry.cordis.conftest import CordisHarness
from tests.registry.cordis.real_stack import real_stack

IDLE_HOST = "async def apply(ctx):\n    pass\n\nreturn apply\n"
# The limits of the reported case; the runtime's sandboxes (a private uid range) are fewer
# than the hosts one agent asks for.
LIMITS = {"limits": {"max_concurrent_runs": 8}, "agent_limits": {"max_concurrent_runs": 2}}
RUNTIME = {"worker_uid_base": 63_770, "worker_uid_count": 10, "typescript_pool_size": 0}


async def _activate(h: CordisHarness, agent: str, n: int) -> tuple[str, Any]:
    """Defines plugin `p<n>` and runs it: (its id, the `cordis_run` result)."""
    defined = await h.define(agent, IDLE_HOST, prefix="idle", name=f"Idle {n}")
    plugin_id = defined["pluginId"]
    return plugin_id, await h.run(agent, plugin_id, defined["packageId"])


async def _run_code(h: CordisHarness, agent: str, call_id: str) -> Any:
    try:
        return await h.call(agent, "run_code", {"code": "return 1", "description": "d"}, call_id)
    except grpc.aio.AioRpcError as error:
        return error


async def test_an_agent_cannot_take_the_sandboxes_with_plugin_hosts() -> None:
    async with real_stack(RUNTIME, **LIMITS) as h:
        assert h.runtime is not None
        a, b, c = await h.agent("a"), await h.agent("b", mode=BOTH), await h.agent("c")
        started: list[tuple[str, Any]] = []
        refused: list[tuple[str, Any]] = []
        for n in range(12):
            plugin_id, result = await _activate(h, a, n)
            (refused if result.is_error else started).append((plugin_id, result))
        assert len(started) == 4, [r.error.message for _, r in refused][:2]
        for _, result in refused:
            assert result.error.code == "resource-exhausted", result.error
            assert "max_plugin_hosts" in result.error.message
            assert "no plugin host was started" in result.error.message, result.error.message
        assert h.runtime.live_hosts == 4  # nothing of the refused ones started
        assert h.registry.admission.live_hosts(a) == 4

        # Another agent's run works beside them.
        ok = await _run_code(h, b, "b-1")
        assert not isinstance(ok, grpc.aio.AioRpcError) and not ok.is_error, ok
        assert jsonvalue.loads(ok.value_json) == {"logs": [], "result": 1}

        # Live hosts hold the registry's sandboxes: with a's 4 and c's 4, all 8 are taken.
        for n in range(4):
            _, result = await _activate(h, c, 100 + n)
            assert not result.is_error, result.error
        full = await _run_code(h, b, "b-2")
        assert isinstance(full, grpc.aio.AioRpcError), full
        assert full.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info_of(full)
        assert info is not None and info.reason == "ADMISSION_LIMIT", info
        assert (info.metadata["scope"], info.metadata["limit"]) == ("global", "max_concurrent_runs")

        # A stopped plugin gives its sandbox back once its host is gone.
        await h.ok(a, "cordis_stop", {"pluginId": started[0][0]})
        assert h.registry.admission.live_hosts(a) == 3
        ok = await _run_code(h, b, "b-3")
        assert not isinstance(ok, grpc.aio.AioRpcError) and not ok.is_error, ok
        for _ in range(500):  # every host is reaped by the runtime after its retract
            if h.runtime.live_hosts == 7:
                break
            await asyncio.sleep(0.01)
        assert h.runtime.live_hosts == 7
