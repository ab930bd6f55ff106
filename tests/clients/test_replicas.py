"""One provider and one approver serving every registry replica behind a name: providers,
approvers and page runners connect to every replica, following changes.

Two real registries on loopback; the name's resolution is a function the test changes (what a
headless Service's DNS does when pods come and go)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import pytest

from codemode_client import Approver, RegistryClient, ReplicaSet, ToolProvider
from codemode_client.replicas import resolve_all, split_target
from registry_service.domain.policy import Ask, PreDecision
from tests.registry.conftest import Harness


async def until(condition: Any, *, what: str) -> None:
    for _ in range(500):
        if await condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


async def tool_names(address: str) -> set[str]:
    async with RegistryClient(address) as client:
        return {tool.name for tool in await client.list_tools()}


@contextlib.asynccontextmanager
async def serving(replicas: ReplicaSet) -> Any:
    task = asyncio.create_task(replicas.serve())
    try:
        yield replicas
    finally:
        await replicas.close()
        await task


async def test_a_provider_serves_every_replica_and_follows_the_resolution(
    make_registry: Any,
) -> None:
    async with make_registry() as one, make_registry() as two:
        a, b = one.running.address, two.running.address
        resolution: list[str] = [a]

        async def resolve() -> Sequence[str]:
            return list(resolution)

        provider = ToolProvider(None, "echoes")
        served_by: list[str] = []

        @provider.tool(input_schema={"type": "object"}, concurrency_safe=True)
        async def echo(args: Any, ctx: Any) -> Any:
            served_by.append(ctx.agent)
            return args

        async with serving(ReplicaSet("registry.test:1", provider.on_channel, refresh_s=0.05,
                                      resolve=resolve)) as replicas:  # fmt: skip
            await replicas.resolved()
            await until(lambda: _has(a, "echo"), what="echo on the first replica")
            assert "echo" not in await tool_names(b)
            # A replica appears: it is served without restarting anything.
            resolution.append(b)
            await until(lambda: _has(b, "echo"), what="echo on the second replica")
            assert replicas.addresses == sorted([a, b])
            for address, agent in ((a, "on-a"), (b, "on-b")):
                async with RegistryClient(address) as client:
                    name = (await client.create_agent(agent, mode="native")).name
                    result = await client.call("echo", {"from": agent}, agent=name)
                assert not result.is_error, result.error_message
                assert result.value == {"from": agent}
            assert served_by == ["agents/on-a", "agents/on-b"]
            # A replica goes away: its stream is closed, so the registry drops the tools.
            resolution.remove(a)
            await until(lambda: _lacks(a, "echo"), what="echo gone from the first replica")
            assert replicas.addresses == [b]
            assert "echo" in await tool_names(b)
        # Closing the set closes every stream.
        await until(lambda: _lacks(b, "echo"), what="echo gone from the second replica")


async def _has(address: str, tool: str) -> bool:
    return tool in await tool_names(address)


async def _lacks(address: str, tool: str) -> bool:
    return tool not in await tool_names(address)


async def test_an_approver_answers_requests_pending_on_any_replica(make_registry: Any) -> None:
    async with make_registry() as one, make_registry() as two:
        harnesses: list[Harness] = [one, two]
        for harness in harnesses:

            async def pre(e: Any, d: PreDecision) -> PreDecision:
                return Ask("deletes are risky") if e.name.startswith("delete") else d

            harness.registry.catalog.hooks("").pre_execute.append(pre)

            async def delete_file(inv: Any) -> Any:
                return "deleted"

            harness.registry.register_tool("delete_file", delete_file)
        addresses = [h.running.address for h in harnesses]

        async def resolve() -> Sequence[str]:
            return addresses

        asked: list[str] = []

        async def decide(request: Any) -> bool:
            asked.append(request.agent)
            return True

        def approver(channel: Any) -> Approver:
            return Approver(channel, "oncall", decide)

        async with serving(ReplicaSet("registry.test:1", approver, refresh_s=0.05,
                                      resolve=resolve)) as replicas:  # fmt: skip
            await replicas.resolved()

            async def both_connected() -> bool:  # resolved: its streams are opening still
                return all(h.registry.approvals.connected for h in harnesses)

            await until(both_connected, what="the approver's stream open on both replicas")
            for address, agent in zip(addresses, ("ops-a", "ops-b"), strict=True):
                async with RegistryClient(address) as client:
                    name = (await client.create_agent(agent, mode="native")).name
                    result = await asyncio.wait_for(client.call("delete_file", {}, agent=name), 60)
                assert not result.is_error, result.error_message
                assert result.value == "deleted"
        assert asked == ["agents/ops-a", "agents/ops-b"]


async def test_a_failed_resolution_keeps_what_is_served(make_registry: Any) -> None:
    async with make_registry() as one:
        failing = False

        async def resolve() -> Sequence[str]:
            if failing:
                raise OSError("temporary failure in name resolution")
            return [one.running.address]

        provider = ToolProvider(None, "steady")

        @provider.tool(input_schema={"type": "object"})
        async def ping(args: Any, ctx: Any) -> Any:
            return "pong"

        async with serving(ReplicaSet("registry.test:1", provider.on_channel, refresh_s=0.02,
                                      resolve=resolve)) as replicas:  # fmt: skip
            await until(lambda: _has(one.running.address, "ping"), what="ping served")
            failing = True
            for _ in range(10):  # several failed rounds
                await asyncio.sleep(0.03)
            assert replicas.addresses == [one.running.address]
            assert await _has(one.running.address, "ping")


async def test_names_resolve_to_every_address_with_the_port() -> None:
    assert await resolve_all("127.0.0.1:5005") == ["127.0.0.1:5005"]
    assert await resolve_all("[::1]:5005") == ["[::1]:5005"]
    assert "127.0.0.1:5005" in await resolve_all("localhost:5005")
    assert split_target("registry.codemode.svc:50051") == ("registry.codemode.svc", 50051)
    for bad in ("registry", "registry:", ":50051", "registry:http", "registry:70000"):
        with pytest.raises(ValueError, match="host:port"):
            split_target(bad)


async def test_a_provider_without_a_channel_says_how_to_serve_it() -> None:
    from codemode_client import ProviderError

    with pytest.raises(ProviderError, match="on_channel"):
        await ToolProvider(None, "nowhere").start()
