"""The runtime's side of `RuntimeService.Multiplex`: many runs over one stream.

Each run is driven by the same per-run code as a `Run` stream (`RuntimeServicer.serve_run`),
fed from the frames carrying its id; its messages go back as frames through one
`FrameBatches` (`codemode_common/frame_batches.py`): what is ready in one loop turn leaves as
one message, a lone frame at once, and a run queues at most `PER_RUN` frames there (the rest
waits in its own budgeted queue), so a flooding run delays another's frames by one batch at
most. On the way in and out a frame costs no task of its own: the stream's reader hands a
run's frames to it as it routes them (`RunFeed`), and a run's messages go straight into the
batches while it has room there and nothing of it is waiting (`_RunOutgoing`).

A run's acceptance and its error end are frames too (`accepted`, `status`), carrying
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
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Protocol

from codemode_common.frame_batches import FrameBatches
from codemode_common.request_parsing import Malformed
from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.errors import CodemodeError, internal, invalid_argument
from codemode_wire.grpc_status import to_status_proto

__all__ = ["PER_RUN", "Outgoing", "RunEnded", "RunFeed", "RunStreams", "log_message"]

log = logging.getLogger(__name__)

PER_RUN = 64  # frames of one run per batch (and queued per run)
_DEFAULT_BATCH_BYTES = 4 * 1024 * 1024


class RunEnded(Exception):
    """A run ends with this error instead of a terminal (its stream's status)."""

    def __init__(self, error: CodemodeError) -> None:
        super().__init__(error.message)
        self.error = error


class Outgoing(Protocol):
    """Where a run's messages wait for its stream (an `asyncio.Queue` on `Run`): a binding
    call, a log line as its text (a message costs several times a short line), None once
    the run's execution is over."""

    def put_nowait(self, item: pb.RunResponse | str | None) -> None: ...

    async def get(self) -> pb.RunResponse | str | None: ...


def log_message(text: str) -> pb.RunResponse:
    return pb.RunResponse(log=pb.LogLine(text=text))


class RunFeed:
    """A run's frames after its start, handed to the run's `take` as the stream's reader
    routes them: no queue and no task per frame. Frames that come before the run has
    attached wait here (at most what one message carries, as the run attaches in the next
    loop turn)."""

    def __init__(self) -> None:
        self._take: Callable[[pb.RunRequest], bool] | None = None
        self._end: Callable[[], None] | None = None
        self._early: deque[pb.RunRequest] = deque()
        self._attached = False
        self._closed = False

    def attach(self, take: Callable[[pb.RunRequest], bool], end: Callable[[], None]) -> None:
        """`take` gets each frame (False: it takes no more); `end` once the client has
        half-closed."""
        self._attached = True
        self._take, self._end = take, end
        while self._early and self._take is not None:
            self.deliver(self._early.popleft())
        if self._closed:
            self.close()

    def detach(self) -> None:
        self._take = self._end = None

    def deliver(self, request: pb.RunRequest) -> None:
        if not self._attached:
            self._early.append(request)
        elif self._take is not None and not self._take(request):
            self.detach()

    def close(self) -> None:
        self._closed = True
        if self._attached and (end := self._end) is not None:
            self.detach()
            end()


class _RunOutgoing:
    """A run's messages on a `Multiplex` stream: straight into the stream's batches while the
    run has room there and none of its messages is waiting (no task wakes for them); else
    behind the others, in order, in this run's own queue, which `serve_run` hands on as the
    run's frames leave (`RunStreams._drive`)."""

    def __init__(self, batches: FrameBatches[pb.RunResponseFrame], run_id: int) -> None:
        self._batches = batches
        self._run_id = run_id
        self._queue: asyncio.Queue[pb.RunResponse | str | None] = asyncio.Queue()
        self.waiting = 0  # messages put here and not yet in the batches

    def put_nowait(self, item: pb.RunResponse | str | None) -> None:
        if item is not None and not self.waiting and self._batches.has_room(self._run_id):
            message = log_message(item) if isinstance(item, str) else item
            self._batches.put(
                self._run_id, pb.RunResponseFrame(run_id=self._run_id, response=message)
            )
            return
        if item is not None:
            self.waiting += 1
        self._queue.put_nowait(item)

    async def get(self) -> pb.RunResponse | str | None:
        return await self._queue.get()


ServeRun = Callable[
    [
        pb.RunStart,
        RunFeed,
        Callable[[], Awaitable[None]],
        Outgoing,
    ],
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
        self._feeds: dict[int, RunFeed] = {}
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
            for feed in list(self._feeds.values()):
                feed.close()
            if not self._tasks:
                self._batches.close()

    def _route(self, run_id: int, request: pb.RunRequest) -> None:
        feed = self._feeds.get(run_id)
        if feed is not None:
            feed.deliver(request)
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
        feed = self._feeds[run_id] = RunFeed()
        task = asyncio.ensure_future(self._drive(run_id, request.start, feed))
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._input_done and not self._tasks:
            self._batches.close()

    async def _drive(self, run_id: int, start: pb.RunStart, feed: RunFeed) -> None:
        batches = self._batches
        outgoing = _RunOutgoing(batches, run_id)

        async def accept() -> None:
            batches.put(run_id, pb.RunResponseFrame(run_id=run_id, accepted=True))

        try:
            run = self._serve_run(start, feed, accept, outgoing)
            async with contextlib.aclosing(run):
                # What did not go straight into the batches (and the terminal), as room is made.
                async for message in run:
                    await batches.room(run_id)
                    batches.put(run_id, pb.RunResponseFrame(run_id=run_id, response=message))
                    outgoing.waiting = max(0, outgoing.waiting - 1)
        except RunEnded as ended:
            batches.put(run_id, self._status(run_id, ended.error))
        except Exception as exc:  # one run's failure is its own; the stream carries on
            log.exception("run %d on a multiplexed stream failed", run_id)
            status = to_status_proto(internal("RUN_FAILED", str(exc)), self._domain)
            batches.put(run_id, pb.RunResponseFrame(run_id=run_id, status=status))
        finally:
            feed.detach()
            del self._feeds[run_id]
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
