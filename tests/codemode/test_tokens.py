"""Parent tokens over real gRPC: a scripted runtime replays binding calls with tokens of its
choosing, at times of its choosing (the registry's token clock is faked), and the registry
answers each one on the Run stream."""

from __future__ import annotations

from typing import Any

import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from registry_service.codemode.bridge import TOKEN_MARGIN_S
from registry_service.codemode.token import TokenMinter
from tests.codemode.fake_runtime import CHANNELS, FakeRuntime, Step, registry_on
from tests.registry.conftest import Harness

ECHOED = '{"echo":{}}'


def answers(runtime: FakeRuntime) -> list[tuple[str, str]]:
    results = runtime.results
    return [(r.WhichOneof("outcome") or "", r.value_json or r.error_message) for r in results]


async def run_code(h: Harness, agent: str, deadline_s: float | None = None) -> Any:
    request = rpb.ExecuteToolCallRequest(
        agent=agent,
        call_id="call-1",
        tool_name="run_code",
        arguments_json='{"code": "pass", "description": "scripted"}',
    )
    events = [e async for e in h.stub.ExecuteToolCall(request, timeout=deadline_s)]
    return events[-1].result


@pytest.mark.parametrize("channel", CHANNELS)
async def test_a_token_lasts_the_runs_whole_wall_ceiling_and_then_expires(channel: str) -> None:
    # A two-hour wall ceiling: longer than any fixed token lifetime of an hour.
    runtime = FakeRuntime(max_wall_ms=2 * 3600 * 1000)
    async with registry_on(runtime, runtime_channel=channel) as (h, clock, agent):
        runtime.steps = [
            Step(before=clock.advance(2 * 3600 - 1)),  # the run's last allowed second
            Step(before=clock.advance(TOKEN_MARGIN_S + 2)),  # past it, and past the margin
        ]
        result = await run_code(h, agent)
    assert not result.is_error, result.error.message
    assert answers(runtime) == [
        ("value_json", ECHOED),
        ("error_message", "nested call refused: parent token expired"),
    ]


@pytest.mark.parametrize("channel", CHANNELS)
async def test_a_token_of_a_call_with_a_deadline_lasts_until_that_deadline(channel: str) -> None:
    runtime = FakeRuntime(max_wall_ms=2 * 3600 * 1000)
    async with registry_on(runtime, runtime_channel=channel) as (h, clock, agent):
        runtime.steps = [
            Step(before=clock.advance(25)),  # within the 30 s the caller allows
            Step(before=clock.advance(5 + TOKEN_MARGIN_S + 2)),  # past deadline and margin
        ]
        result = await run_code(h, agent, deadline_s=30)
    assert not result.is_error, result.error.message
    assert answers(runtime) == [
        ("value_json", ECHOED),
        ("error_message", "nested call refused: parent token expired"),
    ]
    # The runtime was told the same deadline the token is derived from.
    assert 25_000 < runtime.starts[0].timeout.ToMilliseconds() <= 31_000  # header rounding


@pytest.mark.parametrize("channel", CHANNELS)
async def test_forged_foreign_and_expired_tokens_are_refused_on_the_run_stream(
    channel: str,
) -> None:
    runtime = FakeRuntime()
    async with registry_on(runtime, runtime_channel=channel) as (h, _clock, agent):
        minter = h.registry.transport.minter

        def tampered(own: bytes) -> bytes:
            return own[:-1] + bytes([own[-1] ^ 1])

        runtime.steps = [
            Step(token=tampered),
            Step(token=lambda own: minter.mint("call-1", "agents/someone-else", 60)),
            Step(token=lambda own: minter.mint("call-1", agent, -1)),
            Step(token=lambda own: minter.mint("another-call", agent, 60)),
            Step(token=lambda own: TokenMinter().mint("call-1", agent, 60)),  # another key
            Step(token=lambda own: b"junk"),
            Step(),  # the run's own token still works after all that
        ]
        result = await run_code(h, agent)
        records = await h.registry.history.list(
            h.registry.catalog.get_agent(agent).agent_id, after_seq=0, limit=100
        )
    assert not result.is_error, result.error.message
    refused = "nested call refused: parent token "
    assert answers(runtime) == [
        ("error_message", refused + "does not verify"),
        ("error_message", refused + "belongs to another agent"),
        ("error_message", refused + "expired"),
        ("error_message", refused + "belongs to another run"),
        ("error_message", refused + "does not verify"),
        ("error_message", refused + "does not verify"),
        ("value_json", ECHOED),
    ]
    # Refused calls consume no sub-call number and leave no records.
    assert [(r.kind, r.call_id) for r in records] == [
        ("tool/call", "call-1"),
        ("tool/code-dispatch-start", "call-1:code:1"),
        ("tool/code-dispatch", "call-1:code:1"),
        ("tool/result", "call-1"),
    ]
