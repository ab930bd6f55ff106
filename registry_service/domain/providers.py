"""Remote tool providers: each provider stream owns the tools it registered.

A provider session turns tool bodies into invocation messages on its stream and waits for the
matching results. Closing the session revokes exactly its registrations and fails its in-flight
invocations; a caller's abort sends the provider a cancellation and settles the call at once
(a late result is dropped).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from codemode_wire.errors import failed_precondition
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.catalog import Catalog
from registry_service.domain.execution import ToolCallFailure
from registry_service.domain.receive_limits import ReceiveLimits, too_large
from registry_service.domain.results import ToolResult, aborted
from registry_service.domain.tools import Classifier, Invocation, ToolDefinition

PROVIDER_UNAVAILABLE = "PROVIDER_UNAVAILABLE"
INVOCATION_TOO_LARGE = "INVOCATION_TOO_LARGE"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as a provider declares it (schemas already parsed)."""

    name: str
    description: str
    input_schema: JsonValue
    output_schema: JsonValue
    concurrency_safe: bool
    guidance: str


@dataclass(frozen=True, slots=True)
class InvocationMessage:
    invocation_id: str
    invocation: Invocation
    timeout: float | None  # seconds left when sent


@dataclass(frozen=True, slots=True)
class CancellationMessage:
    invocation_id: str
    reason: str


ProviderMessage = InvocationMessage | CancellationMessage


class ProviderSession:
    def __init__(
        self, provider_id: str, name: str, catalog: Catalog, max_receive_bytes: int
    ) -> None:
        self.provider_id = provider_id
        self.name = name
        self.max_receive_bytes = max_receive_bytes
        """The largest invocation message this provider can receive (encoded bytes)."""
        # Typed loosely: the transport also queues its own replies here, in order.
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._catalog = catalog
        self._registrations: list[tuple[str, ToolDefinition]] = []
        self._inflight: dict[str, asyncio.Future[ToolResult]] = {}
        self._ids = itertools.count(1)
        self._closed = False

    def register(self, scope: str, specs: Iterable[ToolSpec]) -> list[ToolDefinition]:
        if self._closed:
            raise failed_precondition("PROVIDER_CLOSED", "the provider stream is closing")
        definitions = [self._definition(spec) for spec in specs]
        registered = self._catalog.register(scope, definitions)
        self._registrations.extend((scope, d) for d in registered)
        return registered

    def unregister(self, scope: str, name: str) -> None:
        """Revokes this session's registration of `name` in `scope` (a provider whose tool
        list changed: an MCP server's `tools/list_changed`)."""
        for entry in [e for e in self._registrations if e[0] == scope and e[1].name == name]:
            self._catalog.unregister(scope, entry[1])
            self._registrations.remove(entry)

    def _definition(self, spec: ToolSpec) -> ToolDefinition:
        safe: Classifier | None = (lambda _args: True) if spec.concurrency_safe else None
        return ToolDefinition(
            name=spec.name,
            description=spec.description,
            input_schema=spec.input_schema,
            output_schema=spec.output_schema,
            body=self._invoke,
            is_concurrency_safe=safe,
            guidance=spec.guidance,
            owner=self.name,
        )

    async def _invoke(self, invocation: Invocation) -> ToolResult:
        if self._closed:
            raise self._gone()
        invocation_id = f"inv-{next(self._ids)}"
        future: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        self._inflight[invocation_id] = future
        loop = asyncio.get_running_loop()
        timeout = (
            None if invocation.deadline is None else max(0.0, invocation.deadline - loop.time())
        )
        self.outbox.put_nowait(InvocationMessage(invocation_id, invocation, timeout))

        def cancel(reason: str) -> None:
            if not future.done():
                future.set_result(aborted(before_dispatch=False))
                self.outbox.put_nowait(CancellationMessage(invocation_id, reason))

        remove = invocation.signal.add_listener(cancel)
        try:
            return await future
        finally:
            remove()
            self._inflight.pop(invocation_id, None)

    def deliverable(self, invocation_id: str, encoded_bytes: int) -> bool:
        """Whether an invocation whose message takes `encoded_bytes` can be sent. One larger
        than the provider receives would end its stream (and revoke its tools for everyone):
        it is not sent, and that call alone fails with INVOCATION_TOO_LARGE."""
        if encoded_bytes <= self.max_receive_bytes:
            return True
        future = self._inflight.get(invocation_id)
        if future is not None and not future.done():
            receiver = f'tool provider "{self.name}"'
            message = too_large("invocation", encoded_bytes, self.max_receive_bytes, receiver)
            future.set_exception(ToolCallFailure(message, INVOCATION_TOO_LARGE))
        return False

    def resolve(self, invocation_id: str, result: ToolResult) -> bool:
        """Delivers a provider's result; False for unknown or already settled invocations."""
        future = self._inflight.get(invocation_id)
        if future is None or future.done():
            return False
        future.set_result(result)
        return True

    def close(self) -> None:
        """Revokes exactly this provider's tools and fails its in-flight invocations."""
        if self._closed:
            return
        self._closed = True
        for scope, defn in self._registrations:
            self._catalog.unregister(scope, defn)
        self._registrations.clear()
        for future in self._inflight.values():
            if not future.done():
                future.set_exception(self._gone())

    def _gone(self) -> ToolCallFailure:
        return ToolCallFailure(
            f'tool provider "{self.name}" disconnected before returning a result',
            PROVIDER_UNAVAILABLE,
        )


class ProviderHub:
    """Creates provider sessions with unique ids."""

    def __init__(self, catalog: Catalog, limits: ReceiveLimits) -> None:
        self._catalog = catalog
        self._limits = limits
        self._ids = itertools.count(1)
        self.sessions: dict[str, ProviderSession] = {}

    def open(self, name: str, max_receive_bytes: int = 0) -> ProviderSession:
        """A session for a provider that declared it receives `max_receive_bytes` (see
        `ReceiveLimits.of`)."""
        session = ProviderSession(
            f"provider-{next(self._ids)}", name, self._catalog, self._limits.of(max_receive_bytes)
        )
        self.sessions[session.provider_id] = session
        return session

    def close(self, session: ProviderSession) -> None:
        session.close()
        self.sessions.pop(session.provider_id, None)
