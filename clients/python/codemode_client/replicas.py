"""Serve every registry replica behind one name: one stream per address, following changes.

Several registries can share one store (PostgreSQL): any replica may serve any call, so a tool
provider, an approver or a page runner must be connected to all of them, or calls landing on
a replica it does not know fail as unknown tools. A load-balanced channel cannot do that (it
sends each stream to one backend). `ReplicaSet` resolves the name itself -- every A/AAAA
address, as the headless Service of deploy/k8s publishes one per pod -- keeps one channel and
one served stream per address, and resolves again every `refresh_s`: a new replica is served
within that period, a removed one is closed.

    provider = ToolProvider(None, "files")      # the channel is given per replica
    @provider.tool(...)
    async def read(args, ctx): ...

    replicas = ReplicaSet("registry.codemode.svc:50051", provider.on_channel)
    await replicas.serve()                      # until replicas.close()

    ReplicaSet(target, lambda channel: Approver(channel, "oncall", decide))

TLS: each channel dials an address but verifies the certificate for the name (the target's
host is the TLS server name and the `:authority`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from codemode_client.channel import open_channel

__all__ = ["ReplicaSet", "Served", "resolve_all", "split_target"]

_log = logging.getLogger(__name__)


class Served(Protocol):
    """A provider or an approver: serves until closed, reconnecting on its own."""

    async def serve(self) -> None: ...

    async def close(self) -> None: ...


Resolve = Callable[[], Awaitable[Sequence[str]]]


def split_target(target: str) -> tuple[str, int]:
    """`host:port` (`[v6]:port` for IPv6 literals) -> (host, port); ValueError otherwise."""
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a replica target must be host:port, not {target!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ipaddress.ip_address(host).version == 6 else f"{host}:{port}"


async def resolve_all(target: str) -> list[str]:
    """Every address `target`'s host resolves to (sorted, without duplicates), with its port."""
    host, port = split_target(target)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({_address(str(info[4][0]), port) for info in infos})


@dataclass
class _Replica:
    channel: grpc.aio.Channel
    served: Served
    task: asyncio.Task[None]


class ReplicaSet:
    def __init__(
        self,
        target: str,
        make: Callable[[grpc.aio.Channel], Served],
        *,
        credentials: grpc.ChannelCredentials | None = None,
        refresh_s: float = 10.0,
        resolve: Resolve | None = None,
    ) -> None:
        """`make` builds what serves one replica from its channel; `resolve` replaces the
        DNS lookup of `target` (a fixed list, service discovery)."""
        host, _ = split_target(target)
        self._host = host
        self._make = make
        self._credentials = credentials
        self._refresh_s = refresh_s
        self._resolve = resolve or (lambda: resolve_all(target))
        self._replicas: dict[str, _Replica] = {}
        self._closing = asyncio.Event()
        self._first = asyncio.Event()

    @property
    def addresses(self) -> list[str]:
        """The addresses served now."""
        return sorted(self._replicas)

    async def resolved(self) -> None:
        """Waits until the first resolution has been applied."""
        await self._first.wait()

    async def serve(self) -> None:
        """Serves every replica until `close()`. A failed resolution keeps what is served
        (a DNS hiccup must not drop live streams) and is tried again next period."""
        try:
            while not self._closing.is_set():
                try:
                    addresses = set(await self._resolve())
                except (OSError, ValueError) as exc:
                    _log.warning("cannot resolve the registry replicas: %s", exc)
                else:
                    await self._apply(addresses)
                    self._first.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self._refresh_s)
        finally:
            await self._apply(set())

    async def close(self) -> None:
        self._closing.set()

    async def _apply(self, addresses: set[str]) -> None:
        for address in sorted(set(self._replicas) - addresses):
            replica = self._replicas.pop(address)
            await replica.served.close()
            with contextlib.suppress(BaseException):
                await replica.task
            await replica.channel.close()
        for address in sorted(addresses - set(self._replicas)):
            channel = open_channel(address, credentials=self._credentials, options=self._options())
            served = self._make(channel)
            task = asyncio.create_task(served.serve())
            task.add_done_callback(functools.partial(_ended, address))
            self._replicas[address] = _Replica(channel, served, task)

    def _options(self) -> list[tuple[str, int | str]]:
        if self._credentials is None:
            return []
        # Dial the address, verify the name: the certificate names the Service, not a pod IP.
        return [
            ("grpc.ssl_target_name_override", self._host),
            ("grpc.default_authority", self._host),
        ]


def _ended(address: str, task: asyncio.Task[None]) -> None:
    """A replica's stream that gave up (a registry refusing the tools): said, not raised
    into nothing; the other replicas go on."""
    if not task.cancelled() and task.exception() is not None:
        _log.error("serving registry replica %s ended: %s", address, task.exception())
