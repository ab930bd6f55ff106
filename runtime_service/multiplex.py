"""The runtime's side of `RuntimeService.Multiplex`: many runs over one stream.

Each run is driven by the same per-run code as a `Run` stream (`RuntimeServicer.serve_run`),
fed from the frames carrying its id; its messages go back as frames through one
`FrameBatches` (`codemode_common/frame_batches.py`): what is ready in one loop turn leaves as
one message, a lone frame at once, and a run queues at most `PER_RUN` frames there (the rest
waits in its own budgeted queue), so a flooding run delays another's frames by one batch at
most. A run's acceptance and its error end are frames too (`accepted`, `status`), carrying
what `Run` says with its initial metadata and its status.

Every run counts in the runtime's admission as on `Run` (its worker is taken from the same
pool), so a stream holds as many runs as the runtime admits. Frames for a run id this stream
never started, or one already over, are dropped (late results and cancels are normal); a
first frame that is not a start is the run's START_REQUIRED, as on `Run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from codemode_common.frame_batches import FrameBatches
from codemode_common.request_parsing import Malformed
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.errors import CodemodeError, internal, invalid_argument
from codemode_wire.grpc_status import to_status_proto

__all__ = ["PER_RUN", "RunEnded", "RunStreams"]

log = logging.getLogger(__name__)

PER_RUN = 64  # frames of one run per batch (and queued per run)
_DEFAULT_BATCH_BYTES = 4 * 1024 * 1024


class RunEnded(Exception):
    """A run ends with this error instead of a terminal (its stream's status)."""

    def __init__(self, error: CodemodeError) -> None:
        super().__init__(error.message)
        self.error = error


ServeRun = Callable[
    [pb.RunStart, AsyncIterator[pb.RunRequest | Malformed], Callable[[], Awaitable[None]]],
    AsyncGenerator[pb.RunResponse, None],
]


class RunStreams:
    """The runs of one `Multiplex` stream."""

    def __init__(self, serve_run: ServeRun, domain: str, max_message_bytes: int | None) -> None:
        self._serve_run = serve_run
        self._domain = domain
        # A batch stays under the send limit; a frame alone may use all of it.
        self._batches: FrameBatches[pb.RunResponseFrame] = FrameBatches(
            pb.RunResponseFrame.ByteSize,
            per_run=PER_RUN,
            max_bytes=(max_message_bytes or _DEFAULT_BATCH_BYTES) // 2,
        )
        self._inboxes: dict[int, asyncio.Queue[pb.RunRequest | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._highest = 0  # run ids at or below it were started (or refused) on this stream
        self._input_done = False

    async def read(
        self, requests: AsyncIterator[pb.MultiplexRequest | Malformed]
    ) -> Malformed | None:
        """Routes the client's frames to their runs; returns the undecodable message that
        ended the stream, if one did."""
        try:
            async for message in requests:
                if isinstance(message, Malformed):
                    # The stream is broken for every run on it: they end now, not at their
                    # outcomes (each task aborts its run as it is cancelled).
                    for task in self._tasks:
                        task.cancel()
                    self._batches.close()
                    return message
                for frame in message.frames:
                    self._route(frame.run_id, frame.request)
            return None
        finally:
            # The client half-closed (or the stream ended): each run's requests end, as a
            # half-closed `Run` stream's do; the response stream ends with the last run.
            self._input_done = True
            for inbox in self._inboxes.values():
                inbox.put_nowait(None)
            if not self._tasks:
                self._batches.close()

    def _route(self, run_id: int, request: pb.RunRequest) -> None:
        inbox = self._inboxes.get(run_id)
        if inbox is not None:
            inbox.put_nowait(request)
            return
        if run_id <= self._highest:
            return  # a run that is over: a late result or cancel
        self._highest = run_id
        if request.WhichOneof("kind") != "start":
            error = invalid_argument(
                "START_REQUIRED", "the first Run message must be a start message"
            )
            self._batches.put(run_id, self._status(run_id, error))
            return
        inbox = self._inboxes[run_id] = asyncio.Queue()
        task = asyncio.ensure_future(self._drive(run_id, request.start, inbox))
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._input_done and not self._tasks:
            self._batches.close()

    async def _drive(
        self, run_id: int, start: pb.RunStart, inbox: asyncio.Queue[pb.RunRequest | None]
    ) -> None:
        batches = self._batches

        async def accept() -> None:
            batches.put(run_id, pb.RunResponseFrame(run_id=run_id, accepted=True))

        try:
            async with contextlib.aclosing(self._serve_run(start, _drain(inbox), accept)) as run:
                async for message in run:
                    await batches.room(run_id)
                    batches.put(run_id, pb.RunResponseFrame(run_id=run_id, response=message))
        except RunEnded as ended:
            batches.put(run_id, self._status(run_id, ended.error))
        except Exception as exc:  # one run's failure is its own; the stream carries on
            log.exception("run %d on a multiplexed stream failed", run_id)
            status = to_status_proto(internal("RUN_FAILED", str(exc)), self._domain)
            batches.put(run_id, pb.RunResponseFrame(run_id=run_id, status=status))
        finally:
            del self._inboxes[run_id]
            batches.forget(run_id)

    def _status(self, run_id: int, error: CodemodeError) -> pb.RunResponseFrame:
        return pb.RunResponseFrame(run_id=run_id, status=to_status_proto(error, self._domain))

    async def next_batch(self) -> pb.MultiplexResponse | None:
        batch = await self._batches.next()
        if batch is None:
            return None
        return pb.MultiplexResponse(frames=[frame for _, frame in batch])

    async def close(self) -> None:
        """The stream is gone: every run still going is aborted (its worker dies) first."""
        self._batches.close()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(asyncio.gather(*self._tasks, return_exceptions=True))


async def _drain(inbox: asyncio.Queue[pb.RunRequest | None]) -> AsyncIterator[pb.RunRequest]:
    while (request := await inbox.get()) is not None:
        yield request
