"""Client inspect queries: `cordis_inspect_query` with platform
`client` is answered by the owner's page runners.

The query (`inspect-<n>`) is told to every page of the agent, and to pages that attach while it
is pending. It waits, without a timeout, for the first valid successful answer: a page's
failure or output that does not match the method's output schema is refused and leaves it
pending. The tool call's cancellation resolves it as cancelled."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from codemode_wire import jsonvalue
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.cordis.ids import Ids
from registry_service.domain.cordis.inspect import Method
from registry_service.domain.cordis.page_presence import PagePresence
from registry_service.domain.cordis.page_runners import (
    Answer,
    Page,
    PageEvent,
    PageHub,
    QueryRequested,
    QueryResolved,
    refused,
)
from registry_service.domain.cordis.refusals import CordisError
from registry_service.domain.jsonschema import validate
from registry_service.domain.signals import AbortSignal


@dataclass(slots=True)
class _Query:
    query_id: str
    owner: str
    provider: str
    method: Method
    input: JsonValue
    answered: asyncio.Future[JsonValue]

    def event(self) -> QueryRequested:
        return QueryRequested(
            self.query_id, self.owner, self.provider, self.method.name, self.input
        )


class ClientQueries:
    """The inspect registry's `ClientQuery` and the pages' `answer`."""

    def __init__(self, hub: PageHub, ids: Ids) -> None:
        self._hub = hub
        self._ids = ids
        self._queries: dict[str, _Query] = {}
        # Other registries' pages (registries sharing the store): a query of an agent with no
        # page attached here goes to one of theirs.
        self.presence: PagePresence | None = None
        hub.add_pending_source(self._pending_for)

    def _pending_for(self, agent: str) -> list[PageEvent]:
        return [q.event() for q in self._queries.values() if q.owner == agent]

    async def __call__(
        self,
        owner: str,
        provider: str,
        method: Method,
        input_value: JsonValue,
        signal: AbortSignal,
        *,
        here_only: bool = False,
        deadline: float | None = None,
    ) -> JsonValue:
        presence = self.presence
        if (
            not here_only
            and presence is not None
            and not self._hub.attached(owner)
            and presence.elsewhere(owner)
        ):
            return await presence.client_query(
                owner, provider, method.name, input_value, signal, deadline=deadline
            )
        answered: asyncio.Future[JsonValue] = asyncio.get_running_loop().create_future()
        query = _Query(await self._ids.inspect(), owner, provider, method, input_value, answered)
        self._queries[query.query_id] = query

        def cancel(_reason: str) -> None:
            if not answered.done():
                answered.set_exception(
                    CordisError("cordis_inspect_query was cancelled", "cancelled")
                )

        remove = signal.add_listener(cancel)
        self._hub.publish(owner, query.event())
        try:
            return await answered
        finally:
            remove()
            if self._queries.pop(query.query_id, None) is not None:  # not answered: cancelled
                self._hub.publish(owner, QueryResolved(query.query_id, "cancelled"))

    def answer(
        self, page: Page, query_id: str, ok: bool, data: JsonValue, message: str = ""
    ) -> Answer:
        query = self._queries.get(query_id)
        if query is None or query.owner != page.agent or query.answered.done():
            return refused(f'no pending inspect query "{query_id}"', "query-unknown")
        if not ok:
            return refused(
                f"a failed answer leaves the query pending: {message or 'no reason given'}",
                "answer-failed",
            )
        data = jsonvalue.snapshot(data)
        violations = validate(query.method.output_schema, data, root="output")
        if violations:
            return refused(
                f"{query.provider}.{query.method.name} output does not match its schema: "
                + "; ".join(violations),
                "invalid-output",
            )
        del self._queries[query_id]
        query.answered.set_result(data)
        self._hub.publish(page.agent, QueryResolved(query_id, "answered"))
        return Answer(True)
