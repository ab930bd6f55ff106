"""`RuntimeService.Multiplex` over real gRPC with real workers: many runs on one stream, each
following the `Run` protocol; fairness between runs (a flooding run does not hold up another's
frames); a hostile client's bad frames fail only their own run."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_status import rpc_status

from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc
from runtime_service.multiplex import PER_RUN
from runtime_service.server import RunningRuntime
from tests.runtime.conftest import connected, grpc_settings, serving, start_message

_WAIT_S = 30.0


@pytest.fixture
async def two_workers() -> AsyncIterator[RunningRuntime]:
    async with serving(grpc_settings(pool_size=2)) as running:
        yield running


class Peer:
    """The client side of one Multiplex stream, recording every batch it receives."""

    def __init__(self, stub: runtime_pb2_grpc.RuntimeServiceStub) -> None:
        self.outbox: asyncio.Queue[pb.MultiplexRequest | None] = asyncio.Queue()
        self.call: Any = stub.Multiplex(self._requests())
        self.batches: list[list[pb.RunResponseFrame]] = []

    async def _requests(self) -> AsyncIterator[pb.MultiplexRequest]:
        while (message := await self.outbox.get()) is not None:
            yield message

    def send(self, *frames: tuple[int, pb.RunRequest]) -> None:
        batch = [pb.RunRequestFrame(run_id=run_id, request=request) for run_id, request in frames]
        self.outbox.put_nowait(pb.MultiplexRequest(frames=batch))

    async def frames(self) -> AsyncIterator[pb.RunResponseFrame]:
        async with asyncio.timeout(_WAIT_S):
            async for message in self.call:
                self.batches.append(list(message.frames))
                for frame in message.frames:
                    yield frame


def _kind(frame: pb.RunResponseFrame) -> str:
    kind = frame.WhichOneof("kind")
    return str(frame.response.WhichOneof("kind") if kind == "response" else kind)


async def test_runs_share_one_stream_and_each_gets_its_own_outcome(
    two_workers: RunningRuntime,
) -> None:
    async with connected(two_workers) as stub:
        peer = Peer(stub)
        peer.send(
            (1, start_message("return (await tools.echo({'n': 1}))['echo']", "echo")),
            (2, start_message("print('two')\nreturn 2")),
        )
        outcomes: dict[int, Any] = {}
        kinds: dict[int, list[str]] = {1: [], 2: []}
        async for frame in peer.frames():
            kinds[frame.run_id].append(_kind(frame))
            if _kind(frame) == "binding_call":
                call = frame.response.binding_call
                value = json.dumps({"echo": json.loads(call.arguments_json)})
                result = pb.CallResult(call_id=call.call_id, value_json=value)
                peer.send((frame.run_id, pb.RunRequest(call_result=result)))
            elif _kind(frame) == "terminal":
                outcomes[frame.run_id] = json.loads(frame.response.terminal.success.value_json)
                if len(outcomes) == 2:
                    peer.outbox.put_nowait(None)
        assert await peer.call.code() is grpc.StatusCode.OK
        assert outcomes == {1: {"n": 1}, 2: 2}
        assert kinds == {
            1: ["accepted", "binding_call", "terminal"],
            2: ["accepted", "log", "terminal"],
        }


async def test_a_flooding_run_does_not_hold_up_another_runs_frames(
    two_workers: RunningRuntime,
) -> None:
    """Run 1 writes log lines without end; run 2 makes nested calls one after another. Run 2
    completes while run 1 is still flooding (run 1 never ends by itself), and no batch carries
    more than PER_RUN frames of one run: a frame of run 2 waits behind at most one batch.

    Each of run 2's calls is answered once a log of run 1 has arrived after it (a latch, not a
    pace: on a loaded machine run 2's calls could otherwise all fit between two of run 1's
    scheduling slices), so the two runs' frames are known to interleave."""
    flood = "while True:\n    print('x')"
    calls = 20
    chain = f"for i in range({calls}):\n    await tools.echo({{'i': i}})\nreturn 'done'"
    async with connected(two_workers) as stub:
        peer = Peer(stub)
        peer.send((1, start_message(flood, timeout_ms=600_000)))
        flooding = False
        done = None
        unanswered: list[int] = []  # run 2's calls waiting for a log of run 1 after them
        async for frame in peer.frames():
            kind = _kind(frame)
            if frame.run_id == 1 and kind == "log":
                if not flooding:
                    flooding = True  # run 1 is flooding: now start run 2 beside it
                    peer.send((2, start_message(chain, "echo")))
                for call_id in unanswered:
                    result = pb.CallResult(call_id=call_id, value_json="{}")
                    peer.send((2, pb.RunRequest(call_result=result)))
                unanswered.clear()
            elif frame.run_id == 2 and kind == "binding_call":
                unanswered.append(frame.response.binding_call.call_id)
            elif frame.run_id == 2 and kind == "terminal":
                done = frame.response.terminal.success.value_json
                peer.send((1, pb.RunRequest(cancel=pb.RunCancel(reason="enough"))))
            elif frame.run_id == 1 and kind == "terminal":
                peer.outbox.put_nowait(None)
        assert done == '"done"'
        order = [(f.run_id, _kind(f)) for batch in peer.batches for f in batch]
        # Run 1 ended only when cancelled, after run 2's terminal: it flooded all along.
        assert order.index((2, "terminal")) < order.index((1, "terminal"))
        ran_two = order[order.index((2, "accepted")) : order.index((2, "terminal"))]
        floods = sum(1 for run_id, kind in ran_two if run_id == 1 and kind == "log")
        assert floods > 0, "run 1 was not flooding while run 2 ran"
        for batch in peer.batches:
            per_run = Counter(f.run_id for f in batch)
            assert max(per_run.values()) <= PER_RUN + 2, per_run  # + acceptance and end
        terminal = next(
            f for b in peer.batches for f in b if (f.run_id, _kind(f)) == (1, "terminal")
        )
        assert terminal.response.terminal.failure.kind == pb.FAILURE_KIND_ABORT


async def test_bad_frames_fail_only_their_own_run(two_workers: RunningRuntime) -> None:
    """A first frame that is not a start, a second start, an invalid run: each ends its own
    run with the status `Run` ends with; a run beside them completes; frames for runs that are
    over are dropped."""
    bad_timeout = start_message("return 1")
    bad_timeout.start.timeout.seconds = 1
    bad_timeout.start.timeout.nanos = -1
    async with connected(two_workers) as stub:
        peer = Peer(stub)
        cancel = pb.RunRequest(cancel=pb.RunCancel(reason="no start"))
        peer.send((5, cancel), (6, bad_timeout), (7, start_message("return 7")))
        peer.send((7, start_message("return 8")))  # a second start for run 7
        peer.send((9, start_message("return 9")), (5, cancel))  # 5: refused already
        ends: dict[int, Any] = {}
        async for frame in peer.frames():
            if frame.WhichOneof("kind") == "status":
                ends[frame.run_id] = frame.status
            elif _kind(frame) == "terminal":
                ends[frame.run_id] = frame.response.terminal
            if len(ends) == 4:
                peer.outbox.put_nowait(None)
        assert await peer.call.code() is grpc.StatusCode.OK

    def reason(status: Any) -> tuple[int, str]:
        info = rpc_status.to_status(status).trailing_metadata  # the same rich status as Run's
        assert info
        return status.code, status.details[0].value.decode("utf-8", "replace")

    assert ends[5].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "START_REQUIRED" in reason(ends[5])[1]
    assert ends[6].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "INVALID_RUN" in reason(ends[6])[1]
    # Run 7: the second start broke the protocol (unless its outcome came first and stands).
    if isinstance(ends[7], pb.RunTerminal):
        assert ends[7].success.value_json == "7"
    else:
        assert "UNEXPECTED_MESSAGE" in reason(ends[7])[1]
    assert ends[9].success.value_json == "9"


async def test_undecodable_bytes_end_the_stream_as_malformed_and_its_runs_at_once(
    two_workers: RunningRuntime,
) -> None:
    """A run parked in a nested call that is never answered; then bytes that are no
    MultiplexRequest: the stream ends MALFORMED_MESSAGE without waiting for the run (its
    worker is killed: `serving` checks that no worker is left)."""
    start = pb.MultiplexRequest(
        frames=[pb.RunRequestFrame(run_id=1, request=start_message("await tools.echo({})", "echo"))]
    )
    async with grpc.aio.insecure_channel(two_workers.address) as channel:
        raw = channel.stream_stream("/codemode.runtime.v1.RuntimeService/Multiplex")
        outbox: asyncio.Queue[bytes] = asyncio.Queue()
        outbox.put_nowait(start.SerializeToString())

        async def requests() -> AsyncIterator[bytes]:
            while True:
                yield await outbox.get()

        call = raw(requests())
        seen: list[str] = []

        async def drain() -> None:
            async with asyncio.timeout(_WAIT_S):
                async for data in call:
                    for frame in pb.MultiplexResponse.FromString(data).frames:
                        seen.append(_kind(frame))
                        if _kind(frame) == "binding_call":
                            outbox.put_nowait(b"\xff\xff\xff")

        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await drain()
        assert failed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed request" in (failed.value.details() or "")
        assert seen == ["accepted", "binding_call"]


async def test_cancelling_one_run_mid_stream_leaves_the_others_interleaved_and_whole(
    two_workers: RunningRuntime,
) -> None:
    """Runs 1 and 2 make chains of nested calls side by side (two workers); run 2 is
    cancelled at its third call. Run 2 ends as an abort with that reason; run 1 answers every
    one of its calls, in order, and returns their sum; a run started after the cancel gets
    the freed worker and completes on the same stream."""
    chain = (
        "total = 0\nfor i in range(10):\n"
        "    total += (await tools.echo({'i': i}))['i']\nreturn total"
    )
    async with connected(two_workers) as stub:
        peer = Peer(stub)
        peer.send((1, start_message(chain, "echo")), (2, start_message(chain, "echo")))
        calls: dict[int, list[int]] = {1: [], 2: [], 3: []}
        ends: dict[int, pb.RunTerminal] = {}
        async for frame in peer.frames():
            kind = _kind(frame)
            if kind == "binding_call":
                call = frame.response.binding_call
                calls[frame.run_id].append(call.call_id)
                if frame.run_id == 2 and call.call_id == 3:
                    peer.send((2, pb.RunRequest(cancel=pb.RunCancel(reason="stop two"))))
                    continue
                value = json.dumps({"i": json.loads(call.arguments_json)["i"]})
                result = pb.CallResult(call_id=call.call_id, value_json=value)
                peer.send((frame.run_id, pb.RunRequest(call_result=result)))
            elif kind == "terminal":
                ends[frame.run_id] = frame.response.terminal
                if frame.run_id == 2:
                    peer.send((3, start_message(chain, "echo")))
                if len(ends) == 3:
                    peer.outbox.put_nowait(None)
        assert await peer.call.code() is grpc.StatusCode.OK
    assert ends[2].failure.kind == pb.FAILURE_KIND_ABORT
    assert ends[2].failure.message == "stop two"
    assert calls[2] == [1, 2, 3]
    for run_id in (1, 3):
        assert ends[run_id].success.value_json == "45", ends[run_id]
        assert calls[run_id] == list(range(1, 11))


async def test_frames_that_come_with_their_runs_start_are_taken_in_order(
    two_workers: RunningRuntime,
) -> None:
    """A run's frames in the same message as its start reach the run before its driver has
    started (held for it, in order): a cancel aborts it with its reason, a second start breaks
    the protocol; a half-close right behind them fails a call that can get no result."""
    waits = "try:\n    await tools.echo({})\nexcept ToolCallError as e:\n    return str(e)"
    async with connected(two_workers) as stub:
        peer = Peer(stub)
        early = pb.RunRequest(cancel=pb.RunCancel(reason="cancelled early"))
        peer.send(
            (1, start_message("return (await tools.echo({}))", "echo")),
            (1, early),
            (2, start_message("return (await tools.echo({}))", "echo")),
            (2, start_message("return 2")),
        )
        peer.send((3, start_message(waits, "echo")))
        peer.outbox.put_nowait(None)  # half-closed: no result can come for run 3's call
        ends: dict[int, Any] = {}
        async for frame in peer.frames():
            if frame.WhichOneof("kind") == "status":
                ends[frame.run_id] = frame.status
            elif _kind(frame) == "terminal":
                ends[frame.run_id] = frame.response.terminal
        assert await peer.call.code() is grpc.StatusCode.OK
    assert ends[1].failure.kind == pb.FAILURE_KIND_ABORT
    assert ends[1].failure.message == "cancelled early"
    assert ends[2].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "a second start message" in ends[2].message
    assert "half-closed" in json.loads(ends[3].success.value_json)
