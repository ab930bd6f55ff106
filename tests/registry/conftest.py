"""In-process registry servers on 127.0.0.1:0 with real grpc.aio channels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from codemode_wire import jsonvalue
from codemode_wire.api.registry.v1 import history_pb2, scope_pb2, tool_pb2
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from codemode_wire.grpc_status import error_info
from registry_service.config import RegistrySettings
from registry_service.domain.policy import PostDecision
from registry_service.domain.results import ToolResult
from registry_service.domain.scopes import Mode
from registry_service.registry import Registry, build_registry
from registry_service.server import RunningRegistry, start
from tests.postgres_server import pg_database, postgres

ModeValue: TypeAlias = scope_pb2.PresentationMode.ValueType
NATIVE: ModeValue = scope_pb2.PRESENTATION_MODE_NATIVE
CODE: ModeValue = scope_pb2.PRESENTATION_MODE_CODE
BOTH: ModeValue = scope_pb2.PRESENTATION_MODE_BOTH
UNSET: ModeValue = scope_pb2.PRESENTATION_MODE_UNSPECIFIED

__all__ = ["pg_database", "postgres"]  # the real PostgreSQL fixtures, for every registry test


class Harness:
    """A running registry, a channel to it, and helpers for common calls."""

    def __init__(self, running: RunningRegistry, channel: grpc.aio.Channel) -> None:
        self.running = running
        self.registry: Registry = running.registry
        self.channel = channel
        self.stub = rpb_grpc.RegistryServiceStub(channel)

    async def agent(self, agent_id: str, preset: str = "", mode: ModeValue = UNSET) -> str:
        response = await self.stub.CreateAgent(
            rpb.CreateAgentRequest(
                agent_id=agent_id, agent=scope_pb2.Agent(preset=preset, mode=mode)
            )
        )
        return str(response.agent.name)

    async def preset(self, preset_id: str, mode: ModeValue = UNSET) -> str:
        response = await self.stub.CreatePreset(
            rpb.CreatePresetRequest(preset_id=preset_id, preset=scope_pb2.Preset(mode=mode))
        )
        return str(response.preset.name)

    async def settled(self, agent: str, call_id: str) -> history_pb2.HistoryRecord:
        """The call's `tool/result` history record, once written (a cancelled call's record
        lands after the client has gone, so poll with a bound)."""
        for _ in range(250):
            page = await self.stub.ListHistory(rpb.ListHistoryRequest(agent=agent, call_id=call_id))
            for record in page.records:
                if record.kind == "tool/result":
                    found: history_pb2.HistoryRecord = record
                    return found
            await asyncio.sleep(0.02)
        raise AssertionError(f"no tool/result record for {call_id!r} within 5 s")

    async def visible(self, scope: str = "") -> list[str]:
        response = await self.stub.ListVisibleTools(rpb.ListVisibleToolsRequest(scope=scope))
        return [t.name for t in response.tools]

    async def execute(
        self,
        name: str,
        arguments: Any = None,
        *,
        agent: str = "",
        call_id: str = "call-1",
        raw: str | None = None,
        progress: rpb.ProgressEvents.ValueType = rpb.PROGRESS_EVENTS_UNSPECIFIED,
    ) -> tuple[list[rpb.ExecuteToolCallResponse], tool_pb2.ToolResult]:
        text = raw if raw is not None else jsonvalue.dumps({} if arguments is None else arguments)
        request = rpb.ExecuteToolCallRequest(
            agent=agent,
            call_id=call_id,
            tool_name=name,
            arguments_json=text,
            progress_events=progress,
        )
        events = [e async for e in self.stub.ExecuteToolCall(request)]
        assert events and events[-1].WhichOneof("event") == "result"
        return events[:-1], events[-1].result


def error_info_of(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    """The `ErrorInfo` of a failed call's rich status; None when there is none, or when the
    rich status disagrees with the call's code (a transport error replaced the server's)."""
    try:
        status = rpc_status.from_call(error)
    except ValueError:
        return None
    return None if status is None else error_info(status)


def echo_tool(registry: Registry, name: str = "echo", scope: str = "", **kwargs: Any) -> None:
    async def body(invocation: Any) -> Any:
        return {"echo": invocation.arguments}

    registry.register_tool(name, body, description=f"{name} tool", scope=scope, **kwargs)


def watch_outcomes(harness: Harness, scope: str) -> list[tuple[str, str, str]]:
    """Post-execute and result observers of `scope`, as (stage, call id, error code)."""
    seen: list[tuple[str, str, str]] = []

    async def post(e: Any, r: ToolResult, d: PostDecision) -> PostDecision:
        seen.append(("post", e.call_id, r.error.code if r.error else ""))
        return d

    def observe(e: Any, r: ToolResult) -> None:
        seen.append(("observe", e.call_id, r.error.code if r.error else ""))

    hooks = harness.registry.catalog.hooks(scope)
    hooks.post_execute.append(post)
    hooks.observers.append(observe)
    return seen


def result_text(result: tool_pb2.ToolResult) -> str:
    return "\n".join(b.text.text for b in result.content if b.WhichOneof("block") == "text")


def blocks_of(content: Any) -> list[tuple[str, Any]]:
    """Content blocks as comparable (kind, payload) pairs: text, (mime type, data), JSON text."""
    out: list[tuple[str, Any]] = []
    for block in content:
        kind = block.WhichOneof("block")
        if kind == "text":
            out.append(("text", block.text.text))
        elif kind == "image":
            out.append(("image", (block.image.mime_type, block.image.data)))
        else:
            out.append(("json", block.json.json))
    return out


@pytest.fixture
def make_registry() -> Callable[..., AsyncIterator[Harness]]:
    """Factory: `async with make_registry(default_mode=Mode.CODE) as h:`."""
    import contextlib

    @contextlib.asynccontextmanager
    async def factory(registry: Registry | None = None, **settings: Any) -> AsyncIterator[Harness]:
        config = RegistrySettings(
            **{"listen": "127.0.0.1:0", "history_path": ":memory:", **settings}
        )
        running = await start(config, registry or build_registry(config))
        channel = grpc.aio.insecure_channel(running.address)
        try:
            yield Harness(running, channel)
        finally:
            await channel.close()
            await running.stop(0)

    return factory  # type: ignore[return-value]


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The settings of one registry database (SQLite or PostgreSQL), kept across restarts."""
    if request.param == "sqlite":
        return {"history_path": str(tmp_path / "history.sqlite3")}
    return {"history_store": "postgres", "history_dsn": request.getfixturevalue("pg_database")}


@pytest.fixture
async def harness(make_registry: Any) -> AsyncIterator[Harness]:
    async with make_registry() as h:
        yield h


@pytest.fixture
async def code_harness(make_registry: Any) -> AsyncIterator[Harness]:
    async with make_registry(default_mode=Mode.CODE) as h:
        yield h
