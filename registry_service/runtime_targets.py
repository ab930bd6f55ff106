"""The registry's runtime targets: one channel per configured target, each with what it serves.

Every target is asked what it serves (`GetCapabilities`: the languages, and for each the kinds
`CheckSource` checks), and a run, a plugin host or a source check goes only to a target that
serves its language, in rotation among those connected. So runtimes that serve different
languages can sit behind one registry (a Python-only pool beside a TypeScript one). A target
not yet heard from may serve anything: it is asked before it is given work. A target may also
name several runtimes (`dns:///name:port`, an `ipv4:` list), taken to serve the same languages:
on the multiplexed channel it is resolved to one target per runtime
(`runtime_resolution.py`); with per-run streams its one channel balances over them
(round_robin).

Capabilities are read once, then re-read every `CAPABILITIES_REFRESH_S` in the background (an
answer in hand is used meanwhile, so a redeployed runtime's new limits and languages are picked
up without a per-run cost), in an empty context: a read serves every run, and no run's cancellation
or trace is its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Sequence

import grpc

from codemode_wire.api.runtime.v1 import runtime_pb2 as pb
from codemode_wire.api.runtime.v1 import runtime_pb2_grpc as pb_grpc

__all__ = [
    "CAPABILITIES_REFRESH_S",
    "Choose",
    "RuntimeTarget",
    "first_connected",
    "names_one_runtime",
]

log = logging.getLogger(__name__)

CAPABILITIES_REFRESH_S = 60.0
_CAPABILITIES_TIMEOUT_S = 10.0


def names_one_runtime(address: str) -> bool:
    """Whether a target is one runtime (`host:port`, `unix:`, one `ipv4:`/`ipv6:` address),
    not a name that may resolve to several (`dns:`, a comma-separated address list): one
    multiplexed stream reaches only one runtime, while the channel balances each new stream
    over all of a name's runtimes (round_robin)."""
    scheme, colon, rest = address.partition(":")
    if not colon or scheme not in _SCHEMES:
        return True  # host:port (gRPC's default resolver: one address)
    return scheme != "dns" and "," not in rest


# gRPC target schemes; anything else before the first colon is a host name.
_SCHEMES = frozenset({"dns", "ipv4", "ipv6", "unix", "unix-abstract", "vsock"})


class RuntimeTarget:
    """One configured runtime target: its channel, its stub and its last capabilities."""

    def __init__(self, address: str, channel: grpc.aio.Channel) -> None:
        self.address = address
        self.channel = channel
        self.stub = pb_grpc.RuntimeServiceStub(channel)
        self.capabilities: pb.GetCapabilitiesResponse | None = None
        self._read_at = 0.0
        self._fetching: asyncio.Task[pb.GetCapabilitiesResponse] | None = None

    def connected(self) -> bool:
        """Whether the channel is connected now (asking it to connect when it is idle)."""
        return self.channel.get_state(try_to_connect=True) is grpc.ChannelConnectivity.READY

    def served(self) -> tuple[str, ...] | None:
        """The languages it last said it serves; None before it has answered."""
        caps = self.capabilities
        if caps is None:
            return None
        if caps.language_capabilities:
            return tuple(e.name for e in caps.language_capabilities if e.served)
        return tuple(caps.languages)  # a runtime from before per-language entries

    def serves(self, language: str) -> bool | None:
        """Whether it serves `language` (None: not known yet)."""
        served = self.served()
        return None if served is None else language in served

    def checks_client_halves(self) -> bool | None:
        """Whether one of its served languages checks client halves (None: not known yet)."""
        caps = self.capabilities
        if caps is None:
            return None
        return any(
            e.served and pb.SOURCE_KIND_CLIENT_HALF in e.checked_kinds
            for e in caps.language_capabilities
        )

    async def read_capabilities(self) -> pb.GetCapabilitiesResponse:
        """Its capabilities: the last answer (refreshed in the background once stale), or,
        before the first, the answer it is asked for now. Raises `grpc.aio.AioRpcError`."""
        stale = time.monotonic() - self._read_at > CAPABILITIES_REFRESH_S
        if self.capabilities is not None and not stale:
            return self.capabilities
        if self._fetching is None:
            self._read_at = time.monotonic()  # one attempt per period, even a failed one
            self._fetching = asyncio.get_running_loop().create_task(
                self._get(), context=contextvars.Context()
            )
            self._fetching.add_done_callback(self._fetched)
        if self.capabilities is not None:
            return self.capabilities
        return await asyncio.shield(self._fetching)

    async def _get(self) -> pb.GetCapabilitiesResponse:
        response: pb.GetCapabilitiesResponse = await self.stub.GetCapabilities(
            pb.GetCapabilitiesRequest(), timeout=_CAPABILITIES_TIMEOUT_S
        )
        return response

    def _fetched(self, task: asyncio.Task[pb.GetCapabilitiesResponse]) -> None:
        self._fetching = None
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            if self.capabilities is None:
                self._read_at = 0.0  # nothing known yet: the next one to need it asks again
            log.warning("reading the capabilities of runtime %s failed: %s", self.address, exc)
            return
        self.capabilities = task.result()

    async def close(self) -> None:
        if self._fetching is not None:
            self._fetching.cancel()
        await self.channel.close()


async def first_connected(
    targets: Sequence[RuntimeTarget], deadline: float, start: int
) -> RuntimeTarget | None:
    """The first connected target of `targets` in rotation from `start`, waiting until one
    is (a restarting runtime reconnects within its reconnect backoff) or `deadline`."""
    loop = asyncio.get_running_loop()
    while True:
        count = len(targets)
        for offset in range(count):
            target = targets[(start + offset) % count]
            if target.connected():
                return target
        remaining = deadline - loop.time()
        if remaining <= 0 or not targets:
            return None
        await _any_state_change(targets, loop.time() + remaining)


async def _any_state_change(targets: Sequence[RuntimeTarget], until: float) -> None:
    timeout = until - asyncio.get_running_loop().time()
    waits = [
        asyncio.ensure_future(t.channel.wait_for_state_change(t.channel.get_state()))
        for t in targets
    ]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(*waits, return_exceptions=True)


Choose = Callable[[RuntimeTarget], "bool | None"]
"""Whether a target can take a piece of work (None: not known until it answers)."""
