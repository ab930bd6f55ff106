"""Faults: a runtime killed mid-run, a provider dropped mid-call, a registry restart, forged
parent tokens."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from codemode_cli.processes import start
from codemode_client import ToolProvider
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.codemode.bridge import CodeModeConfig, RunCodeTransport
from registry_service.codemode.runtime_port import BindingCall, RunSpec, RunTerminal
from registry_service.codemode.token import TokenMinter
from registry_service.config import RegistrySettings
from registry_service.domain.scopes import Mode
from registry_service.domain.signals import never
from registry_service.domain.tools import Invocation
from registry_service.registry import build_registry
from registry_service.server import start as start_registry
from tests.codemode.conftest import Stack, value_of
from tests.procfs import alive, children
from tests.registry.conftest import CODE, Harness, error_info_of


async def _runtime_process(
    env: dict[str, str] | None = None,
) -> tuple[asyncio.subprocess.Process, str]:
    """A runtime in its own process, left to the caller to stop; and its address."""
    runtime = await start(
        "-m", "runtime_service", "--listen", "127.0.0.1:0", ready="runtime listening on port ",
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    return runtime.proc, f"127.0.0.1:{runtime.rest}"


async def test_runtime_killed_mid_run_fails_cleanly_and_settles_nested_calls(
    tmp_path: Path,
) -> None:
    proc, address = await _runtime_process()
    config = RegistrySettings(
        listen="127.0.0.1:0",
        history_path=":memory:",
        default_mode=Mode.CODE,
        runtime_targets=[address],
    )
    running = await start_registry(config, build_registry(config))
    channel = grpc.aio.insecure_channel(running.address)
    harness = Harness(running, channel)
    started = asyncio.Event()

    async def hang(inv: Any) -> Any:
        started.set()
        await inv.signal.wait()

    harness.registry.register_tool("hang", hang)
    try:
        agent = await harness.agent("victim", mode=CODE)
        call = asyncio.create_task(
            harness.execute(
                "run_code", {"code": "await tools.hang({})", "description": "hang"}, agent=agent
            )
        )
        await asyncio.wait_for(started.wait(), 20)
        workers = children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        # An outage, not the program's failure (tests/codemode/test_runtime_outage.py).
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(call, 20)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        info = error_info_of(caught.value)
        assert info is not None and info.reason == "CODE_RUNTIME_UNAVAILABLE"
        assert info.metadata["phase"] == "running"
        records = await harness.registry.history.list(
            harness.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
        )
        starts = [r.call_id for r in records if r.kind == "tool/code-dispatch-start"]
        settles = [r.call_id for r in records if r.kind == "tool/code-dispatch"]
        assert starts == settles == ["call-1:code:1"]
        assert records[-1].kind == "tool/result"
        assert records[-1].error_code == "CODE_RUNTIME_UNAVAILABLE"
        for _ in range(100):
            if not any(alive(pid) for pid in workers):
                break
            await asyncio.sleep(0.05)
        assert workers and not any(alive(pid) for pid in workers)  # no orphan workers
    finally:
        await channel.close()
        await running.stop(0)
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_provider_dropped_mid_call_fails_that_call_and_the_program_continues(
    stack: Stack,
) -> None:
    provider = ToolProvider(stack.channel, "flaky")
    started = asyncio.Event()

    @provider.tool()
    async def slow(args: Any, ctx: Any) -> Any:
        started.set()
        await asyncio.sleep(30)

    await provider.start()

    async def drop() -> None:
        await started.wait()
        await provider.close()

    dropper = asyncio.create_task(drop())
    program = (
        "try:\n"
        "    await tools.slow({})\n"
        "except ToolCallError as e:\n"
        "    print('caught:', e)\n"
        "return 'continued'"
    )
    _, result = await stack.run_code(program)
    await dropper
    value = value_of(result)
    assert value["result"] == "continued"
    assert value["logs"] == ['caught: tool provider "flaky" disconnected before returning a result']


async def test_history_survives_a_registry_restart(tmp_path: Path, make_stack: Any) -> None:
    path = str(tmp_path / "history.sqlite3")
    async with make_stack(history_path=path) as stack:
        agent = await stack.code_agent()
        await stack.run_code("print('persist me')", agent=agent)
    async with make_stack(history_path=path) as stack:
        # The agent is stored with its history (and comes back with its mode).
        got = await stack.stub.GetAgent(rpb.GetAgentRequest(name=agent))
        assert got.agent.effective_mode == CODE
        page = await stack.stub.ListHistory(rpb.ListHistoryRequest(agent=agent))
        assert [r.kind for r in page.records] == ["tool/call", "tool/result"]
        assert page.records[-1].content[0].text.text == "persist me"


class _ForgingRuntime:
    """A runtime that replays binding calls with the tokens it is told to use."""

    def __init__(self, tokens: list[bytes | None]) -> None:
        self.tokens = tokens
        self.replies: list[tuple[bool, str]] = []

    async def open_run(self, spec: RunSpec) -> Any:
        runtime = self

        class Stream:
            async def events(self) -> AsyncIterator[Any]:
                for i, token in enumerate(runtime.tokens, start=1):
                    yield BindingCall(i, "echo", "{}", spec.token if token is None else token)
                    await asyncio.sleep(0.05)
                yield RunTerminal(logs=())

            def reply(self, call_id: int, ok: bool, payload: str) -> None:
                runtime.replies.append((ok, payload))

            def cancel(self, reason: str) -> None:
                pass

            async def close(self) -> None:
                pass

        return Stream()


async def test_forged_and_foreign_tokens_are_refused(make_registry: Any) -> None:
    async with make_registry(default_mode=Mode.CODE) as h:

        async def echo(inv: Any) -> Any:
            return "ok"

        h.registry.register_tool("echo", echo)
        minter = h.registry.transport.minter
        other_run = minter.mint("another-call", "", 60)
        expired = minter.mint("call-1", "", -1)
        forged = TokenMinter().mint("call-1", "", 60)
        runtime = _ForgingRuntime([None, other_run, expired, forged, b"junk"])
        transport = RunCodeTransport(h.registry.executor, runtime, CodeModeConfig(), minter)
        invocation = Invocation(
            call_id="call-1",
            root_call_id="call-1",
            agent=None,
            tool_name="run_code",
            arguments_json='{"code":"","description":"forge"}',
            signal=never(),
            deadline=None,
        )
        result = await transport(invocation)
        assert not result.is_error
        assert runtime.replies[0] == (True, '"ok"')
        refusals = sorted(message for ok, message in runtime.replies[1:] if not ok)
        assert len(refusals) == 4
        assert all(m.startswith("nested call refused: parent token") for m in refusals)
