"""A declared stdio MCP server as a supervised child of the registry.

The SDK's own `stdio_client` inherits part of the registry's environment, runs the child as the
registry's user and buffers a line of any length, so the registry spawns the child itself and
hands the SDK's `ClientSession` the same pair of message streams the SDK's transport would:

- its own session and process group (`start_new_session`), killed as a group when it stops;
- exactly the environment the settings give it (nothing inherited, not even PATH);
- as `mcp_user` when the registry runs as root (no supplementary groups), else as the
  registry's own user (docs/security.md says what that means);
- each message line at most `max_message_bytes`, a long one parsed off the event loop (a
  longer one, or a line that is not JSON-RPC, ends the connection with that reason: a server
  that breaks the protocol is restarted, it is not trusted to resynchronise); the session's
  read and write streams (`_ServerLines`, `_ServerStdin`, of the SDK's `ReadStream` /
  `WriteStream` shape) read and write the pipes themselves: a line is read when the session
  asks for the next message, so a server the connection reads slowly waits on its own pipe;
- stderr logged line by line, each cut to 1 KiB, at most `_STDERR_LINES` lines per window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

from codemode_common.mcp_streams import MessageReader, MessageWriter
from registry_service.domain.json_admission import JsonLimits, off_loop
from registry_service.domain.mcp_servers import StdioServer

log = logging.getLogger(__name__)

_STDERR_LINE = 1024
_STDERR_LINES = 50  # per _STDERR_WINDOW_S: a chatty server cannot flood the registry's log
_STDERR_WINDOW_S = 10.0
_STOP_GRACE_S = 0.5


@dataclass(frozen=True, slots=True)
class StdioLimits:
    max_message_bytes: int
    user: str = "nobody"
    json: JsonLimits = field(default_factory=JsonLimits)
    """A line longer than `json.offload_bytes` is parsed in a worker thread."""


def _credentials(user: str) -> tuple[int, int] | None:
    """(uid, gid) to run as: `user`'s when the registry is root, else None (its own)."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


class StdioProcess:
    """One running child and the streams the SDK's session reads and writes."""

    def __init__(self, spec: StdioServer, label: str, limits: StdioLimits) -> None:
        self._spec = spec
        self._label = label
        self._limits = limits
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._process: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _end(self, why: str) -> None:
        if not self.ended.done():
            self.ended.set_result(why)

    async def start(self) -> tuple[_ServerLines, _ServerStdin]:
        credentials = _credentials(self._limits.user)
        spec = self._spec
        self._process = await asyncio.create_subprocess_exec(
            spec.command,
            *spec.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(spec.env),
            cwd=spec.cwd,
            start_new_session=True,
            user=None if credentials is None else credentials[0],
            group=None if credentials is None else credentials[1],
            extra_groups=None if credentials is None else [],
            limit=self._limits.max_message_bytes,
        )
        self._tasks = [
            asyncio.create_task(self._stderr()),
            asyncio.create_task(self._wait()),
        ]
        return _ServerLines(self), _ServerStdin(self)

    async def read_message(self) -> SessionMessage:
        """The server's next message; raises anyio.EndOfStream once the connection ended (and
        says why through `ended`)."""
        assert self._process is not None and self._process.stdout is not None
        stdout = self._process.stdout
        while True:
            try:
                line = await stdout.readline()
            except ValueError:  # asyncio's LimitOverrunError, as readline raises it
                self._end(
                    f"the server sent a message of more than {self._limits.max_message_bytes} bytes"
                )
                break
            if not line:  # most often the process exiting: say with which status
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._process.wait()), 1.0)
                code = self._process.returncode
                self._end(
                    "the server closed its stdout"
                    if code is None
                    else f"the server process exited with status {code}"
                )
                break
            if not line.strip():
                continue
            try:
                message = await off_loop(
                    self._limits.json,
                    len(line),
                    mcp_types.jsonrpc_message_adapter.validate_json,
                    line,
                    by_name=False,
                )
            except ValueError as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self._end(f"the server sent malformed JSON-RPC ({first[:200]})")
                break
            return SessionMessage(message)
        raise anyio.EndOfStream

    async def write_message(self, item: SessionMessage) -> None:
        assert self._process is not None and self._process.stdin is not None
        stdin = self._process.stdin
        if self.ended.done():
            raise anyio.BrokenResourceError
        text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
        try:
            stdin.write(text.encode() + b"\n")
            await stdin.drain()
        except (ConnectionError, OSError) as exc:
            self._end(f"writing to the server failed: {exc}")
            raise anyio.BrokenResourceError from None

    async def _stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        stderr = self._process.stderr
        window_start, lines, dropped = time.monotonic(), 0, 0
        while True:
            try:
                line = await stderr.readline()
            except ValueError:  # a line over the limit: skip what is buffered of it
                with contextlib.suppress(Exception):
                    await stderr.read(self._limits.max_message_bytes)
                line = b"[a stderr line too long to log]\n"
            if not line:
                return
            now = time.monotonic()
            if now - window_start > _STDERR_WINDOW_S:
                if dropped:
                    log.warning("MCP server %s: %d stderr lines not logged", self._label, dropped)
                window_start, lines, dropped = now, 0, 0
            if lines >= _STDERR_LINES:
                dropped += 1
                continue
            lines += 1
            text = line[:_STDERR_LINE].decode(errors="replace").rstrip()
            log.info("MCP server %s stderr: %s", self._label, text)

    async def _wait(self) -> None:
        assert self._process is not None
        code = await self._process.wait()
        self._end(f"the server process exited with status {code}")

    async def stop(self) -> None:
        """Closes stdin, then kills the process group; returns once the child is reaped."""
        process = self._process
        if process is None:
            return
        if process.returncode is None and process.stdin is not None:
            with contextlib.suppress(Exception):
                process.stdin.close()
            # Polled: `wait()` also waits for the pipes to close, which a server blocked
            # writing into a pipe nobody reads any more never does.
            for _ in range(int(_STOP_GRACE_S / 0.01)):
                if process.returncode is not None:
                    break
                await asyncio.sleep(0.01)
        # The whole group, also when the leader exited: its children must not outlive it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        # Closing the transport closes the pipes (a descendant that left the group could hold
        # them open), so that `wait()` returns once the child is reaped.
        transport = getattr(process, "_transport", None)
        if transport is not None:
            transport.close()
        await process.wait()
        self._end("stopped")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


@contextlib.asynccontextmanager
async def running(
    spec: StdioServer, label: str, limits: StdioLimits
) -> AsyncIterator[StdioProcess]:
    process = StdioProcess(spec, label, limits)
    try:
        yield process
    finally:
        # Stopping is bounded (a grace, then SIGKILL): it completes even when the task that
        # holds the connection is cancelled meanwhile, so no child outlives its connection.
        stopping = asyncio.ensure_future(process.stop())
        cancelled = False
        while not stopping.done():
            try:
                await asyncio.shield(stopping)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError


class _ServerLines(MessageReader):
    """The session's read stream: the child's stdout lines, each read and parsed when the
    session asks for the next message (no task or memory stream between the pipe and the
    session), so a server the session reads slowly waits on its own pipe."""

    def __init__(self, process: StdioProcess) -> None:
        self._process = process
        self._closed = False

    async def receive(self) -> SessionMessage | Exception:
        if self._closed:
            raise anyio.ClosedResourceError
        return await self._process.read_message()

    async def aclose(self) -> None:
        self._closed = True


class _ServerStdin(MessageWriter):
    """The session's write stream: one line per message on the child's stdin."""

    def __init__(self, process: StdioProcess) -> None:
        super().__init__()
        self._process = process

    async def write(self, item: SessionMessage) -> None:
        await self._process.write_message(item)
