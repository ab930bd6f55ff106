"""Which registries sharing the store have page runners of an agent attached, and the
client-half calls carried to them (docs/cordis.md, "Registries sharing one store").

A client `cordis_inspect_query` is answered by a page of its agent. When a program runs on a
registry where no page of its agent is attached, but another live registry has one, the query
is carried there over the peer channel (`PagePeers`, the port `cordis_page_peers.py`
implements) and answered by that registry's pages; the client inspect manifest those pages
synced is known here through the store too, so `cordis_inspect_list` and the query's checks
read it. This registry tells the store when an agent's first page attaches, when its last one
detaches, and each manifest sync (`ActivationStore.attach_pages`), and follows what the others
said (the store's notifications, and a poll every `poll_s`).

A carried call is cancelled with the caller's call (its deadline included: the caller's
cancellation aborts it). When the registry it went to dies, the call fails `ABORTED` (its
outcome is unknown, so it is not retried): at once when the connection breaks, else once the
store says that registry is gone (its history writer lease expired), which this registry
checks every `poll_s` while it waits. It never hangs on a registry that vanished."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from codemode_wire import jsonvalue
from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.change_follow import ChangeFollower
from registry_service.domain.cordis.activation_records import ActivationStore, PagesAt
from registry_service.domain.cordis.inspect import Provider, client_providers, validate_provider
from registry_service.domain.cordis.refusals import CordisError
from registry_service.domain.signals import AbortSignal

log = logging.getLogger(__name__)

# A carried call whose registry was lost while it waited: its outcome is unknown.
PAGES_LOST = "ABORTED"


class PagesLost(Exception):
    """The registry with the pages could not be reached, or went away mid-call."""


class PagePeers(Protocol):
    """Another registry's pages, at its peer address."""

    async def client_query(
        self,
        address: str,
        agent: str,
        provider: str,
        method: str,
        input_value: JsonValue,
        *,
        timeout_s: float | None,
    ) -> JsonValue:
        """The pages' answer; `CordisError` as that registry refused the query (its code),
        or when `timeout_s` (the caller's remaining time, carried as the call's deadline)
        passed; `PagesLost` when it cannot be reached or goes away. Cancelling it cancels the
        call."""
        ...


def _providers(manifest_json: str) -> dict[str, Provider]:
    """A manifest another registry's pages synced, as providers ({} when unreadable: that
    registry validated it before storing it, so this only drops what is damaged)."""
    if not manifest_json:
        return {}
    try:
        providers = client_providers(jsonvalue.loads(manifest_json))
        for provider in providers:
            validate_provider(provider)
    except ValueError as exc:
        log.warning("cordis: another registry's client manifest is unreadable: %s", exc)
        return {}
    return {p.id: p for p in providers}


class PagePresence:
    def __init__(
        self,
        store: ActivationStore,
        peers: PagePeers,
        address: Callable[[], str],
        *,
        poll_s: float = 2.0,
    ) -> None:
        """`address`: where this registry's peer channel answers (known once it listens)."""
        self._store = store
        self._peers = peers
        self._address = address
        self._poll_s = poll_s
        self._elsewhere: dict[str, list[PagesAt]] = {}
        self._manifests: dict[str, str] = {}  # agent -> what its pages here synced last
        self._attached: set[str] = set()  # agents with pages here, as last told to the store
        self._writes: dict[str, asyncio.Task[None]] = {}  # agent -> its pending write
        self._owed: set[str] = set()  # agents whose state changed while a write ran
        self._follower: ChangeFollower | None = None

    # -- this registry's pages ----------------------------------------------------------------

    def changed(self, agent: str, attached: bool, manifest_json: str | None = None) -> None:
        """An agent's pages here changed: its first attached, its last detached, or one synced
        its manifest. Written in the background, the latest state last."""
        if manifest_json is not None:
            self._manifests[agent] = manifest_json
        if attached:
            self._attached.add(agent)
        else:
            self._attached.discard(agent)
            self._manifests.pop(agent, None)
        if agent in self._writes:
            self._owed.add(agent)
            return
        self._writes[agent] = asyncio.ensure_future(self._write(agent))

    async def _write(self, agent: str) -> None:
        try:
            while True:
                self._owed.discard(agent)
                try:
                    if agent in self._attached:
                        manifest = self._manifests.get(agent, "")
                        await self._store.attach_pages(agent, self._address(), manifest)
                    else:
                        await self._store.detach_pages(agent)
                except CodemodeError as exc:  # the next change, or the next poll, writes it
                    log.warning("cordis: pages of %s not recorded: %s", agent, exc.message)
                if agent not in self._owed:
                    return
        finally:
            del self._writes[agent]

    # -- other registries' pages --------------------------------------------------------------

    async def start(self) -> None:
        if self._follower is not None:
            return
        with contextlib.suppress(CodemodeError):
            await self.refresh()
        follower = self._follower = ChangeFollower(self._refresh, "cordis pages")
        self._store.follow(lambda: follower.changed(None))
        follower.poll(self._poll_s, self._write_again)

    def _write_again(self) -> None:
        """A write of this registry's pages that failed is made again."""
        for agent in list(self._attached):
            if agent not in self._writes:
                self._writes[agent] = asyncio.ensure_future(self._write(agent))

    async def _refresh(self, _names: Collection[str] | None = None) -> None:
        await self.refresh()

    async def refresh(self) -> None:
        elsewhere: dict[str, list[PagesAt]] = {}
        for pages in await self._store.pages_elsewhere():
            elsewhere.setdefault(pages.agent, []).append(pages)
        self._elsewhere = elsewhere

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.close()
        for task in list(self._writes.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def providers_elsewhere(self, agent: str) -> Mapping[str, Provider]:
        """The client manifest of the agent's pages on another registry ({}: none)."""
        for pages in self._elsewhere.get(agent, ()):
            providers = _providers(pages.manifest_json)
            if providers:
                return providers
        return {}

    def elsewhere(self, agent: str) -> bool:
        return bool(self._elsewhere.get(agent))

    async def client_query(
        self,
        agent: str,
        provider: str,
        method: str,
        input_value: JsonValue,
        signal: AbortSignal,
        *,
        deadline: float | None = None,
    ) -> JsonValue:
        """Carries the query to a registry with pages of `agent` (the first whose manifest
        has the provider) with the caller's remaining time (`deadline`, event-loop time),
        waits for its answer, and watches that registry stays alive."""
        targets = self._elsewhere.get(agent, [])
        target = next(
            (p for p in targets if provider in _providers(p.manifest_json)),
            targets[0] if targets else None,
        )
        if target is None:
            raise CordisError("no page of this agent is attached to any registry", "cancelled")
        loop = asyncio.get_running_loop()
        timeout_s = None if deadline is None else max(deadline - loop.time(), 0.0)
        call: asyncio.Task[JsonValue] = asyncio.ensure_future(
            self._peers.client_query(
                target.address, agent, provider, method, input_value, timeout_s=timeout_s
            )
        )

        def cancel(_reason: str) -> None:
            call.cancel()

        remove = signal.add_listener(cancel)
        try:
            while True:
                done, _pending = await asyncio.wait({call}, timeout=self._poll_s)
                if done:
                    break
                with contextlib.suppress(CodemodeError):  # the store down: keep waiting
                    await self.refresh()
                    alive = {p.registry for p in self._elsewhere.get(agent, [])}
                    if target.registry not in alive:
                        call.cancel()
                        raise CordisError(
                            f"the registry with the page that was asked ({target.address}) was "
                            "lost while the query waited; its outcome is unknown",
                            PAGES_LOST,
                        )
            if call.cancelled():
                raise CordisError("cordis_inspect_query was cancelled", "cancelled")
            try:
                return call.result()
            except PagesLost as exc:
                raise CordisError(
                    f"the registry with the page that was asked ({target.address}) was lost: "
                    f"{exc}; the query's outcome is unknown",
                    PAGES_LOST,
                ) from None
        finally:
            remove()
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await call
