"""Page runners (docs/cordis.md): the pages attached for an agent, and what they are told.

A page attaches for one agent and from then on hears of that agent's activation requests and
client inspect queries. A request carries its package's source for the person to review
(`ReviewSource`, bounded), but a page evaluates only the Client half it fetches separately, for
the exact active run. Pages come and go; the requests and queries do not belong to
a page: a page attaching later is told of everything still pending (`replay`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from codemode_common.principals import ANONYMOUS, Principal
from codemode_wire.jsonvalue import JsonValue

REVIEW_SOURCE_CHARS = 65_536
"""Each half of a request's source is cut here: what a page shows a person, replayed to every
page of the agent, stays small; a longer package cannot be reviewed whole, so it is not
offered for approval (the page shows that it was cut)."""


@dataclass(frozen=True, slots=True)
class ReviewSource:
    """A package's code as the person reads it before approving (both halves)."""

    host: str
    client: str
    truncated: bool

    @classmethod
    def of(cls, host: str | None, client: str | None) -> ReviewSource:
        host, client = host or "", client or ""
        cut = len(host) > REVIEW_SOURCE_CHARS or len(client) > REVIEW_SOURCE_CHARS
        return cls(host[:REVIEW_SOURCE_CHARS], client[:REVIEW_SOURCE_CHARS], cut)


@dataclass(frozen=True, slots=True)
class RunRequested:
    """An activation request waits for a page (reference `cordis/request-run`)."""

    request_id: str
    agent: str
    plugin_id: str
    package_id: str
    run_id: str
    mode: str
    name: str
    purpose: str
    requires_approval: bool
    has_host: bool
    source: ReviewSource


@dataclass(frozen=True, slots=True)
class RunResolved:
    """`completed` (no approval was needed), `approved`, `rejected`, `failed` or `cancelled`."""

    request_id: str
    outcome: str


@dataclass(frozen=True, slots=True)
class QueryRequested:
    query_id: str
    agent: str
    provider: str
    method: str
    input: JsonValue


@dataclass(frozen=True, slots=True)
class QueryResolved:
    """`answered` or `cancelled`."""

    query_id: str
    outcome: str


PageEvent = RunRequested | RunResolved | QueryRequested | QueryResolved


@dataclass(frozen=True, slots=True)
class ClientCode:
    code: str
    name: str
    plugin_id: str
    package_id: str
    run_id: str


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to one page message: `accepted` False means it changed nothing."""

    accepted: bool
    message: str = ""
    code: str = ""
    run_id: str = ""
    started_here: bool = False
    client_code: ClientCode | None = None
    value: JsonValue = None
    stack: str = ""


def refused(message: str, code: str, **fields: object) -> Answer:
    return Answer(False, message, code, **fields)  # type: ignore[arg-type]


@dataclass(eq=False, slots=True)
class Page:
    """One attached page runner."""

    page_id: int
    agent: str
    name: str
    push: Callable[[PageEvent], None]
    principal: Principal = ANONYMOUS  # who attached it (a panel run's host acts as them)


class PageHub:
    def __init__(self) -> None:
        self._pages: dict[int, Page] = {}
        self._ids = itertools.count(1)
        # Sources of what is still pending for an agent, told to a page when it attaches.
        self._pending: list[Callable[[str], list[PageEvent]]] = []
        # Told when an agent's first page attaches (True) and its last one detaches (False).
        self._presence: list[Callable[[str, bool], None]] = []

    def add_presence_listener(self, listener: Callable[[str, bool], None]) -> None:
        self._presence.append(listener)

    def add_pending_source(self, source: Callable[[str], list[PageEvent]]) -> None:
        self._pending.append(source)

    def attach(
        self,
        agent: str,
        name: str,
        push: Callable[[PageEvent], None],
        principal: Principal = ANONYMOUS,
    ) -> Page:
        page = Page(next(self._ids), agent, name, push, principal)
        first = not self.attached(agent)
        self._pages[page.page_id] = page
        if first:
            for listener in self._presence:
                listener(agent, True)
        for source in self._pending:
            for event in source(agent):
                push(event)
        return page

    def detach(self, page: Page) -> None:
        if self._pages.pop(page.page_id, None) is not None and not self.attached(page.agent):
            for listener in self._presence:
                listener(page.agent, False)

    def publish(self, agent: str, event: PageEvent) -> None:
        for page in list(self._pages.values()):
            if page.agent == agent:
                page.push(event)

    def attached(self, agent: str) -> int:
        return sum(1 for page in self._pages.values() if page.agent == agent)
