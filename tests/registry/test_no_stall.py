"""No request may stall the registry: latency probes over real gRPC while a hostile request runs.

Each test keeps a cheap RPC (GetAgent) going in a loop while the bad request is in flight and
asserts the outcome of the bad request, that probes kept completing while it ran (ordering),
and a generous bound on the slowest probe (under 1 s, where the unfixed registry stalled for
5-30 s); the measured figures are printed. Wall-clock figures are not asserted otherwise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import pytest

from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import tool_pb2
from codemode_wire.grpc_status import error_info
from registry_service.domain.json_admission import DEFAULT_LIMITS
from tests.registry.conftest import Harness, echo_tool, error_info_of
from tests.registry.test_providers import RawProvider

T = TypeVar("T")
STALL_BOUND_S = 3.0  # generous: the unfixed registry stalled every RPC for 5-30 s
# The bound is on this process's event loop: scripts/test runs these alone (pyproject.toml).
pytestmark = pytest.mark.exclusive
CPU_BOUND_S = 1.0  # backtracking took seconds of CPU; linear matching takes microseconds
# The registry and this test share one process and one event loop, so a stalled loop stalls
# the probes exactly as it stalls every other client's RPCs.


@dataclass
class Probed:
    outcome: Any  # what the bad request returned, or the AioRpcError it raised
    latencies: list[float] = field(default_factory=list)
    during: int = 0  # probes that completed after the bad request started, before it ended

    @property
    def slowest(self) -> float:
        return max(self.latencies)


async def probing(harness: Harness, bad: Awaitable[T]) -> Probed:
    """Runs `bad` while GetAgent probes loop; returns its outcome and the probes' figures."""
    agent = await harness.agent("prober")
    stop = False
    finished: list[float] = []
    latencies: list[float] = []
    warm = asyncio.Event()  # three probes done: the loop runs before the bad request starts
    after: list[asyncio.Event] = []  # set by the next probe to finish

    async def probe() -> None:
        while not stop:
            started = time.perf_counter()
            await harness.stub.GetAgent(rpb.GetAgentRequest(name=agent))
            finished.append(time.perf_counter())
            latencies.append(finished[-1] - started)
            if len(finished) >= 3:
                warm.set()
            while after:
                after.pop().set()

    task = asyncio.create_task(probe())
    await warm.wait()
    began = time.perf_counter()
    try:
        outcome: Any = await bad
    except grpc.aio.AioRpcError as error:
        outcome = error
    ended = time.perf_counter()
    # One probe more, so a probe stalled by the very end of the bad request is counted.
    next_probe = asyncio.Event()
    after.append(next_probe)
    await next_probe.wait()
    stop = True
    await task
    during = sum(began < f < ended for f in finished)
    result = Probed(outcome, latencies, during)
    print(
        f"bad request {ended - began:.3f} s; {during} probes during it; "
        f"slowest probe {result.slowest * 1000:.1f} ms of {len(latencies)}"
    )
    return result


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _big_channel(harness: Harness) -> grpc.aio.Channel:
    limit = harness.registry.settings.max_message_bytes
    return grpc.aio.insecure_channel(
        harness.running.address,
        options=[
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
        ],
    )


async def _execute_raw(channel: grpc.aio.Channel, tool: str, text: str) -> tool_pb2.ToolResult:
    from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc

    stub = rpb_grpc.RegistryServiceStub(channel)
    request = rpb.ExecuteToolCallRequest(call_id="bad", tool_name=tool, arguments_json=text)
    events = [e async for e in stub.ExecuteToolCall(request)]
    result: tool_pb2.ToolResult = events[-1].result
    return result


# -- catastrophic backtracking ----------------------------------------------------------------

EVIL_PATTERN = "^(a+)+$"
EVIL_INPUT = "a" * 27 + "!"  # 2**27 ways to split the a's: seconds of backtracking in `re`


async def test_a_backtracking_pattern_does_not_stall_the_registry(harness: Harness) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": EVIL_PATTERN}}}
    echo_tool(harness.registry, "evil", input_schema=schema)
    cpu = time.process_time()
    probed = await probing(harness, harness.execute("evil", {"s": EVIL_INPUT}))
    spent = time.process_time() - cpu
    print(f"process CPU during the call: {spent:.3f} s")
    _, result = probed.outcome
    assert result.is_error and result.error.code == "INVALID_ARGS"
    assert f'"s" must match the pattern "{EVIL_PATTERN}"' in result.error.message
    assert probed.slowest < STALL_BOUND_S
    # CPU accounting: matching is linear (microseconds); backtracking took seconds of CPU.
    assert spent < CPU_BOUND_S
    _, fine = await harness.execute("evil", {"s": "aaaa"}, call_id="ok")
    assert not fine.is_error


@pytest.mark.parametrize(
    ("pattern", "re2_message"),
    [
        ("^(?=a)", "invalid perl operator: (?="),
        ("(a)\\1", "invalid escape sequence: \\1"),
        ("(?<!x)y", "invalid perl operator: (?<!"),
    ],
)
async def test_a_pattern_re2_cannot_compile_is_refused_at_registration(
    harness: Harness, pattern: str, re2_message: str
) -> None:
    raw = await RawProvider(harness).open()
    schema = '{"type":"object","properties":{"s":{"type":"string","pattern":%s}}}' % (
        '"' + pattern.replace("\\", "\\\\") + '"'
    )
    ack = await raw.register(tool_pb2.Tool(name="lookaround", input_schema_json=schema))
    assert ack.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    info = error_info(ack.status)
    assert info is not None and info.reason == "INVALID_SCHEMA"
    message = ack.status.message
    assert 'tool "lookaround" input schema' in message
    assert f"pattern does not compile with RE2 ({re2_message})" in message
    assert "at #/properties/s/pattern" in message
    assert await harness.visible() == []
    raw.call.cancel()


# -- deep and large arguments -----------------------------------------------------------------


async def test_eight_megabytes_of_nesting_are_refused_without_a_stall(harness: Harness) -> None:
    echo_tool(harness.registry, "t")
    levels = 4_000_000
    text = '{"x":' + "[" * levels + "]" * levels + "}"  # 8 MB
    rss = _rss_mb()
    async with _big_channel(harness) as channel:
        probed = await probing(harness, _execute_raw(channel, "t", text))
    del text
    grown = _rss_mb() - rss
    print(f"RSS grew {grown:.0f} MB")
    error = probed.outcome
    assert isinstance(error, grpc.aio.AioRpcError), "the deep arguments were accepted"
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info_of(error)
    assert info is not None and info.reason == "ARGUMENTS_TOO_DEEP"
    assert info.metadata["max_depth"] == str(DEFAULT_LIMITS.max_depth)
    assert f"nests deeper than {DEFAULT_LIMITS.max_depth} levels" in str(error.details())
    assert probed.slowest < STALL_BOUND_S
    # Refused before it was built: the process keeps no hundreds of MB (it kept 557).
    assert grown < 100


async def test_large_arguments_are_parsed_and_validated_off_the_loop(harness: Harness) -> None:
    schema = {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
    }
    echo_tool(harness.registry, "sum", input_schema=schema)
    count = 500_000  # 1 MB of JSON: validating (and rendering) it on the loop took seconds
    text = '{"xs":[' + ",".join(["7"] * count) + "]}"
    async with _big_channel(harness) as channel:
        probed = await probing(harness, _execute_raw(channel, "sum", text))
    result = probed.outcome
    assert isinstance(result, tool_pb2.ToolResult) and not result.is_error
    assert result.value_json == '{"echo":' + text + "}"
    assert probed.during >= 3  # probes kept completing while the call was parsed and validated
    assert probed.slowest < STALL_BOUND_S


async def test_invalid_large_arguments_are_refused_off_the_loop(harness: Harness) -> None:
    schema = {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "string"}}},
    }
    echo_tool(harness.registry, "names", input_schema=schema)
    text = '{"xs":[' + ",".join(["7"] * 500_000) + "]}"
    async with _big_channel(harness) as channel:
        probed = await probing(harness, _execute_raw(channel, "names", text))
    result = probed.outcome
    assert isinstance(result, tool_pb2.ToolResult) and result.error.code == "INVALID_ARGS"
    assert '"xs[0]" must be a string' in result.error.message
    assert "… and 499980 more" in result.error.message
    assert probed.slowest < STALL_BOUND_S


async def test_arguments_over_max_argument_bytes_are_refused(make_registry: Any) -> None:
    async with make_registry(max_argument_bytes=64 * 1024) as harness:
        echo_tool(harness.registry, "t")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await harness.execute("t", {"blob": "x" * 70_000})
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info_of(caught.value)
        assert info is not None and info.reason == "ARGUMENTS_TOO_LARGE"
        assert info.metadata["max_bytes"] == str(64 * 1024)
        assert "max_argument_bytes" in str(caught.value.details())
        _, fits = await harness.execute("t", {"blob": "x" * 60_000}, call_id="fits")
        assert not fits.is_error


async def test_max_json_depth_is_a_setting(make_registry: Any) -> None:
    async with make_registry(max_json_depth=3) as harness:
        echo_tool(harness.registry, "t")
        _, fits = await harness.execute("t", {"a": [[[]]]})  # the innermost list is 3 deep
        assert not fits.is_error
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await harness.execute("t", {"a": [[[[]]]]}, call_id="deep")
        info = error_info_of(caught.value)
        assert info is not None and info.reason == "ARGUMENTS_TOO_DEEP"
        assert info.metadata == {"field": "arguments_json", "max_depth": "3"}


# -- provider results -------------------------------------------------------------------------


async def test_a_too_deep_provider_result_fails_only_that_call(harness: Harness) -> None:
    raw = await RawProvider(harness).open()
    await raw.register(tool_pb2.Tool(name="deep"), tool_pb2.Tool(name="fine"))
    levels = 4_000_000
    deep = tool_pb2.ToolResult(value_json="[" * levels + "]" * levels)
    call = asyncio.create_task(harness.execute("deep"))

    async def answered() -> Any:
        await raw.answer(deep)
        return await call

    probed = await probing(harness, answered())
    _, result = probed.outcome
    assert result.is_error and result.error.code == "INVALID_TOOL_OUTPUT"
    assert f"nests deeper than {DEFAULT_LIMITS.max_depth} levels" in result.error.message
    assert probed.slowest < STALL_BOUND_S
    # The provider's stream survived: its other tool still answers.
    other = asyncio.create_task(harness.execute("fine", call_id="fine"))
    await raw.answer(tool_pb2.ToolResult(value_json='"ok"'))
    _, fine = await other
    assert fine.value_json == '"ok"'
    raw.call.cancel()
