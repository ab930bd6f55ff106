"""Connection bounds of both services, attacked with raw TCP: a flood of connections that never
handshake is refused past `max_connections` and does not grow the server's descriptors, while
a client already connected is served; connections that stay silent, idle, ignore pings or
flood them are closed. Each service runs in its own process (its /proc/<pid>/fd is counted)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from codemode_cli.processes import start, stop
from codemode_client import ToolProvider
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb
from codemode_wire.api.registry.v1 import registry_service_pb2_grpc as rpb_grpc
from tests.auth.certs import Authority

BOUND = 12
FLOOD = 48
_WAIT_S = 60  # generous: the machine is small and shared
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SETTINGS, _PING, _GOAWAY, _ACK = 0x4, 0x6, 0x7, 0x1


def _env(service: str, settings: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEMODE_")}
    prefix = f"CODEMODE_{service.upper()}_"
    env.update({f"{prefix}TRACE_FILE": "off"})
    if service == "registry":
        env[f"{prefix}HISTORY_PATH"] = ":memory:"
    else:
        env[f"{prefix}POOL_SIZE"] = "0"
        env[f"{prefix}TYPESCRIPT_POOL_SIZE"] = "0"
    env.update({prefix + k.upper(): v for k, v in settings.items()})
    return env


@contextlib.asynccontextmanager
async def _service(
    service: str, settings: dict[str, str], stderr: Path | None = None
) -> AsyncIterator[tuple[int, int]]:
    """The service in a process of its own: its pid and port."""
    started = await start(
        "-m",
        f"{service}_service",
        "--listen",
        "127.0.0.1:0",
        ready=f"{service} listening on port ",
        env=_env(service, settings),
        stderr=stderr,
    )
    try:
        yield started.proc.pid, int(started.rest)
    finally:
        await stop(started.proc)


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _serving(channel: grpc.aio.Channel) -> bool:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=_WAIT_S, wait_for_ready=True)
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _channel(port: int) -> grpc.aio.Channel:
    # A connection of its own (channels with equal arguments share one otherwise).
    return grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )


@dataclass
class RawConnection:
    """A TCP connection that speaks as much HTTP/2 as asked, and notes what the server sent."""

    sock: socket.socket
    received: int = 0
    frames: list[tuple[int, bytes]] = field(default_factory=list)
    first_data: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    async def open(cls, port: int) -> RawConnection:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return cls(sock)

    async def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def read_until_closed(self, *, speak: bool = False, answer_pings: bool = False) -> None:
        """Reads until the server closes; `speak`: parse frames and ack its settings."""
        loop = asyncio.get_running_loop()
        buffer = b""
        try:
            while data := await loop.sock_recv(self.sock, 65536):
                self.received += len(data)
                self.first_data.set()
                if not speak:
                    continue
                buffer += data
                while len(buffer) >= 9 and len(buffer) >= 9 + (n := int.from_bytes(buffer[:3])):
                    kind, flags, payload = buffer[3], buffer[4], buffer[9 : 9 + n]
                    buffer = buffer[9 + n :]
                    self.frames.append((kind, payload))
                    if kind == _SETTINGS and not flags & _ACK:
                        await self.send(_frame(_SETTINGS, _ACK))
                    elif kind == _PING and not flags & _ACK and answer_pings:
                        await self.send(_frame(_PING, _ACK, payload))
        except OSError:
            pass
        finally:
            self.ended.set()
            self.sock.close()

    def goaway_reasons(self) -> list[bytes]:
        return [payload[8:] for kind, payload in self.frames if kind == _GOAWAY]

    def server_pinged(self) -> bool:
        return any(kind == _PING for kind, _ in self.frames)


def _frame(kind: int, flags: int = 0, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3) + bytes([kind, flags]) + bytes(4) + payload


@pytest.mark.parametrize("service", ["registry", "runtime"])
async def test_a_flood_of_silent_connections_is_bounded(service: str) -> None:
    """FLOOD connections that never handshake, against a bound of BOUND: the ones past it are
    closed at once, unread; the server's descriptors grow by at most the bound; the client
    connected before the flood is served throughout, and once the flood lets go a new one
    connects. (The handshake timeout is long here: closing is the next test's.)"""
    async with _service(service, {"max_connections": str(BOUND), "handshake_timeout_s": "600"}) as (
        pid,
        port,
    ):
        async with _channel(port) as legit:
            assert await _serving(legit)
            before = _descriptors(pid)
            flood = [await RawConnection.open(port) for _ in range(FLOOD)]
            readers = [asyncio.create_task(c.read_until_closed()) for c in flood]
            try:
                # Each connection is either admitted (the server sends its HTTP/2 settings at
                # once) or refused (closed with nothing sent): wait until each is one or the
                # other.
                async with asyncio.timeout(_WAIT_S):
                    for c in flood:
                        await asyncio.wait(
                            [asyncio.create_task(e.wait()) for e in (c.first_data, c.ended)],
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                refused = [c for c in flood if c.ended.is_set() and c.received == 0]
                admitted = [c for c in flood if c.received > 0]
                held = _descriptors(pid) - before
                assert len(admitted) == BOUND - 1, (len(admitted), len(refused))  # legit: 1
                assert len(refused) == FLOOD - (BOUND - 1)
                assert held <= BOUND, f"{held} more descriptors for {FLOOD} connections"
                # The client connected before the flood is served while it lasts.
                assert await _serving(legit)
                assert not any(c.ended.is_set() for c in admitted)
            finally:
                for c in flood:
                    with contextlib.suppress(OSError):  # those the server closed
                        c.sock.shutdown(socket.SHUT_RDWR)
                await asyncio.gather(*readers)
        # The flood gone, its places are free again: a new client connects.
        async with _channel(port) as fresh:
            assert await _serving(fresh)


class FreezingProxy:
    """A TCP proxy that forwards until `freeze()`, then neither forwards nor closes anything:
    to the server, its client has vanished without a word (a host gone, a cut cable)."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._frozen = asyncio.Event()
        self.server_closed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def freeze(self) -> None:
        self._frozen.set()

    async def close(self) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        self._writers += [writer, up_writer]
        for task in (
            asyncio.create_task(self._pump(reader, up_writer, upstream=False)),
            asyncio.create_task(self._pump(up_reader, writer, upstream=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                if not self._frozen.is_set():
                    dst.write(data)
                    await dst.drain()
        if upstream and self._frozen.is_set():
            self.server_closed.set()


async def test_silent_idle_vanished_and_ping_flooding_connections_are_closed() -> None:
    """Past the handshake timeout a connection that sent nothing is closed; one that only
    idles is closed after max_connection_idle_s; a provider whose host vanished (its stream
    open, its pings unanswered) is closed after keepalive_time_s + keepalive_timeout_s, and its
    tools are revoked; one that floods pings gets GOAWAY too_many_pings. A gRPC client is
    served after all of it (reconnecting if idle closed its connection)."""
    settings = {
        "handshake_timeout_s": "2",
        "max_connection_idle_s": "3",
        "keepalive_time_s": "1",
        "keepalive_timeout_s": "1",
    }
    async with _service("registry", settings) as (_pid, port), _channel(port) as legit:
        assert await _serving(legit)
        proxy = FreezingProxy(port)
        provider_channel = _channel(await proxy.start())
        provider = ToolProvider(provider_channel, "vanishing")

        @provider.tool()
        async def ping(args: Any, ctx: Any) -> Any:
            return "pong"

        try:
            await provider.start()
            assert "ping" in await _visible(legit)
            silent, idle, pinger = [await RawConnection.open(port) for _ in range(3)]
            hello = _PREFACE + _frame(_SETTINGS)
            for c in (idle, pinger):
                await c.send(hello)
            readers = [
                asyncio.create_task(silent.read_until_closed()),
                asyncio.create_task(idle.read_until_closed(speak=True, answer_pings=True)),
                asyncio.create_task(pinger.read_until_closed(speak=True, answer_pings=True)),
            ]
            for _ in range(8):  # far more strikes than max_ping_strikes (2) allows
                await pinger.send(_frame(_PING, 0, bytes(8)))
            proxy.freeze()
            async with asyncio.timeout(_WAIT_S):
                await asyncio.gather(*readers)
                await proxy.server_closed.wait()
            # Each was closed by the server (the reads ended in EOF; nothing here closed them).
            assert silent.received > 0  # its settings, then nothing
            assert idle.goaway_reasons(), idle.frames
            assert b"too_many_pings" in pinger.goaway_reasons(), pinger.frames
            # The stream's end revokes its tools (the registry cancels it as the connection
            # closes, a moment after the proxy saw it close).
            for _ in range(1200):
                if "ping" not in await _visible(legit):
                    break
                await asyncio.sleep(0.05)
            assert "ping" not in await _visible(legit)
            assert await _serving(legit)
        finally:
            provider._drop_call()
            await provider_channel.close()
            await proxy.close()


async def _visible(channel: grpc.aio.Channel) -> list[str]:
    stub = rpb_grpc.RegistryServiceStub(channel)
    reply = await stub.ListVisibleTools(
        rpb.ListVisibleToolsRequest(), timeout=_WAIT_S, wait_for_ready=True
    )
    return [t.name for t in reply.tools]


async def test_failed_tls_handshakes_are_not_logged_one_by_one(tmp_path: Path) -> None:
    """Connections that open a TLS handshake with garbage are closed, and the server's log
    does not grow a line per attempt (grpc core logs each failed handshake at INFO)."""
    cert, key = Authority().server().write(tmp_path, "registry")
    log = tmp_path / "stderr"
    tls = {"tls_cert_file": str(cert), "tls_key_file": str(key)}
    async with _service("registry", {"handshake_timeout_s": "2", **tls}, log) as (_pid, port):
        flood = [await RawConnection.open(port) for _ in range(FLOOD)]
        for c in flood:
            await c.send(b"\x16\x03\x01\x00\x05hello")  # a record too short to be a hello
        async with asyncio.timeout(_WAIT_S):
            await asyncio.gather(*(c.read_until_closed() for c in flood))
    lines = log.read_text().splitlines()
    assert len(lines) < FLOOD // 4, lines[-5:]
