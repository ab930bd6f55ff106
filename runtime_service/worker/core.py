"""What a worker's program runner and its plugin harness share: the channel to the runtime, the
compilation of a body into an async function, the rendering of what it raised, and the last
message.

Below both (``program.py`` runs a program, ``plugin_harness.py`` a Cordis host half; the entry
point ``bootstrap.py`` hands a fresh worker to one of them), so neither imports the other.

Stdlib only, like every module the worker imports before it isolates itself.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import select
import socket
import sys
import traceback
from collections.abc import Callable
from types import CodeType
from typing import TYPE_CHECKING, Any, NoReturn

from runtime_service.worker import flatwire, framing

if TYPE_CHECKING:
    import asyncio

__all__ = ["PROGRAM_FILENAME", "Channel", "compile_program", "finish", "render_exception"]

# The file name of the compiled body: tracebacks keep only its frames (a host half's too).
PROGRAM_FILENAME = "<program>"


class Channel:
    """Blocking sends, loop-driven receives on the channel socket.

    Binding calls go through ``queue`` (``framing.TurnBatch``): a turn's first call leaves at
    once -- one made just before a long computation must reach the runtime, and so the
    client, while the program computes, as a synchronous postMessage would -- and the calls
    that follow it in the same turn (``asyncio.gather`` over bindings, tasks woken by one read
    of replies) leave together when the turn ends. Every other message (a log, the last
    message) leaves at once, with whatever is held ahead of it in the same write.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames = framing.FrameBuffer()
        self.batch = framing.TurnBatch(self.write)
        self.inbox = bytearray()
        """What the runtime sent while a write waited (``write``), for ``receive``."""
        self._wake: Callable[[], object] | None = None

    def watch(self, loop: asyncio.AbstractEventLoop, reader: Callable[[], None]) -> None:
        """Have ``loop`` call ``reader`` whenever there may be something to ``receive``."""
        with contextlib.suppress(KeyError):
            loop.remove_reader(self.sock.fileno())  # an earlier reader (the program's)
        loop.add_reader(self.sock.fileno(), reader)
        self._wake = functools.partial(loop.call_soon, reader)

    def receive(self) -> bytes | None:
        """What the runtime sent, in order: first what a write took in, else one read (b""
        once the runtime closed the channel; None: nothing yet)."""
        if self.inbox:
            data = bytes(self.inbox)
            self.inbox.clear()
            return data
        try:
            return self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None

    def write(self, data: bytes) -> None:
        """One write of whole frames (every byte of the channel's output goes through it).

        The runtime stops reading a worker that leaves too many of its replies unread
        (``runtime_service/worker_process.py``), so while a write cannot go on, what the runtime
        sent is taken in (held in this worker's memory, its budget) and handed to the reader
        afterwards: neither side ever waits for the other.
        """
        if self._wake is None:  # no reader yet: nothing to take in for
            self.sock.sendall(data)
            return
        view = memoryview(data)
        took = False
        while view:
            try:
                view = view[self.sock.send(view, socket.MSG_DONTWAIT) :]
            except (BlockingIOError, InterruptedError):
                took = self._take_in() or took
        if took:
            self._wake()

    def _take_in(self) -> bool:
        """Wait until the channel can be written or read; read what there is to read."""
        readable, _, _ = select.select([self.sock], [self.sock], [])
        if not readable:
            return False
        try:
            data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        if not data:
            os._exit(0)  # the runtime closed the channel: the run is over
        self.inbox += data
        return True

    def send(self, message: dict[str, object]) -> None:
        self.batch.now(framing.pack(message))

    def send_frame(self, frame: bytes) -> None:
        """Write ``frame`` now, behind the frames held in this turn."""
        self.batch.now(frame)

    def queue(self, frame: bytes, loop: asyncio.AbstractEventLoop) -> None:
        """Send ``frame`` with the other frames of this loop turn (``framing.TurnBatch``)."""
        self.batch.add(frame, loop)

    def recv_blocking(self) -> dict[str, Any] | None:
        while True:
            data = self.receive() if self.inbox else self.sock.recv(1 << 16)
            if not data:
                return None
            frames = self.frames.feed(data)
            if frames:
                return dict(flatwire.loads_strict(frames[0]))


class _MarkExplicitReturns(ast.NodeTransformer):
    """``return x`` becomes ``return (x,)`` so a bare return means "no value", not None."""

    def visit_Return(self, node: ast.Return) -> ast.Return:
        if node.value is None:
            return node
        wrapped = ast.Tuple(elts=[node.value], ctx=ast.Load())
        ast.copy_location(wrapped, node.value)
        return ast.copy_location(ast.Return(value=wrapped), node)

    # Nested scopes keep their own returns.
    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AsyncFunctionDef:
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        return node

    def visit_Lambda(self, node: ast.Lambda) -> ast.Lambda:
        return node


def compile_program(source: str) -> CodeType:
    """Compile ``source`` as the body of ``async def __program__()``, keeping its line numbers."""
    tree = ast.parse(source, filename=PROGRAM_FILENAME, mode="exec")
    body = _MarkExplicitReturns().visit(tree).body or [ast.Pass(lineno=1, col_offset=0)]
    func = ast.AsyncFunctionDef(
        name="__program__",
        args=ast.arguments(
            posonlyargs=[],
            args=[],
            vararg=None,
            kwonlyargs=[],
            kw_defaults=[],
            kwarg=None,
            defaults=[],
        ),
        body=body,
        decorator_list=[],
        returns=None,
        type_comment=None,
        lineno=1,
        col_offset=0,
    )
    module = ast.Module(body=[func], type_ignores=[])
    ast.fix_missing_locations(module)
    code = compile(module, PROGRAM_FILENAME, "exec", dont_inherit=True)
    for const in code.co_consts:
        # CO_ASYNC_GENERATOR (0x200): the body used ``yield``.
        if (
            isinstance(const, CodeType)
            and const.co_name == "__program__"
            and const.co_flags & 0x200
        ):
            raise SyntaxError("'yield' outside function", (PROGRAM_FILENAME, 1, 1, ""))
    return code


def render_exception(exc: BaseException) -> str:
    """Traceback text showing only the program's own frames (chained exceptions included)."""
    try:
        report = traceback.TracebackException.from_exception(exc)
        pending = [report]
        seen: set[int] = set()
        while pending:
            item = pending.pop()
            if id(item) in seen:
                continue
            seen.add(id(item))
            item.stack = traceback.StackSummary.from_list(
                [frame for frame in item.stack if frame.filename == PROGRAM_FILENAME]
            )
            pending.extend(x for x in (item.__cause__, item.__context__) if x is not None)
            pending.extend(item.exceptions or ())
        text = "".join(report.format()).rstrip("\n")
        return text or type(exc).__name__
    except BaseException:
        return "program threw an unrenderable value"


def _flush_stdio() -> None:
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass


def finish(channel: Channel, message: dict[str, object] | bytes) -> NoReturn:
    """Send the last message, then wait to be killed.

    The output pipes are closed first: the runtime drains them to their end before it
    reports the outcome, so the end must not wait for the process to go. Nor does the worker
    exit by itself: tearing an interpreter down takes the kernel about a millisecond, and a
    runtime woken on the same CPU would wait for it before it could read the message. The
    runtime kills the worker's group as soon as the outcome is settled (or closes the channel,
    which ends the wait too).
    """
    _flush_stdio()
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)
    try:
        if isinstance(message, bytes):
            channel.send_frame(message)  # framed already (a completion value)
        else:
            channel.send(message)
        channel.sock.setblocking(True)
        while channel.sock.recv(1 << 16):
            pass
    finally:
        os._exit(0)
