"""A full stack in-process: a real runtime (worker processes) and a registry wired to it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from opentelemetry.trace import TracerProvider

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.config import RegistrySettings
from registry_service.domain.scopes import Mode
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from runtime_service.config import RuntimeSettings
from runtime_service.server import RunningRuntime
from runtime_service.server import start as start_runtime
from tests.registry.conftest import CODE, Harness, make_registry


class Stack(Harness):
    runtime: RunningRuntime

    async def run_code(
        self,
        code: str,
        *,
        agent: str = "",
        call_id: str = "call-1",
        description: str = "test program",
        progress: rpb.ProgressEvents.ValueType = rpb.PROGRESS_EVENTS_UNSPECIFIED,
    ) -> tuple[list[rpb.ExecuteToolCallResponse], Any]:
        return await self.execute(
            "run_code",
            {"code": code, "description": description},
            agent=agent,
            call_id=call_id,
            progress=progress,
        )

    async def code_agent(self, agent_id: str = "coder") -> str:
        return await self.agent(agent_id, mode=CODE)


def value_of(result: Any) -> Any:
    assert not result.is_error, result.error.message
    return jsonvalue.loads(result.value_json)


__all__ = ["make_registry"]  # re-exported fixture


@pytest.fixture
def make_stack() -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def factory(
        pool_size: int = 2,
        tracer_provider: TracerProvider | None = None,
        runtime_settings: dict[str, Any] | None = None,
        **settings: Any,
    ) -> AsyncIterator[Stack]:
        """`tracer_provider`: the registry's spans go there (default: not traced);
        `runtime_settings`: the runtime's, over the defaults."""
        runtime = await start_runtime(
            RuntimeSettings(
                **{"listen": "127.0.0.1:0", "pool_size": pool_size, **(runtime_settings or {})}
            )
        )
        config = RegistrySettings(
            **{
                "listen": "127.0.0.1:0",
                "history_path": ":memory:",
                "default_mode": Mode.CODE,
                "runtime_targets": [runtime.address],
                **settings,
            }
        )
        registry = await start_registry(
            config, build_registry(config, tracer_provider=tracer_provider)
        )
        channel = grpc.aio.insecure_channel(registry.address)
        stack = Stack(registry, channel)
        stack.runtime = runtime
        try:
            yield stack
        finally:
            await channel.close()
            await registry.stop(0)
            await runtime.stop(0)

    return factory


@pytest.fixture
async def stack(make_stack: Any) -> AsyncIterator[Stack]:
    async with make_stack() as s:
        yield s
