"""Who runs a running plugin's host: one registry per plugin, under a lease in the store
(docs/cordis.md, "Registries sharing one store").

Registries sharing a store run each running plugin's host in exactly one of them, the lease's
owner; the others route the plugin's traffic to the owner's peer address. An owner renews its
leases a few times per lease period; a registry that stops renewing (it died, or lost the
store) loses them when they expire, and a survivor takes an expired lease over and reactivates
the plugin's current package.

The contract every store keeps (tests/registry/history/test_host_lease_conformance.py runs it
against process memory, SQLite and PostgreSQL):

- One lease per plugin: ``acquire`` stores it when there is none, when the stored one has
  expired, or when it is already the caller's; it returns the lease then, else None and
  stores nothing. Taking a lease that was someone else's (or none) raises its ``epoch``: the
  fencing token a stale owner's write is refused by.
- ``renew`` and ``release`` name the lease they hold (owner and epoch): a lease taken over
  meanwhile is not renewed (None: it is lost) nor released.
- Expiry is judged by the store's clock (PostgreSQL's ``now()``), never by a registry's: two
  registries whose clocks differ still agree on who holds a lease.
- A lease keeps the principal that activated the run it covers (``acquire`` stores the one it
  is given): a survivor taking an expired lease over reactivates the plugin as that principal,
  whoever else called the plugin meanwhile or on whichever registry. A lease stored before
  principals were kept reads as anonymous.
- Every operation raises ``CodemodeError`` when the backend fails, and then stores nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Protocol

from codemode_common.principals import ANONYMOUS, Principal

# The principal names are the domain's to hand on: the stores stand on the domain alone.
__all__ = ["ANONYMOUS", "HostLease", "HostLeases", "MemoryHostLeases", "Principal", "principal_of"]


@dataclass(frozen=True, slots=True)
class HostLease:
    plugin_id: str
    owner: str  # the owning registry's instance id
    address: str  # where its peer service answers (host:port)
    epoch: int  # raised on every change of hands: a fencing token
    remaining_s: float  # until it expires, by the store's clock when it was read (<= 0: expired)
    principal: Principal = ANONYMOUS  # who activated the run: its plugin host acts as it

    @property
    def expired(self) -> bool:
        return self.remaining_s <= 0


def principal_of(kind: str, name: str) -> Principal:
    """A stored activator (an empty kind: a lease stored before principals were kept)."""
    return Principal(kind, name) if kind and kind != ANONYMOUS.kind else ANONYMOUS


class HostLeases(Protocol):
    async def acquire(
        self,
        plugin_id: str,
        owner: str,
        address: str,
        ttl_s: float,
        *,
        principal: Principal = ANONYMOUS,
    ) -> HostLease | None:
        """The lease, when it was absent, expired or already `owner`'s, now naming
        `principal` as its run's activator; None: held by another (nothing changes)."""
        ...

    async def renew(self, lease: HostLease, ttl_s: float) -> HostLease | None:
        """Extends a lease still held (same owner and epoch); None when it was taken over."""
        ...

    async def release(self, lease: HostLease) -> None:
        """Removes the lease when it is still the one named (nothing otherwise)."""
        ...

    async def expire(self, owner: str) -> None:
        """Makes every lease of `owner` expire now (a registry shutting down: survivors take
        its plugins over without waiting out the lease)."""
        ...

    async def load(self, plugin_ids: Collection[str] | None = None) -> list[HostLease]:
        """The stored leases of the plugins named (None: all), in plugin id order."""
        ...


@dataclass
class MemoryHostLeases:
    """One registry's process memory (no store shared with another registry)."""

    clock: Callable[[], float] = time.monotonic
    _leases: dict[str, tuple[HostLease, float]] = field(default_factory=dict)  # lease, deadline

    def _read(self, lease: HostLease, deadline: float) -> HostLease:
        return replace(lease, remaining_s=deadline - self.clock())

    async def acquire(
        self,
        plugin_id: str,
        owner: str,
        address: str,
        ttl_s: float,
        *,
        principal: Principal = ANONYMOUS,
    ) -> HostLease | None:
        now = self.clock()
        held = self._leases.get(plugin_id)
        epoch = 1
        if held is not None:
            lease, deadline = held
            if lease.owner == owner and deadline > now:
                epoch = lease.epoch
            elif deadline > now:
                return None
            else:
                epoch = lease.epoch + 1
        taken = HostLease(plugin_id, owner, address, epoch, ttl_s, principal)
        self._leases[plugin_id] = (taken, now + ttl_s)
        return taken

    async def renew(self, lease: HostLease, ttl_s: float) -> HostLease | None:
        held = self._leases.get(lease.plugin_id)
        if held is None or (held[0].owner, held[0].epoch) != (lease.owner, lease.epoch):
            return None
        self._leases[lease.plugin_id] = (held[0], self.clock() + ttl_s)
        return replace(held[0], remaining_s=ttl_s)

    async def release(self, lease: HostLease) -> None:
        held = self._leases.get(lease.plugin_id)
        if held is not None and (held[0].owner, held[0].epoch) == (lease.owner, lease.epoch):
            del self._leases[lease.plugin_id]

    async def expire(self, owner: str) -> None:
        now = self.clock()
        for plugin_id, (lease, _) in list(self._leases.items()):
            if lease.owner == owner:
                self._leases[plugin_id] = (lease, now)

    async def load(self, plugin_ids: Collection[str] | None = None) -> list[HostLease]:
        return [
            self._read(lease, deadline)
            for plugin_id, (lease, deadline) in sorted(self._leases.items())
            if plugin_ids is None or plugin_id in plugin_ids
        ]
