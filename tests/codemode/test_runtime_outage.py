"""Code runtime outages, over real gRPC with real runtime processes.

- No runtime reachable: `run_code` ends with UNAVAILABLE CODE_RUNTIME_UNAVAILABLE, `phase:
  connect` and a RetryInfo (nothing ran), and history still holds the call and its failure.
- The runtime SIGKILLed mid-run: UNAVAILABLE CODE_RUNTIME_UNAVAILABLE, `phase: running`, no
  RetryInfo (the program may have run in part); nested calls in flight settle first.
- The runtime killed and restarted on its address: the first `run_code` after the new runtime
  reports SERVING succeeds (the registry reconnects within its short backoff).
- Several runtimes: a run goes past a dead one and one shutting down (it refuses runs) to one
  that takes it; with none left taking runs, phase `connect` again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from codemode_cli.processes import start
from codemode_client import RegistryClient, Unavailable
from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.config import ConfigError, RegistrySettings, load_settings
from registry_service.runtime_client import channel_options
from runtime_service.config import RuntimeSettings
from runtime_service.server import start as start_runtime
from tests.registry.conftest import CODE, Harness, error_info_of

REASON = "CODE_RUNTIME_UNAVAILABLE"
DOMAIN = "codemode.registry"
_WAIT_S = 60  # generous: runtimes boot worker pools on a small, loaded machine


def _free_port() -> int:
    """A loopback port nothing listens on, below the ephemeral range: no other process is
    handed it for port 0, and a reconnecting client cannot connect to itself on it (a socket
    whose ephemeral source port equals the closed destination port would take the port)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(max(1024, low - 10_000), low), 200):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free loopback port below the ephemeral range")


async def _runtime(port: int) -> tuple[asyncio.subprocess.Process, int]:
    """A runtime in its own process (the caller stops it) and its port."""
    started = await start(
        "-m",
        "runtime_service",
        "--listen",
        f"127.0.0.1:{port}",
        ready="runtime listening on port ",
        env={"CODEMODE_RUNTIME_POOL_SIZE": "1", **_env()},
    )
    return started.proc, int(started.rest)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGKILL)
    await asyncio.wait_for(proc.wait(), _WAIT_S)


def _request(code: str, agent: str, call_id: str = "run-1") -> rpb.ExecuteToolCallRequest:
    return rpb.ExecuteToolCallRequest(
        agent=agent,
        call_id=call_id,
        tool_name="run_code",
        arguments_json=jsonvalue.dumps({"code": code, "description": "outage test"}),
    )


async def _failure(
    harness: Harness, request: rpb.ExecuteToolCallRequest, events: asyncio.Queue[Any] | None = None
) -> grpc.aio.AioRpcError:
    """The error the call ends with (it must not end with a result)."""
    try:
        async for event in harness.stub.ExecuteToolCall(request):
            assert event.WhichOneof("event") != "result", event
            if events is not None:
                events.put_nowait(event)
    except grpc.aio.AioRpcError as error:
        return error
    raise AssertionError("the call ended without an error")


def _retry_delay(error: grpc.aio.AioRpcError) -> float | None:
    """Seconds of the error's `google.rpc.RetryInfo`; None without one."""
    status = rpc_status.from_call(error)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToNanoseconds()) / 1e9
    return None


async def _records(harness: Harness, agent: str) -> list[Any]:
    page = await harness.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, page_size=100))
    return list(page.records)


@contextlib.asynccontextmanager
async def _registry(make_registry: Any, port: int, **settings: Any) -> AsyncIterator[Harness]:
    async with make_registry(runtime_targets=[f"127.0.0.1:{port}"], **settings) as harness:
        yield harness


# -- (1) no runtime reachable ----------------------------------------------------------------


async def test_no_reachable_runtime_is_unavailable_retryable_and_recorded(
    make_registry: Any,
) -> None:
    async with _registry(make_registry, _free_port()) as harness:
        agent = await harness.agent("coder", mode=CODE)
        error = await _failure(harness, _request("return 1", agent))
        assert error.code() is grpc.StatusCode.UNAVAILABLE
        info = error_info_of(error)
        assert info is not None
        assert (info.reason, info.domain) == (REASON, DOMAIN)
        assert info.metadata["phase"] == "connect"
        assert _retry_delay(error) == 1.0
        assert "did not run" in error.details()

        # Nothing lost: the outer call and its failure are in history, clear for the model.
        records = await _records(harness, agent)
        assert [r.kind for r in records] == ["tool/call", "tool/result"]
        result = records[-1]
        assert (result.call_id, result.is_error, result.error_code) == ("run-1", True, REASON)
        text = result.content[0].text.text
        assert text.startswith("Error: the code runtime is unavailable")
        assert "the program did not run, so the call is safe to repeat" in text


async def test_the_python_client_exposes_the_retry_delay(make_registry: Any) -> None:
    async with _registry(make_registry, _free_port(), runtime_retry_delay_s=2.5) as harness:
        agent = await harness.agent("coder", mode=CODE)
        client = RegistryClient(harness.channel)
        with pytest.raises(Unavailable) as caught:
            await client.run_code("return 1", "retry me", agent=agent)
        error = caught.value
        assert (error.reason, error.domain) == (REASON, DOMAIN)
        assert error.metadata["phase"] == "connect"
        assert error.retry_delay == 2.5


# -- (2) the runtime lost mid-run ------------------------------------------------------------

NESTED = "await tools.hang({})\nreturn 'unreachable'"
SLEEPING = "import time\nprint('sleeping')\ntime.sleep(600)\nreturn 'unreachable'"


@pytest.mark.parametrize("program", [NESTED, SLEEPING], ids=["awaiting-a-nested-call", "sleeping"])
async def test_a_runtime_killed_mid_run_is_unavailable_not_retryable_and_settles(
    make_registry: Any, program: str
) -> None:
    proc, port = await _runtime(_free_port())
    try:
        async with _registry(make_registry, port) as harness:
            hanging = asyncio.Event()

            async def hang(inv: Any) -> Any:
                hanging.set()
                await inv.signal.wait()

            harness.registry.register_tool("hang", hang)
            agent = await harness.agent("victim", mode=CODE)
            events: asyncio.Queue[Any] = asyncio.Queue()
            call = asyncio.create_task(_failure(harness, _request(program, agent), events))
            async with asyncio.timeout(_WAIT_S):
                if program is NESTED:
                    await hanging.wait()
                else:  # the program has printed: it is running, then sleeps
                    while (await events.get()).WhichOneof("event") != "log":
                        pass
            await _kill(proc)
            error = await asyncio.wait_for(call, _WAIT_S)

            assert error.code() is grpc.StatusCode.UNAVAILABLE
            info = error_info_of(error)
            assert info is not None
            assert (info.reason, info.domain) == (REASON, DOMAIN)
            assert info.metadata["phase"] == "running"
            assert _retry_delay(error) is None  # it may have run in part: not blindly retryable
            assert "while the program was running" in error.details()

            records = await _records(harness, agent)
            kinds = [r.kind for r in records]
            if program is NESTED:
                # The nested call in flight settled, and was recorded, before the outer result.
                assert kinds == [
                    "tool/call",
                    "tool/code-dispatch-start",
                    "tool/code-dispatch",
                    "tool/result",
                ]
                assert records[2].call_id == "run-1:code:1" and records[2].is_error
            else:
                assert kinds == ["tool/call", "tool/result"]
            assert (records[-1].is_error, records[-1].error_code) == (True, REASON)
    finally:
        await _kill(proc)


# -- (3) a restarted runtime -----------------------------------------------------------------


class _RefusingListener:
    """Takes a dead runtime's port and hangs up on every connection: each one is a failed
    reconnection attempt of the registry's channel, which the test counts."""

    def __init__(self) -> None:
        self.attempts = 0
        self._changed = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def open(self, port: int) -> None:
        self._server = await asyncio.start_server(self._hang_up, "127.0.0.1", port)

    async def _hang_up(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.attempts += 1
        self._changed.set()
        writer.close()

    async def wait_for(self, attempts: int) -> None:
        while self.attempts < attempts:
            self._changed.clear()
            await self._changed.wait()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def _serving(port: int) -> None:
    """Returns once the runtime on `port` reports SERVING on its health service."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        while True:
            reply = await health.Check(request, wait_for_ready=True, timeout=_WAIT_S)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            await asyncio.sleep(0.05)


# Failed reconnection attempts before the runtime comes back. gRPC's default backoff (1 s,
# x1.6 per attempt, up to 120 s) would be ~10 s after six; the registry's is at most 0.5 s.
DOWN_ATTEMPTS = 6


async def test_a_restarted_runtime_is_used_by_the_first_call_after_it_serves(
    make_registry: Any,
) -> None:
    proc, port = await _runtime(_free_port())
    listener = _RefusingListener()
    # A start timeout well above the registry's backoff (0.5 s) and far below what gRPC's
    # default backoff would be by now: the call succeeds only if the registry reconnects soon.
    try:
        async with _registry(make_registry, port, runtime_start_timeout_s=3) as harness:
            agent = await harness.agent("coder", mode=CODE)
            client = RegistryClient(harness.channel)
            warm = await client.run_code("return 'before'", "warm", agent=agent)
            assert warm.value == {"logs": [], "result": "before"}

            await _kill(proc)
            await listener.open(port)
            async with asyncio.timeout(_WAIT_S):
                await listener.wait_for(DOWN_ATTEMPTS)
            await listener.close()
            print(f"reconnection attempts while down: {listener.attempts}")

            proc, restarted = await _runtime(port)
            assert restarted == port
            await _serving(port)

            failures: list[str] = []
            for _ in range(3):
                try:
                    result = await client.run_code("return 'after'", "restart", agent=agent)
                    break
                except Unavailable as error:
                    failures.append(error.message)
            assert not failures, f"calls failed after the runtime was SERVING: {failures}"
            assert result.value == {"logs": [], "result": "after"}
    finally:
        await listener.close()
        await _kill(proc)


# -- several runtimes: a dead one, one shutting down -------------------------------------------


async def test_runs_go_past_dead_and_shutting_down_runtimes_until_none_is_left(
    make_registry: Any,
) -> None:
    draining = await start_runtime(RuntimeSettings(listen="127.0.0.1:0", pool_size=1))
    live = await start_runtime(RuntimeSettings(listen="127.0.0.1:0", pool_size=1))
    try:
        targets = [f"127.0.0.1:{_free_port()}", draining.address, live.address]
        async with make_registry(runtime_targets=targets) as harness:
            agent = await harness.agent("coder", mode=CODE)
            client = RegistryClient(harness.channel)
            # The state a runtime is in during its shutdown grace: connected, refusing runs.
            draining.runtime.refuse_new_runs()
            for n in range(6):  # round_robin offers the draining runtime about every other run
                result = await client.run_code(f"return {n}", "spread", agent=agent)
                assert result.value == {"logs": [], "result": n}

            live.runtime.refuse_new_runs()  # now no runtime takes runs
            error = await _failure(harness, _request("return 1", agent, call_id="last"))
            assert error.code() is grpc.StatusCode.UNAVAILABLE
            info = error_info_of(error)
            assert info is not None and info.reason == REASON
            assert info.metadata["phase"] == "connect"
            assert _retry_delay(error) == 1.0
            assert "RUNTIME_SHUTTING_DOWN" in error.details() or "disposed" in error.details()
    finally:
        await draining.stop(0)
        await live.stop(0)


# -- settings --------------------------------------------------------------------------------


def test_outage_settings_defaults_and_channel_arguments() -> None:
    settings = RegistrySettings()
    assert settings.runtime_start_timeout_s == 1.0
    assert settings.runtime_reconnect_backoff_max_s == 0.5
    assert settings.runtime_retry_delay_s == 1.0
    options = dict(
        channel_options(
            settings.max_message_bytes,
            reconnect_backoff_max_s=settings.runtime_reconnect_backoff_max_s,
        )
    )
    assert options["grpc.initial_reconnect_backoff_ms"] == 100
    assert options["grpc.max_reconnect_backoff_ms"] == 500
    assert options["grpc.min_reconnect_backoff_ms"] == 1000  # gRPC's minimum connect timeout


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("runtime_start_timeout_s", "0"),
        ("runtime_start_timeout_s", "soon"),
        ("runtime_reconnect_backoff_max_s", "0"),
        ("runtime_reconnect_backoff_max_s", "inf"),
        ("runtime_retry_delay_s", "-1"),
    ],
)
def test_invalid_outage_settings_fail_clearly(
    monkeypatch: pytest.MonkeyPatch, field: str, value: str
) -> None:
    monkeypatch.setenv(f"CODEMODE_REGISTRY_{field.upper()}", value)
    with pytest.raises(ConfigError, match=field):
        load_settings()
