"""The registry's side of `RuntimeService.Multiplex`: every run to one runtime target over one
stream (`runtime_channel: multiplexed`).

A target's stream is opened by its first run and replaced after it breaks. Outgoing frames (a
run's start, call results, cancels) go through one `FrameBatches`
(`codemode_common/frame_batches.py`): those of one loop turn as one message, a lone one at
once, fair between runs. Incoming frames are routed to their run's queue; a run's messages are
the `Run` stream's (`runtime_client.GrpcRunStream` reads the same events from them), its
acceptance and error end are frames of their own, so outcomes, `RetryInfo` and the outage
contract are those of `Run`: a stream that breaks before a run was accepted cost that run
nothing (it is tried again elsewhere), after it the run is lost (`RuntimeLost`). A run's
deadline (its timeout plus a grace) is kept here, since the stream has none.

What a run's queue holds is bounded by the runtime's budgets for it: its output budget (log
lines) and its outstanding calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc
from google.rpc import status_pb2

from codemode_common.frame_batches import FrameBatches
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc as pb_grpc

__all__ = ["PAST_DEADLINE", "Multiplexer", "MuxRun", "PastDeadline", "StreamBroken"]

_PER_RUN = 64  # frames of one run per batch
STREAM_MAX_AGE_S = 60.0
_BATCH_BYTES_SHARE = 2  # a batch is at most half the send limit (one frame may be larger)


class StreamBroken(Exception):
    """The target's stream ended: `error` is how (None: it ended without an error)."""

    def __init__(self, error: grpc.aio.AioRpcError | None) -> None:
        super().__init__(str(error) if error is not None else "the stream ended")
        self.error = error


class PastDeadline:
    """Queued for a run when its deadline passes (one timer per run, not one per frame)."""


PAST_DEADLINE = PastDeadline()

# One item of a run's queue: a message, its acceptance, its error status, the stream's end, or
# its deadline.
Incoming: TypeAlias = pb.RunResponse | bool | status_pb2.Status | StreamBroken | PastDeadline


class MuxRun:
    """One run on a target's stream."""

    def __init__(self, stream: _Stream, run_id: int) -> None:
        self._stream = stream
        self.run_id = run_id
        self.incoming: asyncio.Queue[Incoming] = asyncio.Queue()
        self.ended = False

    def send(self, request: pb.RunRequest) -> None:
        if not self.ended:
            self._stream.batches.put(
                self.run_id, pb.RunRequestFrame(run_id=self.run_id, request=request)
            )

    def end(self) -> None:
        """No more frames for this run, either way."""
        self.ended = True
        self._stream.runs.pop(self.run_id, None)
        self._stream.settle()


class _Stream:
    """One `Multiplex` call and the runs on it."""

    def __init__(self, stub: pb_grpc.RuntimeServiceStub, max_batch_bytes: int) -> None:
        self.batches: FrameBatches[pb.RunRequestFrame] = FrameBatches(
            pb.RunRequestFrame.ByteSize, per_run=_PER_RUN, max_bytes=max_batch_bytes
        )
        self.runs: dict[int, MuxRun] = {}
        self.broken = False
        self.retired = False
        self.opened_at = asyncio.get_running_loop().time()
        self._call: Any = stub.Multiplex(self._requests())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self) -> AsyncIterator[pb.MultiplexRequest]:
        while (batch := await self.batches.next()) is not None:
            yield pb.MultiplexRequest(frames=[frame for _, frame in batch])

    async def _read(self) -> None:
        error: grpc.aio.AioRpcError | None = None
        try:
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    break
                for frame in message.frames:
                    run = self.runs.get(frame.run_id)
                    if run is None:
                        continue  # a run we stopped listening to
                    kind = frame.WhichOneof("kind")
                    if kind == "response":
                        run.incoming.put_nowait(frame.response)
                    elif kind == "accepted":
                        run.incoming.put_nowait(True)
                    elif kind == "status":
                        run.incoming.put_nowait(frame.status)
        except grpc.aio.AioRpcError as exc:
            error = exc
        finally:
            self._break(StreamBroken(error))

    def _break(self, why: StreamBroken) -> None:
        self.broken = True
        self.batches.close()
        runs, self.runs = self.runs, {}
        for run in runs.values():
            run.incoming.put_nowait(why)

    async def ended(self) -> None:
        """Returns once the stream has ended (its reader has seen its end)."""
        await asyncio.shield(self._reader)

    def retire(self) -> None:
        """No new runs: the stream half-closes once the runs on it are over."""
        self.retired = True
        self.settle()

    def settle(self) -> None:
        if self.retired and not self.runs:
            self.batches.close()  # ends the requests: the runtime ends the stream

    def open(self, run_id: int, start: pb.RunStart) -> MuxRun:
        run = self.runs[run_id] = MuxRun(self, run_id)
        run.send(pb.RunRequest(start=start))
        return run

    async def close(self) -> None:
        self.batches.close()
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


class Multiplexer:
    """A runtime target's multiplexed stream, opened when first needed.

    A stream takes new runs for `max_age_s`, then is retired (it ends once its runs have) and
    the next run opens a new one: so a stream follows the channel to a new connection when the
    runtime closes the old one (`max_connection_age_s`: GOAWAY, and a DNS target reaches new
    replicas), instead of living on the old connection until that connection's grace cuts it
    with its runs."""

    def __init__(
        self,
        stub: pb_grpc.RuntimeServiceStub,
        max_message_bytes: int,
        max_age_s: float = STREAM_MAX_AGE_S,
    ) -> None:
        self._stub = stub
        self._max_batch_bytes = max_message_bytes // _BATCH_BYTES_SHARE
        self._max_age_s = max_age_s
        self._stream: _Stream | None = None
        self._retired: set[_Stream] = set()
        self._ids = itertools.count(1)
        self.streams_opened = 0

    def open(self, start: pb.RunStart) -> MuxRun:
        """Sends the run's start on the stream (a new one if there is none, it broke, or it
        is past its age)."""
        stream = self._stream
        now = asyncio.get_running_loop().time()
        if stream is not None and not stream.broken and now - stream.opened_at >= self._max_age_s:
            stream.retire()
            self._retired = {s for s in self._retired if not s.broken}
            self._retired.add(stream)
            stream = None
        if stream is None or stream.broken:
            # Opened in an empty context: the stream serves every run, so neither its gRPC
            # span nor its reader belongs to the run that happened to open it.
            stream = contextvars.Context().run(_Stream, self._stub, self._max_batch_bytes)
            self._stream = stream
            self.streams_opened += 1
        return stream.open(next(self._ids), start)

    def retire(self) -> None:
        """No new runs (the target went away): its streams end once their runs have."""
        if self._stream is not None:
            self._stream.retire()
            self._retired.add(self._stream)
            self._stream = None

    def idle(self) -> bool:
        """Whether no run is on any of its streams."""
        streams = [*self._retired, *([self._stream] if self._stream is not None else [])]
        return not any(stream.runs for stream in streams)

    async def close(self) -> None:
        streams = [*self._retired, *([self._stream] if self._stream is not None else [])]
        for stream in streams:
            await stream.close()
