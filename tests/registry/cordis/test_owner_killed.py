"""The owner of a plugin's host really dies: A, a real registry process, and B, a registry in
this process, share one real PostgreSQL and one real runtime (host halves in real plugin hosts,
programs in real sandboxes). A activates the plugin; a program on B calls its tool, which runs
in A's plugin host and holds there; A is SIGKILLed mid-call (nothing of it runs after: no
lease handed over, no stream closed). The call fails ABORTED on B and is recorded so; once A's
short lease expires B takes it over, reactivates the current package in a plugin host of its
own and steers the agent (an `agent/steer` record); a later call from a program on B works.
Every wait is a latch (A's log line, records, the lease row); nothing is timed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_cli.processes import running
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.registry.conftest import BOTH
from tests.registry.cordis.conftest import CordisHarness
from tests.registry.cordis.real_stack import program
from tests.registry.cordis.test_host_owner import AGENT, lease_rows
from tests.registry.cordis.test_replicas import seen

LEASE_S = 1.5
HOST = """\
import asyncio

async def now(args):
    if args.get("hold"):
        print("holding the call")
        await asyncio.sleep(3600)
    return {"time": "12:00", "args": args}

async def apply(ctx):
    harness.register_tool(harness.define_tool(
        name="clock_now", description="The time.",
        parameters={"type": "object", "properties": {"hold": {"type": "boolean"}}},
        execute=now))

return apply
"""
CAUGHT = (
    "try:\n"
    "    return await tools.clock_now({'hold': True})\n"
    "except Exception as exc:\n"
    "    return str(exc)"
)


class _Remote(CordisHarness):
    """A registry in another process, reached over `channel` only."""

    def __init__(self, channel: grpc.aio.Channel) -> None:  # no in-process registry to hold
        self.channel = channel
        self.stub = rpb_grpc.RegistryServiceStub(channel)
        self.hosts = None


@pytest.fixture
async def runtime() -> AsyncIterator[str]:
    started = await start_runtime(
        RuntimeSettings(listen="127.0.0.1:0", pool_size=2, shutdown_grace_s=0.2)
    )
    try:
        yield started.address
    finally:
        await started.stop(0)


async def _records(h: CordisHarness, kind: str) -> list[Any]:
    page = await h.stub.ListHistory(rpb.ListHistoryRequest(agent=AGENT))
    return [r for r in page.records if r.kind == kind]


async def test_a_registry_killed_mid_call_fails_the_call_and_a_survivor_takes_over(
    make_cordis: Any, pg_database: str, runtime: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "CODEMODE_REGISTRY_HISTORY_STORE": "postgres",
        "CODEMODE_REGISTRY_HISTORY_DSN": pg_database,
        "CODEMODE_REGISTRY_TOKEN_KEY": "5e" * 32,
        "CODEMODE_REGISTRY_CORDIS_HOST_LEASE_S": str(LEASE_S),
        "CODEMODE_REGISTRY_RUNTIME_TARGETS": json.dumps([runtime]),
        "CODEMODE_REGISTRY_TRACE_FILE": "off",
    }
    stderr = tmp_path / "a.stderr"
    async with (
        running(
            "-m", "registry_service", "--listen", "127.0.0.1:0",
            ready="registry listening on port ", env=env, stderr=stderr,
        ) as a_process,
        make_cordis(
            hosts=None,
            history_store="postgres",
            history_dsn=pg_database,
            token_key="5e" * 32,
            cordis_host_lease_s=LEASE_S,
            runtime_targets=[runtime],
        ) as b,
    ):  # fmt: skip
        a = _Remote(grpc.aio.insecure_channel(f"127.0.0.1:{a_process.rest}"))
        try:
            await a.agent("coder", mode=BOTH)
            await a.define(AGENT, HOST)
            started = await a.ok(
                AGENT, "cordis_run", {"pluginId": "clock-1", "packageId": "pkg-1", "mode": "run"}
            )
            assert started["status"] == "running", started
            [(_, a_owner, a_address, epoch)] = lease_rows(pg_database)
            assert epoch == 1 and a_address == f"127.0.0.1:{a_process.rest}"

            await seen(lambda: b.visible(AGENT), lambda names: "clock_now" in names, "on B")
            call = asyncio.ensure_future(program(b, AGENT, CAUGHT, "doomed"))

            async def logged() -> str:
                return stderr.read_text(errors="replace")

            await seen(logged, lambda text: "holding the call" in text, "the call held in A")
            assert not call.done()
            a_process.proc.send_signal(signal.SIGKILL)
            await a_process.proc.wait()

            failed = await call  # the program caught the tool's failure
            assert "was lost with the registry running its host" in failed["result"], failed
            [dispatch] = await _records(b, "tool/code-dispatch")
            assert (dispatch.tool_name, dispatch.is_error, dispatch.error_code) == (
                "clock_now",
                True,
                "ABORTED",
            )

            placement = b.registry.cordis.runner.placement
            assert placement is not None

            async def owners() -> list[tuple[str, int]]:
                return [(row[1], row[3]) for row in lease_rows(pg_database)]

            await seen(owners, lambda rows: rows == [(placement.instance, 2)], "B's lease")
            assert placement.instance != a_owner
            steers = await seen(
                lambda: _records(b, "agent/steer"),
                lambda records: any("was lost" in r.content[0].text.text for r in records),
                "the steering record",
            )
            [steer] = [
                r.content[0].text.text for r in steers if "was lost" in r.content[0].text.text
            ]
            assert f"clock-1 (run-1) ran on a registry that was lost ({a_address})" in steer
            assert "its current package pkg-1 was reactivated on another registry" in steer

            async def running_on_b() -> str:
                plugin = b.registry.cordis.runner.find(AGENT, "clock-1")
                latest = plugin.latest if plugin is not None else None
                return "" if latest is None else latest.status

            await seen(running_on_b, lambda status: status == "running", "B's own run")
            later = await program(b, AGENT, "return await tools.clock_now({'n': 2})", "later")
            assert later["result"] == {"time": "12:00", "args": {"n": 2}}
        finally:
            await a.channel.close()
