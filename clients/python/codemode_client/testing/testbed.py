"""A test's view of running services: a client, fresh agents, in-process tool providers.

    async with Testbed(services.address) as codemode:
        tools = codemode.provider("math")

        @tools.tool(concurrency_safe=True)
        async def add(args: AddArgs, ctx: Any) -> int:
            return args["a"] + args["b"]

        await tools.start()
        agent = await codemode.agent()
        conversation = await codemode.play(agent, RunCode("return await tools.add(...)"))
        trajectory = await codemode.trajectory(agent, conversation.last.call_id)

Leaving it closes the providers it made (their tools are revoked) and deletes its agents, so
tests sharing one registry do not see each other's tools or agents.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING

from codemode_client.channel import open_channel
from codemode_client.client import Language, ModeName, RegistryClient
from codemode_client.errors import CodemodeError
from codemode_client.provider import ToolProvider
from codemode_client.testing.trajectory import Trajectory
from codemode_client.testing.turn_script import Conversation, ScriptedTurn, TurnScript

if TYPE_CHECKING:
    import grpc


class Testbed:
    __test__ = False  # not a test class, whatever pytest collects

    def __init__(self, address: str) -> None:
        self.address = address
        self.client = RegistryClient(address)
        self._channel: grpc.aio.Channel | None = None
        self._providers: list[ToolProvider] = []
        self._agents: list[str] = []

    async def __aenter__(self) -> Testbed:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for provider in self._providers:
            await provider.close()
        for agent in self._agents:
            with contextlib.suppress(CodemodeError):  # the test deleted it already
                await self.client.delete_agent(agent)
        if self._channel is not None:
            await self._channel.close()
        await self.client.close()

    async def agent(
        self,
        name: str | None = None,
        *,
        mode: ModeName = "code",
        language: Language | None = None,
        preset: str = "",
    ) -> str:
        """Creates an agent (default: a fresh `test-<random>`, in `code` mode) and returns its
        name, `agents/<id>`; it is deleted when the testbed closes."""
        agent_id = name or f"test-{uuid.uuid4().hex[:10]}"
        created = await self.client.create_agent(
            agent_id, mode=mode, language=language, preset=preset
        )
        self._agents.append(created.name)
        return created.name

    def provider(self, name: str | None = None) -> ToolProvider:
        """A `ToolProvider` served from this process to the registry: declare its tools with
        `@provider.tool(...)`, then `await provider.start()`; closed with the testbed."""
        if self._channel is None:
            self._channel = open_channel(self.address)
        provider = ToolProvider(self._channel, name or f"test-tools-{uuid.uuid4().hex[:8]}")
        self._providers.append(provider)
        return provider

    async def play(self, agent: str, *turns: ScriptedTurn) -> Conversation:
        """`TurnScript(*turns).play(...)` with this testbed's client."""
        return await TurnScript(*turns).play(self.client, agent)

    async def trajectory(self, agent: str, call_id: str) -> Trajectory:
        """The call's trajectory from the registry's history."""
        return await Trajectory.load(self.client, agent, call_id)
