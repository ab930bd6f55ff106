"""A blocking twin of `RegistryClient` for code that is not async.

    with SyncRegistryClient("127.0.0.1:50051") as client:
        agent = client.create_agent("coder", mode="code")
        print(client.run_code("return 1", "one", agent=agent.name).value)

It runs the async client on a private event loop in a background thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from codemode_client.client import Language, ModeName, Progress, RegistryClient, ToolCallResult
from codemode_wire.api.registry.v1 import history_pb2, scope_pb2, tool_pb2
from codemode_wire.jsonvalue import JsonValue

T = TypeVar("T")


class SyncRegistryClient:
    def __init__(self, target: str, *, timeout: float = 30.0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="codemode-client", daemon=True
        )
        self._thread.start()
        self._client: RegistryClient = self._run(self._make(target, deadline=timeout))

    @staticmethod
    async def _make(target: str, *, deadline: float) -> RegistryClient:
        return RegistryClient(target, timeout=deadline)  # the channel binds to this loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncRegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def create_agent(
        self,
        agent_id: str,
        *,
        preset: str = "",
        mode: ModeName | None = None,
        language: Language | None = None,
    ) -> scope_pb2.Agent:
        return self._run(
            self._client.create_agent(agent_id, preset=preset, mode=mode, language=language)
        )

    def get_agent(self, name: str) -> scope_pb2.Agent:
        return self._run(self._client.get_agent(name))

    def delete_agent(self, name: str) -> None:
        self._run(self._client.delete_agent(name))

    def create_preset(
        self, preset_id: str, *, mode: ModeName | None = None, language: Language | None = None
    ) -> scope_pb2.Preset:
        return self._run(self._client.create_preset(preset_id, mode=mode, language=language))

    def list_tools(self, scope: str = "") -> list[tool_pb2.Tool]:
        return self._run(self._client.list_tools(scope))

    def call(
        self,
        tool: str,
        arguments: JsonValue = None,
        *,
        agent: str = "",
        call_id: str | None = None,
        progress: Progress = "all",
    ) -> ToolCallResult:
        return self._run(
            self._client.call(tool, arguments, agent=agent, call_id=call_id, progress=progress)
        )

    def run_code(
        self,
        code: str,
        description: str,
        *,
        agent: str = "",
        call_id: str | None = None,
        progress: Progress = "all",
    ) -> ToolCallResult:
        return self._run(
            self._client.run_code(
                code, description, agent=agent, call_id=call_id, progress=progress
            )
        )

    def history(
        self, agent: str = "", *, call_id: str = "", agent_id: str = ""
    ) -> list[history_pb2.HistoryRecord]:
        return self._run(self._client.history(agent, call_id=call_id, agent_id=agent_id))

    def record_content(
        self, agent: str, seq: int, *, agent_id: str = ""
    ) -> list[tool_pb2.ContentBlock]:
        return self._run(self._client.record_content(agent, seq, agent_id=agent_id))

    def sdk(self, scope: str = "", language: str = "") -> str:
        return self._run(self._client.sdk(scope, language))
