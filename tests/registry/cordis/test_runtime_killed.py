"""Fault: the runtime SIGKILLed while a host half is starting in one of its plugin hosts. The
attempt fails with a diagnostic, `current` does not move, the owner hears of it exactly once
(the failing `cordis_run` result, or one steering record when that call had already been
cancelled), nothing of the plugin host is left running, and once a runtime is back at the
address a new `cordis_run` works. The registry is in this process, the runtime in its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator

import grpc

from codemode_cli.processes import start
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.config import RegistrySettings
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from tests.procfs import alive, children
from tests.registry.cordis.conftest import CordisHarness

GOOD = """\
def now(args):
    return "tick"

async def apply(ctx):
    harness.register_tool(harness.define_tool(name="tick", description="Ticks.", execute=now))

return apply
"""

# Its start says so in a log line, then waits: the runtime is killed during that wait.
STALLS = """\
import asyncio

async def apply(ctx):
    print("applying")
    await asyncio.sleep(600)

return apply
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _runtime(port: int) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "CODEMODE_RUNTIME_POOL_SIZE": "0",
        "CODEMODE_RUNTIME_TYPESCRIPT_POOL_SIZE": "0",
    }
    started = await start(
        "-m", "runtime_service", "--listen", f"127.0.0.1:{port}",
        ready="runtime listening on port ", env=env,
    )  # fmt: skip
    return started.proc


class _Applying(logging.Handler):
    """Sets `seen` once the plugin host's start logged "applying" (relayed to the registry)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "applying" in record.getMessage():
            self.seen.set()


@contextlib.asynccontextmanager
async def _registry(port: int) -> AsyncIterator[CordisHarness]:
    config = RegistrySettings(
        listen="127.0.0.1:0",
        history_path=":memory:",
        runtime_targets=[f"127.0.0.1:{port}"],
        cordis_start_timeout_s=600,
        runtime_start_timeout_s=20,
    )
    running = await start_registry(config, build_registry(config))
    channel = grpc.aio.insecure_channel(running.address)
    harness = CordisHarness(running, channel)
    harness.hosts = None
    try:
        yield harness
    finally:
        await channel.close()
        await running.stop(0)


async def _kill_mid_activation(proc: asyncio.subprocess.Process, applying: _Applying) -> None:
    """Waits until the host half is inside its start, then SIGKILLs the runtime; asserts the
    plugin host's processes die with it."""
    await asyncio.wait_for(applying.seen.wait(), 60)
    workers = children(proc.pid)
    assert workers, "the plugin host runs under the runtime"
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    for _ in range(200):
        if not any(alive(pid) for pid in workers):
            break
        await asyncio.sleep(0.05)
    assert not any(alive(pid) for pid in workers), "a plugin host outlived its runtime"
    applying.seen.clear()


async def _steers(h: CordisHarness, agent: str) -> list[str]:
    page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
    return [r.content[0].text.text for r in page.records if r.kind == "agent/steer"]


async def test_a_runtime_killed_mid_activation_fails_the_attempt_once_and_a_new_run_works() -> None:
    port = _free_port()
    proc = await _runtime(port)
    applying = _Applying()
    logger = logging.getLogger("registry_service.domain.cordis.runner")
    logger.addHandler(applying)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        async with _registry(port) as h:
            agent = await h.agent("victim")
            good = await h.define(agent, GOOD, prefix="tick", name="Tick")
            run = {"pluginId": good["pluginId"], "packageId": good["packageId"], "mode": "run"}
            assert (await h.ok(agent, "cordis_run", run, "r1"))["status"] == "running"
            stalls = await h.define(agent, STALLS, existing=good["pluginId"], name="Stalls")
            update = {"pluginId": good["pluginId"], "packageId": stalls["packageId"]}
            update["mode"] = "update"

            # 1. The runtime dies under a cordis_run the agent is waiting for: the call fails.
            call = asyncio.ensure_future(h.call(agent, "cordis_run", update, "u1"))
            await _kill_mid_activation(proc, applying)
            failed = await asyncio.wait_for(call, 60)
            assert failed.is_error
            assert failed.error.code == "host-half-failed"
            assert "the runtime was lost while the Host half was starting" in (failed.error.message)
            view = await h.ok(
                agent,
                "cordis_inspect_self",
                {"pluginId": good["pluginId"], "packageId": stalls["packageId"]},
            )
            assert view["plugin"]["currentPackageId"] == good["packageId"]  # did not move
            assert view["plugin"]["nextPackageId"] == stalls["packageId"]
            assert view["plugin"]["state"] == "failed"
            error = view["runtime"]["host"]["error"]
            assert error["phase"] == "host-apply"
            assert error["pluginRunId"] == "run-2"
            assert "tick" not in await h.visible(agent)  # the update retracted the old run
            assert await _steers(h, agent) == []  # the result told it: no second notice

            # 2. Back at the address: a rollback to current works.
            proc = await _runtime(port)
            back = await h.ok(agent, "cordis_run", run, "r2")
            assert back["status"] == "running" and back["currentPackageId"] == good["packageId"]
            assert await h.ok(agent, "tick", {}, "t1") == "tick"

            # 3. The same fault under a cordis_run whose call was cancelled: one steer.
            stream = h.stub.ExecuteToolCall(
                rpb.ExecuteToolCallRequest(
                    agent=agent,
                    call_id="u2",
                    tool_name="cordis_run",
                    arguments_json=(
                        f'{{"pluginId": "{good["pluginId"]}", '
                        f'"packageId": "{stalls["packageId"]}", "mode": "update"}}'
                    ),
                )
            )
            await asyncio.wait_for(applying.seen.wait(), 60)
            stream.cancel()  # the agent's call ends; the start goes on (shielded)
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                async for _ in stream:
                    pass
            await _kill_mid_activation(proc, applying)
            steers: list[str] = []
            for _ in range(500):
                steers = await _steers(h, agent)
                if steers:
                    break
                await asyncio.sleep(0.02)
            assert len(steers) == 1
            assert steers[0].startswith(f"Cordis update {good['pluginId']}/{stalls['packageId']} ")
            assert "failed after cordis_run returned cancelled: host-half-failed" in steers[0]
            assert "the runtime was lost while the Host half was starting" in steers[0]
            assert f"currentPackageId: {good['packageId']}" in steers[0]

            proc = await _runtime(port)
            again = await h.ok(agent, "cordis_run", run, "r3")
            assert again["status"] == "running"
            assert await h.ok(agent, "tick", {}, "t2") == "tick"
            assert len(await _steers(h, agent)) == 1  # still once, after all that followed
    finally:
        logger.removeHandler(applying)
        logger.setLevel(previous_level)
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
