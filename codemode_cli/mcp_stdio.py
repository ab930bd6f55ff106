"""`codemode mcp serve --transport stdio`: MCP over the process's stdin and stdout.

The wire. While serving, the client's stdin and stdout live on private descriptors: fd 0 reads
/dev/null and fd 1 writes to stderr, so nothing a handler, a library or a child prints reaches
the client (stdout carries only protocol); both are restored at exit.

No thread per message. The SDK's server reads and writes any object with the `ReadStream` /
`WriteStream` shape (`mcp.shared._stream_protocols`); `_Incoming` and `_Outgoing` are those, so a
line goes from the pipe to the SDK's dispatcher with no memory-stream hop. `Server.run` would
put one back: it peeks at the client's first request to choose the protocol era and then relays
every later message through a task and a memory stream to the chosen loop; `_serve` makes the
same choice on `_Incoming` itself (which replays what it read before that request) and runs the
chosen loop on it directly. A pipe or a socket is
read and written by the event loop itself (`connect_read_pipe` / `connect_write_pipe`). Anything
else (a file, a tty, or stdin and stdout being one socket, which a write-pipe transport would
close at the first byte it can read) falls back to a daemon thread reading raw chunks (a blocked
read never keeps the process alive at exit) and writes made in a worker thread.

Bounded lines (`LineSplitter`): a line is at most `limit` bytes. An over-long one is drained,
never held: it is answered with an MCP error naming the limit (through the `codemode/refused`
method this module registers) when its id can be found at the message's start or end, and
dropped with a log line otherwise. A line that is not a JSON-RPC message is logged and skipped;
a message cut off by the end of stdin is dropped (the session ends and its calls are cancelled).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import re
import signal
import stat
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import mcp_types as types
from mcp.server import runner as sdk_runner
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from codemode_common.mcp_streams import MessageReader, MessageWriter

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server
    from mcp.server.models import InitializationOptions

    from codemode_cli.mcp_adapter import AgentServer

log = logging.getLogger("codemode.mcp")

REFUSED = "codemode/refused"
"""The method an over-long request is replaced with, so that its refusal reaches its id."""
_CHUNK = 1 << 16
_OFFLOAD_BYTES = 1 << 18  # a line longer than this is parsed in a worker thread
_EDGE = 256  # bytes kept of an over-long line's start and end, to find its id
_ID = r'(-?\d{1,18}|"[^"\\]{0,100}")'
# An SDK writes `{"jsonrpc":"2.0","id":…` (Python) or `…,"id":…}` (TypeScript): an id there
# is the request's own (a nested "id" at the end would be followed by a second `}`).
_ID_AT_START = re.compile(rb'^\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*' + _ID.encode())
_ID_AT_END = re.compile(rb',\s*"id"\s*:\s*' + _ID.encode() + rb"\s*\}\s*$")
_FLUSH_AT_EXIT_S = 2.0  # how long the last answers may take to leave at exit
_STOP_GRACE_S = 5.0  # after a signal, how long the session may take to end by itself


class LineSplitter:
    """Cuts a byte stream into lines of at most `limit` bytes (with refusals in place of
    over-long ones); holds at most one line's worth plus an over-long line's two edges."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending = bytearray()
        self._over: _OverLong | None = None

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines `chunk` completes, in order."""
        lines: list[bytes] = []
        pending = self._pending
        while chunk:
            cut = chunk.find(b"\n")
            piece, chunk = (chunk, b"") if cut < 0 else (chunk[: cut + 1], chunk[cut + 1 :])
            if self._over is None and len(pending) + len(piece) > self.limit:
                self._over = _OverLong(bytes((pending + piece)[:_EDGE]), bytes(pending))
                pending.clear()
            if self._over is not None:
                self._over.add(piece)
                if cut >= 0:
                    refusal = self._over.refusal(self.limit)
                    self._over = None
                    if refusal is not None:
                        lines.append(refusal)
                continue
            pending += piece
            if cut >= 0:
                lines.append(bytes(pending))
                pending.clear()
        return lines

    def end(self) -> None:
        """The stream ended: a message it cut off is dropped, with a log line."""
        cut_off = len(self._pending) if self._over is None else self._over.size
        if cut_off and (self._over is not None or self._pending.strip()):
            log.warning("stdin closed in the middle of a message (%d bytes): dropped", cut_off)
        self._pending.clear()
        self._over = None


class _OverLong:
    """An over-long line being drained: its size, start and end (to find its id)."""

    def __init__(self, head: bytes, before: bytes) -> None:
        """`head`: the line's first bytes; `before`: what was read of it before this piece."""
        self.head, self.tail, self.size = head, before[-_EDGE:], len(before)

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        self.tail = (self.tail + piece)[-_EDGE:]

    def refusal(self, limit: int) -> bytes | None:
        """The refusal request for the line's id, or None (no id found: dropped)."""
        found = _ID_AT_START.match(self.head) or _ID_AT_END.search(self.tail)
        if found is None:
            log.warning("dropped a message of %d bytes (over %d) with no id", self.size, limit)
            return None
        request_id = json.loads(found.group(1))
        params = {"bytes": self.size, "limit": limit}
        refusal = {"jsonrpc": "2.0", "id": request_id, "method": REFUSED, "params": params}
        return json.dumps(refusal).encode()


# --- where the bytes come from and go to -------------------------------------------------


class _Source(Protocol):
    async def read(self) -> bytes:
        """The next chunk; b"" at the end."""
        ...

    def close(self) -> None:
        """Ends the stream: a pending or later `read` returns b""."""
        ...


class _Sink(Protocol):
    async def write(self, data: bytes) -> None:
        """Raises anyio.BrokenResourceError once the client stopped reading."""
        ...

    async def close(self) -> None: ...


class _PipeSource:
    """A pipe or socket read by the event loop."""

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.ReadTransport) -> None:
        self._reader, self._transport = reader, transport

    @classmethod
    async def open(cls, fd: int) -> _PipeSource:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_CHUNK, loop=loop)  # pauses the pipe past 2 x this
        pipe = os.fdopen(os.dup(fd), "rb", buffering=0)  # the transport closes its own copy
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
        )
        return cls(reader, transport)

    async def read(self) -> bytes:
        try:
            return await self._reader.read(_CHUNK)
        except OSError as exc:  # stdin broke: the session ends as at EOF
            log.warning("cannot read stdin: %s", exc)
            return b""

    def close(self) -> None:
        """Ends the stream here: a pending `read` returns b""."""
        self._transport.close()


class _ThreadSource:
    """Raw `os.read`s in a daemon thread: a buffered reader's lock, held by the thread while it
    waits, would abort the interpreter at exit."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue(maxsize=4)
        self._thread: threading.Thread | None = None
        self._closed = False

    async def read(self) -> bytes:
        if self._closed:
            return b""
        if self._thread is None:
            loop = asyncio.get_running_loop()
            self._thread = threading.Thread(
                target=self._pump, args=(loop,), name="mcp-stdin", daemon=True
            )
            self._thread.start()
        chunk = await self._chunks.get()
        return b"" if self._closed else chunk

    def _pump(self, loop: asyncio.AbstractEventLoop) -> None:
        def put(chunk: bytes) -> None:
            asyncio.run_coroutine_threadsafe(self._chunks.put(chunk), loop).result()

        try:
            while True:
                try:
                    chunk = os.read(self._fd, _CHUNK)
                except OSError as exc:
                    log.warning("cannot read stdin: %s", exc)
                    chunk = b""
                put(chunk)
                if not chunk:
                    return
        except (RuntimeError, concurrent.futures.CancelledError):
            return  # the loop closed or stopped waiting: the process is ending

    def close(self) -> None:
        """Ends the stream here (the daemon thread ends with the process or at EOF)."""
        self._closed = True
        with contextlib.suppress(asyncio.QueueFull):
            self._chunks.put_nowait(b"")


class _Drain(asyncio.Protocol):
    """The write pipe's flow control: `writable` is clear while its buffer is over the mark."""

    def __init__(self) -> None:
        self.writable = asyncio.Event()
        self.writable.set()
        self.lost = False
        self.closed = asyncio.Event()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.writable.set()
        self.closed.set()


class _PipeSink:
    """A pipe or socket written by the event loop: a write never blocks, a full pipe makes the
    writer wait (and the server's handlers with it) instead of buffering without bound."""

    def __init__(self, transport: asyncio.WriteTransport, drain: _Drain) -> None:
        self._transport, self._drain = transport, drain

    @classmethod
    async def open(cls, fd: int) -> _PipeSink:
        loop = asyncio.get_running_loop()
        drain = _Drain()
        pipe = os.fdopen(os.dup(fd), "wb", buffering=0)
        transport, _ = await loop.connect_write_pipe(lambda: drain, pipe)
        return cls(transport, drain)

    async def write(self, data: bytes) -> None:
        if self._drain.lost or self._transport.is_closing():
            raise anyio.BrokenResourceError
        self._transport.write(data)
        await self._drain.writable.wait()
        if self._drain.lost:
            raise anyio.BrokenResourceError

    async def close(self) -> None:
        self._transport.close()  # after what is buffered has been written
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drain.closed.wait(), _FLUSH_AT_EXIT_S)


class _ThreadSink:
    """Blocking writes, each in a worker thread, one at a time."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = asyncio.Lock()
        self._broken = False

    async def write(self, data: bytes) -> None:
        async with self._lock:
            if self._broken:
                raise anyio.BrokenResourceError
            try:
                await asyncio.to_thread(_write_all, self._fd, data)
            except OSError as exc:
                self._broken = True
                log.warning("cannot write stdout: %s", exc)
                raise anyio.BrokenResourceError from None

    async def close(self) -> None:
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# --- the SDK's two streams ------------------------------------------------------------------


class _Incoming(MessageReader):
    """The server's read stream: the messages of `source`'s lines, read as the server asks for
    the next one (so a client sending faster than the server reads waits on its own pipe)."""

    def __init__(self, source: _Source, splitter: LineSplitter) -> None:
        self._source, self._splitter = source, splitter
        self._lines: deque[bytes] = deque()
        self._replay: deque[SessionMessage | Exception] = deque()
        self._ended = self._closed = False

    async def opening_request(self) -> types.JSONRPCRequest | None:
        """Reads up to the client's first request (None if stdin ends first); `receive` then
        gives what was read again, in order: the SDK's own rule for choosing the era
        (`mcp.server.runner._replay_from_opening_request`), up to `_PRE_REQUEST_REPLAY_LIMIT`
        frames kept before that request, later ones dropped."""
        while True:
            try:
                item = await self._next()
            except (anyio.EndOfStream, anyio.ClosedResourceError):  # as the SDK: both end it
                return None
            if isinstance(item, SessionMessage) and isinstance(item.message, types.JSONRPCRequest):
                self._replay.append(item)
                return item.message
            if len(self._replay) < sdk_runner._PRE_REQUEST_REPLAY_LIMIT:
                self._replay.append(item)

    async def receive(self) -> SessionMessage | Exception:
        if self._replay:
            return self._replay.popleft()
        return await self._next()

    async def _next(self) -> SessionMessage | Exception:
        while not self._lines:
            if self._closed:
                raise anyio.ClosedResourceError
            if self._ended:
                raise anyio.EndOfStream
            chunk = await self._source.read()
            if not chunk:
                self._ended = True
                self._splitter.end()
            else:
                self._lines.extend(self._splitter.feed(chunk))
        line = self._lines.popleft()
        try:
            if len(line) > _OFFLOAD_BYTES:
                message = await asyncio.to_thread(_parse, line)
            else:
                message = _parse(line)
        except ValueError as exc:  # what the SDK's stdio transport does: skip it, go on
            if line.strip():
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                log.warning("skipped a line that is not a JSON-RPC message: %s", first[:200])
            return exc
        return SessionMessage(message)

    def stop(self) -> None:
        """Ends the stream as stdin's end would: the session ends, its calls are cancelled."""
        self._lines.clear()
        self._replay.clear()
        self._source.close()

    async def aclose(self) -> None:
        self._closed = True
        self._lines.clear()
        self._replay.clear()


def _parse(line: bytes) -> types.JSONRPCMessage:
    return types.jsonrpc_message_adapter.validate_json(line, by_name=False)


class _Outgoing(MessageWriter):
    """The server's write stream: one line per message, straight into `sink`."""

    def __init__(self, sink: _Sink) -> None:
        super().__init__()
        self._sink = sink

    async def write(self, item: SessionMessage) -> None:
        text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
        await self._sink.write(text.encode() + b"\n")


# --- the process's stdin and stdout ---------------------------------------------------------


@contextlib.contextmanager
def claimed_stdio() -> Iterator[tuple[int, int]]:
    """(stdin, stdout) moved to private descriptors; meanwhile fd 0 reads /dev/null and fd 1
    writes to stderr. Both are put back (and blocking again) on exit."""
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    try:
        yield wire_in, wire_out
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        for fd, wire in ((0, wire_in), (1, wire_out)):
            with contextlib.suppress(OSError):  # the event loop made the description non-blocking
                os.set_blocking(wire, True)
            with contextlib.suppress(OSError):
                os.dup2(wire, fd)
            os.close(wire)


def evented(wire_in: int, wire_out: int) -> bool:
    """Whether the event loop can serve both: each a pipe or a socket, and not one socket."""
    stat_in, stat_out = os.fstat(wire_in), os.fstat(wire_out)
    if not all(stat.S_ISFIFO(s.st_mode) or stat.S_ISSOCK(s.st_mode) for s in (stat_in, stat_out)):
        return False
    return (stat_in.st_dev, stat_in.st_ino) != (stat_out.st_dev, stat_out.st_ino)


@contextlib.asynccontextmanager
async def wire_streams(
    wire_in: int, wire_out: int, limit: int
) -> AsyncIterator[tuple[_Incoming, _Outgoing]]:
    """The SDK's read and write streams over the two descriptors (see the module doc)."""
    source: _Source
    sink: _Sink
    if evented(wire_in, wire_out):
        source, sink = await _PipeSource.open(wire_in), await _PipeSink.open(wire_out)
    else:
        log.info("stdin/stdout are not pipes: serving them with threads")
        source, sink = _ThreadSource(wire_in), _ThreadSink(wire_out)
    try:
        yield _Incoming(source, LineSplitter(limit)), _Outgoing(sink)
    finally:
        source.close()
        await sink.close()


# --- serving ----------------------------------------------------------------------------------


class _RefusedParams(types.RequestParams):
    bytes: int
    limit: int


async def _refuse(ctx: Any, params: _RefusedParams) -> types.EmptyResult:
    raise MCPError(
        types.INVALID_REQUEST,
        f"request of {params.bytes} bytes refused: larger than --max-request-bytes "
        f"({params.limit})",
    )


async def _serve(
    server: Server[Any], incoming: _Incoming, outgoing: _Outgoing, options: InitializationOptions
) -> None:
    """`server.run(incoming, outgoing, options)` without its relay task (module doc): the era
    is chosen by the SDK's own test on the client's first request, and the SDK's loop for that
    era serves the streams themselves."""
    async with server.lifespan(server) as state:
        try:
            opening = await incoming.opening_request()
            modern = (
                opening is not None
                and opening.method != "initialize"
                and sdk_runner._has_modern_envelope(opening.params)
            )
            if modern:
                await sdk_runner._serve_modern_stream(
                    server, incoming, outgoing, lifespan_state=state, raise_exceptions=False
                )
            else:
                await sdk_runner._serve_legacy_stream(
                    server,
                    incoming,
                    outgoing,
                    lifespan_state=state,
                    session_id=None,
                    init_options=options,
                    raise_exceptions=False,
                )
        finally:
            await incoming.aclose()
            await outgoing.aclose()


async def serve_stdio(agent: AgentServer, limit: int) -> None:
    """Serves one MCP client on stdin/stdout until stdin closes or SIGTERM/SIGINT.

    A signal ends the session as the end of stdin does (the server's own shutdown path: the
    calls in flight are cancelled with their RPCs); a second one, or a session that has not
    ended `_STOP_GRACE_S` later, cancels the serving task."""
    agent.server.add_request_handler(REFUSED, _RefusedParams, _refuse)
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    with claimed_stdio() as (wire_in, wire_out):
        async with wire_streams(wire_in, wire_out, limit) as (incoming, outgoing):
            signals = 0
            timers: list[asyncio.TimerHandle] = []

            def on_signal() -> None:
                nonlocal signals
                signals += 1
                if signals == 1:
                    incoming.stop()
                    timers.append(loop.call_later(_STOP_GRACE_S, task.cancel))
                else:
                    task.cancel()

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal)
            try:
                await _serve(agent.server, incoming, outgoing, agent.initialization_options())
            except asyncio.CancelledError:
                if not signals:
                    raise
            finally:
                for timer in timers:
                    timer.cancel()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
