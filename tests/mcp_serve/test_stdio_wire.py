"""`codemode mcp serve`'s stdio wire, spoken to line by line, over both of its transports: pipes
(read and written by the event loop) and one socket as stdin and stdout (served by threads, the
fallback for anything that is not a pipe or a distinct socket). Malformed and over-long lines,
a message cut off by the end of stdin, `notifications/cancelled`, and the stdout diversion."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.codemode.conftest import Stack
from tests.codemode.test_cancellation import outer_result_record
from tests.mcp_serve.conftest import INITIALIZE, REPO, Tools, child_env, register_tools, serve_argv

PIPES, ONE_SOCKET = "pipes", "one socket"
HANG = "import os\nawait tools.hang({'uid': os.getuid()})\nreturn 'unreachable'"


class Wire:
    """`mcp serve` as a child whose stdin and stdout are two pipes or one socket."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        wire: os.stat_result,
    ) -> None:
        self.proc, self._reader, self._writer, self.wire = proc, reader, writer, wire
        self._ids = iter(range(100, 10**9))
        self.agent = ""

    @classmethod
    async def start(cls, stack: Stack, agent: str, kind: str, *extra: str) -> Wire:
        argv = serve_argv(stack.running.address, agent, *extra)
        common: dict[str, Any] = {"env": child_env(), "cwd": REPO}
        common["stderr"] = asyncio.subprocess.PIPE
        if kind == PIPES:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, **common
            )
            assert proc.stdin is not None and proc.stdout is not None
            wire = os.fstat(proc.stdin.get_extra_info("pipe").fileno())
            wire_ = cls(proc, proc.stdout, proc.stdin, wire)
        else:
            ours, theirs = socket.socketpair()
            with theirs:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=theirs.fileno(), stdout=theirs.fileno(), **common
                )
                wire = os.fstat(theirs.fileno())
            reader, writer = await asyncio.open_unix_connection(sock=ours, limit=1 << 20)
            wire_ = cls(proc, reader, writer, wire)
        await wire_.send(INITIALIZE)
        assert (await wire_.read())["id"] == 1
        await wire_.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return wire_

    async def send(self, message: Any) -> None:
        await self.send_bytes(json.dumps(message).encode() + b"\n")

    async def send_bytes(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def read(self) -> Any:
        line = await asyncio.wait_for(self._reader.readline(), 60)
        assert line, "the server closed stdout"
        return json.loads(line)

    async def ping(self) -> None:
        request_id = next(self._ids)
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": "ping"})
        assert await self.read() == {"jsonrpc": "2.0", "id": request_id, "result": {}}

    def close_input(self) -> None:
        if self._writer.can_write_eof():
            self._writer.write_eof()  # the socket: its reading half ends, its writing goes on
        else:
            self._writer.close()

    async def wait(self) -> tuple[int, str]:
        """Exit status and stderr, once the server ended by itself."""
        code = await asyncio.wait_for(self.proc.wait(), 30)
        assert self.proc.stderr is not None
        err = (await self.proc.stderr.read()).decode()
        assert "Traceback" not in err, err
        return code, err


def _fds_on(pid: int, wire: os.stat_result) -> dict[int, int]:
    """The server's descriptors on the test's pipe or socket: fd -> its open flags."""
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.stat(f"/proc/{pid}/fd/{name}")
            info = Path(f"/proc/{pid}/fdinfo/{name}").read_text()
            flags = info.split("flags:")[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue
        if (target.st_dev, target.st_ino) == (wire.st_dev, wire.st_ino):
            found[int(name)] = int(flags, 8)
    return found


@pytest.fixture
async def tools(stack: Stack) -> Tools:
    return register_tools(stack)


@pytest.fixture(params=[PIPES, ONE_SOCKET])
async def wire(request: Any, stack: Stack, tools: Tools) -> AsyncIterator[Wire]:
    agent = await stack.code_agent()
    started = await Wire.start(stack, agent, request.param, "--max-request-bytes", "4096")
    started.agent = agent
    yield started
    if started.proc.returncode is None:
        started.proc.kill()
        await started.proc.wait()


async def test_stdout_carries_only_protocol_and_pipes_are_served_by_the_event_loop(
    wire: Wire, stack: Stack
) -> None:
    pid = wire.proc.pid
    # While serving, fd 0 reads /dev/null and fd 1 is stderr: what anything else in the
    # process prints cannot reach the client.
    assert os.readlink(f"/proc/{pid}/fd/0") == os.devnull
    assert os.stat(f"/proc/{pid}/fd/1") == os.stat(f"/proc/{pid}/fd/2")
    on_wire = _fds_on(pid, wire.wire)
    assert on_wire and min(on_wire) > 2  # the wire is only on private descriptors
    nonblocking = {fd for fd, flags in on_wire.items() if flags & os.O_NONBLOCK}
    if wire.proc.stdin is not None:  # pipes: the event loop reads them (non-blocking)
        assert nonblocking
    else:  # one socket: threads, with blocking reads and writes
        assert not nonblocking
    await wire.ping()


async def test_a_malformed_line_is_skipped_and_the_server_goes_on(wire: Wire) -> None:
    await wire.send_bytes(b"this is not JSON\n")
    await wire.send_bytes(b'{"jsonrpc": "2.0", "id": 5}\n')  # JSON, but no JSON-RPC message
    await wire.send_bytes(b"\xff\xfe\n")  # not UTF-8
    await wire.send_bytes(b"\n")  # an empty line is nothing at all
    await wire.ping()
    wire.close_input()
    code, err = await wire.wait()
    assert code == 0
    assert err.count("skipped a line that is not a JSON-RPC message") == 3, err


async def test_a_huge_line_is_refused_without_being_held(wire: Wire) -> None:
    pid = wire.proc.pid

    def peak_rss_kib() -> int:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0])

    before = peak_rss_kib()
    head = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_code",'
    head += b'"arguments":{"description":"big","code":"'
    block = b"x" * (1 << 20)
    await wire.send_bytes(head)
    for _ in range(48):  # 48 MiB in one line, over a limit of 4096 bytes
        await wire.send_bytes(block)
    await wire.send_bytes(b'"}}}\n')
    refused = await wire.read()
    assert refused["id"] == 7
    assert "larger than --max-request-bytes (4096)" in refused["error"]["message"]
    # One with no id to answer is dropped (with a log line); the next one is served.
    await wire.send_bytes(b'{"params":"' + b"y" * 10_000 + b'"}\n')
    await wire.ping()
    assert peak_rss_kib() - before < 24 * 1024, "the line was held"
    wire.close_input()
    code, err = await wire.wait()
    assert code == 0 and "with no id" in err, err


async def test_the_end_of_stdin_mid_message_ends_the_server_and_cancels_the_run(
    wire: Wire, tools: Tools, stack: Stack
) -> None:
    call = {"name": "run_code", "arguments": {"code": HANG, "description": "hangs"}}
    await wire.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call})
    await asyncio.wait_for(tools.hang_started.wait(), 30)
    await wire.send_bytes(b'{"jsonrpc": "2.0", "id": 4, "method": "pi')  # and no more
    wire.close_input()
    code, err = await wire.wait()
    assert code == 0
    assert "stdin closed in the middle of a message" in err, err
    await asyncio.wait_for(tools.hang_aborted.wait(), 30)
    records = await outer_result_record(stack, wire.agent)
    assert (records[-1].tool_name, records[-1].error_code) == ("run_code", "ABORTED")


async def test_notifications_cancelled_cancels_the_run(
    wire: Wire, tools: Tools, stack: Stack
) -> None:
    call = {"name": "run_code", "arguments": {"code": HANG, "description": "hangs"}}
    await wire.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call})
    await asyncio.wait_for(tools.hang_started.wait(), 30)
    cancel = {"requestId": 3, "reason": "the user pressed stop"}
    await wire.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
    await asyncio.wait_for(tools.hang_aborted.wait(), 30)
    records = await outer_result_record(stack, wire.agent)
    assert (records[-1].tool_name, records[-1].error_code) == ("run_code", "ABORTED")
    await wire.ping()  # and it goes on serving
    wire.close_input()
    assert (await wire.wait())[0] == 0
