"""The Python client's one retry policy (a gRPC service config, the same file as the
TypeScript client's), against a stand-in RegistryService over real gRPC that scripts failures:
the deadline covers every attempt, RetryInfo (as gRPC pushback) sets the wait, writes are never
retried, and a tool call is retried only when admission control refused it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_client import RegistryClient
from codemode_client.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.api.registry.v1 import scope_pb2, tool_pb2
from codemode_wire.errors import resource_exhausted, unavailable
from codemode_wire.grpc_status import abort_rpc

ROOT = Path(__file__).resolve().parents[2]


class Scripted(rpb_grpc.RegistryServiceServicer):
    def __init__(self) -> None:
        self.attempts: dict[str, list[float]] = {}
        self.get_agent_stall = 0.0  # each GetAgent waits this long, then fails
        self.failures = 0  # then this many fail with a retry delay of `delay`
        self.delay = 0.0

    def _count(self, name: str) -> int:
        self.attempts.setdefault(name, []).append(time.monotonic())
        return len(self.attempts[name])

    async def GetAgent(self, request: Any, context: Any) -> Any:
        n = self._count("GetAgent")
        if self.get_agent_stall:
            await asyncio.sleep(self.get_agent_stall)
            await abort_rpc(context, unavailable("DOWN", "down"), "test")
        if n <= self.failures:
            await abort_rpc(context, unavailable("DOWN", "down", retry_delay=self.delay), "test")
        return rpb.GetAgentResponse(agent=scope_pb2.Agent(name=request.name))

    async def CreateAgent(self, request: Any, context: Any) -> Any:
        self._count("CreateAgent")
        await abort_rpc(context, unavailable("DOWN", "down", retry_delay=0.01), "test")

    async def ExecuteToolCall(self, request: Any, context: Any) -> AsyncIterator[Any]:
        n = self._count(f"ExecuteToolCall:{request.tool_name}")
        if request.tool_name == "busy" and n <= self.failures:
            error = resource_exhausted("ADMISSION_LIMIT", "busy", retry_delay=self.delay)
            await abort_rpc(context, error, "test")
        if request.tool_name == "flaky":
            await abort_rpc(context, unavailable("DOWN", "down", retry_delay=0.01), "test")
        yield rpb.ExecuteToolCallResponse(result=tool_pb2.ToolResult(value_json='"done"'))


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Scripted, str]]:
    servicer = Scripted()  # type: ignore[abstract]  # the methods it does not script stay UNIMPLEMENTED
    server = grpc.aio.server()
    rpb_grpc.add_RegistryServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(0)


async def test_the_deadline_covers_every_attempt(scripted: tuple[Scripted, str]) -> None:
    servicer, address = scripted
    servicer.get_agent_stall = 1.5  # each attempt takes 1.5 s, then UNAVAILABLE
    async with RegistryClient(address, timeout=2.0) as client:
        began = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await client.get_agent("agents/a")
        print(f"2 s deadline, server stalling 1.5 s per attempt: {time.monotonic() - began:.2f} s")
    # The hand-written retries gave each of 4 attempts its own 2 s (about 6 s, UNAVAILABLE);
    # one deadline fits the first attempt and the start of a second.
    assert len(servicer.attempts["GetAgent"]) <= 2


async def test_reads_retry_after_the_servers_retry_delay(scripted: tuple[Scripted, str]) -> None:
    servicer, address = scripted
    servicer.failures, servicer.delay = 1, 0.4
    async with RegistryClient(address, timeout=30) as client:
        agent = await client.get_agent("agents/a")
    assert agent.name == "agents/a"
    first, second = servicer.attempts["GetAgent"]
    print(f"retry after {second - first:.3f} s (RetryInfo 0.4 s; the policy's backoff <= 0.1 s)")
    assert second - first >= 0.35  # the server's delay, not the much shorter backoff


async def test_reads_give_up_after_the_policys_attempts(scripted: tuple[Scripted, str]) -> None:
    servicer, address = scripted
    servicer.failures, servicer.delay = 100, 0.01
    async with RegistryClient(address, timeout=30) as client:
        with pytest.raises(Unavailable):
            await client.get_agent("agents/a")
    assert len(servicer.attempts["GetAgent"]) == 4


async def test_writes_are_never_retried(scripted: tuple[Scripted, str]) -> None:
    servicer, address = scripted
    async with RegistryClient(address, timeout=30) as client:
        with pytest.raises(Unavailable):
            await client.create_agent("a")
    assert len(servicer.attempts["CreateAgent"]) == 1


async def test_a_refused_tool_call_is_retried_an_unavailable_one_is_not(
    scripted: tuple[Scripted, str],
) -> None:
    servicer, address = scripted
    servicer.failures, servicer.delay = 2, 0.05
    async with RegistryClient(address, timeout=30) as client:
        result = await client.call("busy", {})
        assert result.value == "done"
        assert len(servicer.attempts["ExecuteToolCall:busy"]) == 3
        with pytest.raises(Unavailable):  # it may have run in part: never repeated
            await client.call("flaky", {})
        assert len(servicer.attempts["ExecuteToolCall:flaky"]) == 1
        servicer.failures = 100
        with pytest.raises(ResourceExhausted):
            await client.call("busy", {}, call_id="again")


def test_both_clients_ship_the_same_policy() -> None:
    python = ROOT / "clients/python/codemode_client/service_config.json"
    typescript = ROOT / "clients/typescript/src/service_config.json"
    assert python.read_bytes() == typescript.read_bytes()
