"""A runtime target that may name several runtimes, resolved to one address per runtime.

A `dns:` name (a headless Service, a compose service with replicas) or an `ipv4:`/`ipv6:`
address list names several runtimes. On the multiplexed channel each of them gets a channel and
a stream of its own, so that runs balance over them; gRPC's Python API does not expose the
addresses its resolver finds, so they are found here, the same way:

- `ipv4:a[:port],b[:port]` / `ipv6:[a]:port,b`: the listed addresses (default port 443);
- `dns:[//authority/]host[:port]`: the host's addresses from the system resolver (default port
  443), looked up off the event loop. An `authority` (a DNS server of its own) is not
  consulted: the system resolver answers.

A resolved target is resolved again every `RESOLVE_INTERVAL_S` while it is used (new replicas
join), and sooner, at most every `RERESOLVE_MIN_S`, when one of its runtimes is not connected
(a replica went away, or all of them were replaced). A lookup that fails keeps the addresses
known so far.
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import logging
import math
import socket
from collections.abc import Callable
from time import monotonic

from registry_service.runtime_targets import RuntimeTarget

__all__ = [
    "MAX_BACKENDS",
    "RERESOLVE_MIN_S",
    "RESOLVE_INTERVAL_S",
    "ResolvedTarget",
    "authority_of",
    "backend_address",
    "listed_addresses",
]

log = logging.getLogger(__name__)

RESOLVE_INTERVAL_S = 30.0
RERESOLVE_MIN_S = 1.0
# A channel and a stream per runtime: a name that answers with more addresses gets this many
# (the first, in address order), so one bad DNS answer cannot open thousands of connections.
MAX_BACKENDS = 128
_DEFAULT_PORT = 443  # gRPC's, for `dns:` and `ipv4:`/`ipv6:` targets without one
_LOOKUP_TIMEOUT_S = 10.0


def backend_address(host: str, port: int) -> str:
    """The gRPC target of one resolved address: `ipv4:1.2.3.4:50052`, `ipv6:[::1]:50052`."""
    if ipaddress.ip_address(host).version == 6:
        return f"ipv6:[{host}]:{port}"
    return f"ipv4:{host}:{port}"


def _host_port(text: str) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]`, `[v6]:port`, or a bare IPv6 address (no port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
        return host, int(port) if port else _DEFAULT_PORT
    if text.count(":") > 1:  # a bare IPv6 address
        return text, _DEFAULT_PORT
    host, _, port = text.partition(":")
    return host, int(port) if port else _DEFAULT_PORT


def listed_addresses(target: str) -> list[str] | None:
    """The backend addresses an `ipv4:`/`ipv6:` list names (None for any other target).
    Raises ValueError for an entry that is not an address of the list's family."""
    scheme, _, rest = target.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return None
    version = 4 if scheme == "ipv4" else 6
    found: list[str] = []
    for entry in rest.split(","):
        host, port = _host_port(entry.strip())
        if ipaddress.ip_address(host).version != version:
            raise ValueError(f"{entry!r} is not an {scheme} address")
        address = backend_address(host, port)
        if address not in found:
            found.append(address)
    return found


def _dns_host_port(target: str) -> tuple[str, int]:
    """The host and port of `dns:[//authority/]host[:port]`."""
    rest = target.removeprefix("dns:")
    if rest.startswith("//"):
        rest = rest[2:].partition("/")[2]
    return _host_port(rest)


def authority_of(target: str) -> str | None:
    """The authority a `dns:` target's backends present (its `host:port`, the name their TLS
    certificate is for); None for an address list."""
    if not target.startswith("dns:"):
        return None
    host, port = _dns_host_port(target)
    return f"{host}:{port}"


async def resolve(target: str) -> list[str]:
    """The backend addresses `target` names now, in a stable order. Raises OSError (and
    ValueError for a malformed list) when they cannot be found."""
    listed = listed_addresses(target)
    if listed is not None:
        return listed
    host, port = _dns_host_port(target)
    loop = asyncio.get_running_loop()
    infos = await asyncio.wait_for(
        loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), _LOOKUP_TIMEOUT_S
    )
    found = {backend_address(str(info[4][0]), port) for info in infos}
    return sorted(found)


Connect = Callable[[str], RuntimeTarget]
"""Makes the target (its channel) for one backend address."""


class ResolvedTarget:
    """One configured target and the runtimes it resolves to, a `RuntimeTarget` each.

    `refresh` resolves it (once due) and reports the backends that came and went; the owner
    retires what went (its runs finish) and closes it once idle (`runtime_client.py`)."""

    def __init__(self, address: str, connect: Connect) -> None:
        self.address = address
        self._connect = connect
        self.backends: dict[str, RuntimeTarget] = {}
        self.resolved = False  # looked up successfully at least once
        self._last = -math.inf  # monotonic() when the last lookup started
        self._soon = True  # the next lookup is due RERESOLVE_MIN_S after the last
        self._lookup: asyncio.Task[list[str]] | None = None

    def due(self) -> bool:
        """Whether it is time to look the target up again (and no lookup is under way)."""
        wait = RERESOLVE_MIN_S if self._soon else RESOLVE_INTERVAL_S
        return self._lookup is None and monotonic() - self._last >= wait

    def soon(self) -> None:
        """Look up again at the next use, unless the last lookup was under RERESOLVE_MIN_S
        ago (then at RERESOLVE_MIN_S after it)."""
        self._soon = True

    def begin(self) -> None:
        """Starts a lookup unless one is under way (so `due` is False from here)."""
        if self._lookup is None:
            self._last, self._soon = monotonic(), False
            # In an empty context: the lookup serves every run, none of their traces.
            self._lookup = asyncio.get_running_loop().create_task(
                resolve(self.address), context=contextvars.Context()
            )

    async def refresh(self) -> tuple[list[RuntimeTarget], list[RuntimeTarget]]:
        """Looks the target up (one lookup at a time; callers share it): the (added, removed)
        backends. A failed lookup changes nothing and is tried again after RERESOLVE_MIN_S."""
        self.begin()
        lookup = self._lookup
        assert lookup is not None
        try:
            addresses = await asyncio.shield(lookup)
        except (OSError, ValueError, TimeoutError) as exc:
            if self._lookup is lookup:
                self._lookup = None
                self._soon = True
                log.warning("resolving runtime target %s failed: %s", self.address, exc)
            return [], []
        if self._lookup is not lookup:
            return [], []  # another caller applied this lookup already
        self._lookup = None
        self.resolved = True
        if len(addresses) > MAX_BACKENDS:
            log.warning(
                "runtime target %s names %d runtimes: using the first %d",
                self.address, len(addresses), MAX_BACKENDS,
            )  # fmt: skip
            addresses = addresses[:MAX_BACKENDS]
        if not addresses:
            self._soon = True
        added = [a for a in addresses if a not in self.backends]
        removed = [self.backends.pop(a) for a in list(self.backends) if a not in addresses]
        for address in added:
            self.backends[address] = self._connect(address)
        if added or removed:
            log.info(
                "runtime target %s: %s", self.address, ", ".join(self.backends) or "no address"
            )
        return [self.backends[a] for a in added], removed

    def cancel(self) -> None:
        if self._lookup is not None:
            self._lookup.cancel()
            self._lookup = None
