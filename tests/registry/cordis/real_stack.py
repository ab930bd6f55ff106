"""A registry wired to a real runtime on loopback: host halves run in real plugin hosts
(GrpcPluginHosts over RuntimeService.Host), as in a deployment."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from codemode_wire import jsonvalue
from registry_service.config import RegistrySettings
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from runtime_service.config import RuntimeSettings
from runtime_service.languages import typescript
from runtime_service.server import start as start_runtime
from runtime_service.worker_process import WorkerSpec
from tests.registry.cordis.conftest import CordisHarness

NEEDS_NODE = pytest.mark.skipif(
    typescript.BACKEND.unavailable(WorkerSpec()) is not None, reason="no Node 20+ on this host"
)
LANGUAGES = ["python", pytest.param("typescript", marks=NEEDS_NODE)]
"""The host languages a real-host test runs for (parametrize ``language`` with it): each test
writes its host halves (and programs) once per language, next to each other."""


@contextlib.asynccontextmanager
async def real_stack(
    runtime_settings: dict[str, Any] | None = None, **registry_settings: Any
) -> AsyncIterator[CordisHarness]:
    runtime = await start_runtime(
        RuntimeSettings(
            **{"listen": "127.0.0.1:0", "pool_size": 1, "shutdown_grace_s": 0.2,
               **(runtime_settings or {})}
        )
    )  # fmt: skip
    config = RegistrySettings(
        **{
            "listen": "127.0.0.1:0",
            "history_path": ":memory:",
            "runtime_targets": [runtime.address],
            "runtime_languages": list(runtime.runtime.languages),  # what it serves
            **registry_settings,
        }
    )
    registry = await start_registry(config, build_registry(config))
    channel = grpc.aio.insecure_channel(registry.address)
    harness = CordisHarness(registry, channel)
    harness.hosts = None
    harness.runtime = runtime.runtime
    try:
        yield harness
    finally:
        await channel.close()
        await registry.stop(0)
        await runtime.stop(0)


async def program(h: CordisHarness, agent: str, code: str, call_id: str) -> Any:
    """The value of one `run_code` call (which must succeed)."""
    result = await h.call(agent, "run_code", {"code": code, "description": "cordis"}, call_id)
    assert not result.is_error, result.error.message
    return jsonvalue.loads(result.value_json)
