"""Client-bearing activations: requests, grants, the page-side sequence and
its settlement, direct panel gestures, `invoke` and render failures.

`cordis_run` of a package with a Client half never waits for a page: it arms a request
(`approval-<n>`, with the attempt's `run-<n>`), tells the owner's pages (its metadata and the
package's source to review) and returns `awaiting-approval` (no grant applies) or `starting`.
A page then runs the Host half for the request (which approves it and records the grant, kept
even if later steps fail), fetches the Client half of the exact active run, loads it, and
settles. The first valid settlement claims the request; unknown, duplicate or stale answers are
refused (`accepted: false`) and change nothing. The outcome reaches the agent as an
`agent/steer` record; a person's own panel actions (a run without a request, stop, remove) as
`agent/inject` records.

A request is a record in an `ActivationStore` (activation_records.py): in this process's
memory, or in the history database that registries sharing it read too. Every registry shows
the open records it knows of to its own pages and moves them for its pages' answers (one
conditional update each: the first answer wins anywhere). The registry that armed a request
holds its attempt: it alone starts the Host half once a page anywhere approved, and applies the
settlement to the plugin and steers the agent, whichever registry's page gave it. Other
registries hear of records through the store's notifications and a poll (`poll_s`); a record
whose asking registry died is interrupted by a survivor, so no page waits on it for good."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from codemode_common.principals import Principal
from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.change_follow import ChangeFollower
from registry_service.domain.cordis.activation_records import (
    ActivationNotOpen,
    ActivationRecord,
    ActivationState,
    ActivationStore,
    MemoryActivationStore,
    Move,
)
from registry_service.domain.cordis.model import (
    Attempt,
    Diagnostic,
    HalfState,
    Mode,
    Package,
    Phase,
    Plugin,
)
from registry_service.domain.cordis.page_runners import (
    Answer,
    ClientCode,
    Page,
    PageEvent,
    PageHub,
    ReviewSource,
    RunRequested,
    RunResolved,
    refused,
)
from registry_service.domain.cordis.placement import OwnerLost, RemoteHost
from registry_service.domain.cordis.refusals import CordisError
from registry_service.domain.cordis.runner import CordisRunner
from registry_service.domain.cordis.steering import (
    Steering,
    completed_text,
    failed_text,
    panel_remove_text,
    panel_run_text,
    panel_stop_text,
    rejected_text,
)
from registry_service.domain.plugin_hosts import HandlerFailed

log = logging.getLogger(__name__)

Outcome = Literal["success", "rejected", "host-half-failed", "client-half-failed"]
_FAILURE_PHASE: dict[str, Phase] = {
    "host-half-failed": "host-apply",
    "client-half-failed": "client-apply",
}
_OPEN = ("awaiting-approval", "starting-host", "client-pending")
_SETTLED: dict[Outcome, ActivationState] = {
    "success": ActivationState.SUCCEEDED,
    "rejected": ActivationState.REJECTED,
    "host-half-failed": ActivationState.FAILED,
    "client-half-failed": ActivationState.FAILED,
}
# How far a record has come: a registry's view never moves back to an older read.
_RANK = {
    ActivationState.PENDING: 0,
    ActivationState.APPROVED: 1,
    ActivationState.HOSTING: 2,
    ActivationState.HOST_FAILED: 2,
}
_VIEW_LIMIT = 10_000  # open records one refresh reads (a bound, not a page)
_ENDED_KEPT = 1_000  # ended records remembered, for the pages that wait on one


@dataclass(slots=True)
class _Request:
    """A request this registry armed: the plugin's attempt lives here."""

    request_id: str
    owner: str
    plugin_id: str
    package: Package
    run_id: str
    mode: Mode
    requires_approval: bool
    hosting: bool = False  # the Host half was (or is being) started for it
    started_by: str = ""  # the page that approved it (its failure may retract)


def _event(record: ActivationRecord) -> RunRequested:
    return RunRequested(
        request_id=record.request_id,
        agent=record.agent,
        plugin_id=record.plugin_id,
        package_id=record.package_id,
        run_id=record.run_id,
        mode=record.mode,
        name=record.name,
        purpose=record.purpose,
        requires_approval=record.requires_approval,
        has_host=record.has_host,
        source=ReviewSource(record.source_host, record.source_client, record.source_truncated),
    )


def _resolution(record: ActivationRecord) -> str:
    """What the pages are told of an ended record."""
    state = record.state
    if state in (ActivationState.CANCELLED, ActivationState.INTERRUPTED):
        return "cancelled"
    if not record.requires_approval:
        return "completed"
    return {ActivationState.SUCCEEDED: "approved", ActivationState.REJECTED: "rejected"}.get(
        state, "failed"
    )


def _detail_of(record: ActivationRecord) -> dict[str, Any]:
    try:
        detail = json.loads(record.detail) if record.detail else {}
    except ValueError:
        return {}
    return detail if isinstance(detail, dict) else {}


class RunOwners(Protocol):
    """The registry that holds a plugin's run (its host lease), at its peer address: where a
    page on this registry reports a render failure of a run it only follows."""

    async def render_failure(
        self, address: str, agent: str, plugin_id: str, run_id: str, *, message: str, stack: str
    ) -> tuple[bool, str, str]:
        """The owner's answer (accepted, refusal code, message), by `ClientRuns.keep_render_
        failure` there; `OwnerLost` when it cannot be reached."""
        ...


class ClientRuns:
    """Implements the runner's `ClientActivation` seam and the page runners' verbs."""

    def __init__(
        self,
        runner: CordisRunner,
        hub: PageHub,
        steering: Steering,
        store: ActivationStore | None = None,
        *,
        poll_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`store`: where requests are records shared with other registries (None: this
        process's memory only); `poll_s`: how often a shared store is read besides its
        notifications."""
        self._runner = runner
        self._hub = hub
        self._steering = steering
        self._shared = store is not None
        self._store: ActivationStore = store if store is not None else MemoryActivationStore()
        self._poll_s = poll_s
        self._clock = clock
        self._view: dict[str, ActivationRecord] = {}  # open records known here, any asker's
        self._mine: dict[str, _Request] = {}  # the requests this registry armed
        self._adding: set[str] = set()  # being added to the store by this registry
        self._ended: OrderedDict[str, ActivationRecord] = OrderedDict()
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._follower: ChangeFollower | None = None
        self._panel_runs: dict[str, int] = {}  # run id -> the page whose gesture started it
        # Where a render failure of a run another registry holds is carried (None: no channel).
        self.owners: RunOwners | None = None
        hub.add_pending_source(self._pending_for)
        runner.client_activation = self

    @property
    def store(self) -> ActivationStore:
        return self._store

    @property
    def shared(self) -> bool:
        """Whether requests are records in a store other registries may share."""
        return self._shared

    def _pending_for(self, agent: str) -> list[PageEvent]:
        records = sorted(self._view.values(), key=lambda r: r.position)
        return [_event(r) for r in records if r.agent == agent]

    def _record_of(self, plugin_id: str) -> ActivationRecord | None:
        return next((r for r in self._view.values() if r.plugin_id == plugin_id), None)

    def _label(self, page: Page) -> str:
        """A page as the records name it: this registry's id and the page's."""
        return f"{self._store.asker_id}:{page.page_id}"

    # -- following the store -------------------------------------------------------------------

    async def start(self) -> None:
        """With a shared store: reads what is open now, then follows what other registries
        ask and answer (their notifications, and a poll every `poll_s`)."""
        if not self._shared or self._follower is not None:
            return
        try:
            await self._refresh()
        except CodemodeError as exc:  # the store reports itself unavailable; the poll retries
            log.error("cordis: cannot read the pending run requests: %s", exc.message)
        follower = self._follower = ChangeFollower(self._refresh, "cordis run requests")
        self._store.follow(lambda: follower.changed(None))
        follower.poll(self._poll_s)

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.close()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _refresh(self, _names: Collection[str] | None = None) -> None:
        """Brings this registry's view to the store's: interrupts what registries that are
        gone left open, tells its pages of other registries' new requests, starts the Host
        half of its own requests that a page elsewhere approved, and applies what ended."""
        store = self._store
        records = list(await store.open(limit=_VIEW_LIMIT))
        if any(r.asked_by != store.asker_id for r in records):
            orphans = await store.interrupt_orphans(at=self._clock())
            for record in orphans:
                self._end(record)
            gone = {r.request_id for r in orphans}
            records = [r for r in records if r.request_id not in gone]
        live: set[str] = set()
        for record in records:
            request_id = record.request_id
            live.add(request_id)
            if request_id in self._ended or request_id in self._adding:
                continue
            if record.asked_by == store.asker_id and request_id not in self._mine:
                # Its attempt is gone (its cancellation could not be written): end it.
                self._spawn(self._move_quietly(request_id, ActivationState.CANCELLED))
                continue
            self._see(record)
        gone_ids = [i for i in self._view if i not in live and i not in self._adding]
        if gone_ids:
            found = {r.request_id: r for r in await store.get(gone_ids)}
            for request_id in gone_ids:
                ended = found.get(request_id)
                if ended is None:  # pruned meanwhile: nothing to apply any more
                    self._view.pop(request_id, None)
                    self._mine.pop(request_id, None)
                elif not ended.open:
                    self._end(ended)
        self._wake()

    def _see(self, record: ActivationRecord) -> None:
        """An open record as read now: the view moves forward only."""
        old = self._view.get(record.request_id)
        if old is not None and _RANK[record.state] < _RANK[old.state]:
            return  # an older read than what this registry already knows
        self._view[record.request_id] = record
        if old is None and record.asked_by != self._store.asker_id:
            self._hub.publish(record.agent, _event(record))
        if old != record:
            self._wake()
        request = self._mine.get(record.request_id)
        if request is not None and record.state is ActivationState.APPROVED:
            self._begin_once(request, record)

    def _end(self, record: ActivationRecord) -> None:
        """A record that ended (here or anywhere): its attempt here learns the outcome, this
        registry's pages hear it resolved, and pages waiting on it stop waiting."""
        request_id = record.request_id
        if request_id in self._ended:
            return
        self._ended[request_id] = record
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)
        known = self._view.pop(request_id, None)
        request = self._mine.pop(request_id, None)
        if known is not None:
            self._hub.publish(record.agent, RunResolved(request_id, _resolution(record)))
        if request is not None:
            self._apply(request, record)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _move(self, request_id: str, move: Move) -> ActivationRecord:
        """One conditional move in the store; what it found is applied here either way."""
        try:
            record = await self._store.move(request_id, move)
        except ActivationNotOpen as exc:
            if exc.stored is not None:
                if exc.stored.open:
                    self._see(exc.stored)
                else:
                    self._end(exc.stored)
            raise
        if record.open:
            self._see(record)
        else:
            self._end(record)
        return record

    async def _move_quietly(
        self, request_id: str, state: ActivationState, detail: str = ""
    ) -> None:
        """A move this registry makes on its own (a start's outcome, a cancellation): one
        that is refused lost to an answer that came first; one the store could not take is
        left to the next refresh (logged)."""
        move = Move(state, self._store.asker_id, self._clock(), detail)
        with contextlib.suppress(ActivationNotOpen):
            try:
                await self._move(request_id, move)
            except CodemodeError as exc:
                log.warning("cordis: run request %s not moved to %s: %s", request_id, state, exc)

    async def _outcome(self, request_id: str) -> ActivationRecord | None:
        """Waits until the record's Host half started or failed, or it ended; None: unknown."""
        while True:
            changed = self._changed
            record = self._view.get(request_id) or self._ended.get(request_id)
            if record is None:
                return None
            if record.state not in (ActivationState.PENDING, ActivationState.APPROVED):
                return record
            await changed.wait()

    # -- the runner's seam --------------------------------------------------------------------

    def has_pending(self, plugin_id: str) -> bool:
        return self._record_of(plugin_id) is not None

    async def request(
        self,
        plugin: Plugin,
        package: Package,
        mode: Mode,
        principal: Principal,
        recheck: Callable[[], object],
    ) -> dict[str, JsonValue]:
        """`principal`: the caller of `cordis_run`; the plugin host, once a page settles the
        request, acts as it. `recheck` plans the run again as the attempt is recorded."""
        k = package.package_id
        requires = not (
            plugin.client_version_updates_approved or k in plugin.approved_client_packages
        )
        request_id = await self._runner.ids.approval()
        attempt = await self._runner.new_attempt(
            plugin,
            package,
            mode,
            "awaiting-approval" if requires else "starting-host",
            principal=principal,
            recheck=recheck,
        )
        # No wait from the recheck to here: no other request of the plugin slips in.
        request = _Request(
            request_id,
            plugin.owner,
            plugin.plugin_id,
            package,
            attempt.run_id,
            mode,
            requires,
        )
        source = ReviewSource.of(package.host, package.client)
        record = ActivationRecord(
            request_id,
            plugin.owner,
            plugin.plugin_id,
            k,
            attempt.run_id,
            mode,
            package.name,
            package.purpose,
            requires,
            package.has_host,
            source.host,
            source.client,
            source.truncated,
            self._store.asker_id,
            self._clock(),
        )
        self._mine[request_id] = request
        self._view[request_id] = record
        self._adding.add(request_id)
        try:
            stored = await self._store.add(record)
        except (CodemodeError, ActivationNotOpen) as exc:
            self._mine.pop(request_id, None)
            self._view.pop(request_id, None)
            attempt.status = "failed"
            message = exc.message if isinstance(exc, CodemodeError) else str(exc)
            attempt.error = self._diagnostic(
                plugin, attempt, "approval", f"the run request was not recorded: {message}"
            )
            plugin.next = k
            raise
        finally:
            self._adding.discard(request_id)
        if request_id in self._mine:  # else cancelled meanwhile (and moved so in the store)
            self._view[request_id] = stored
            self._hub.publish(plugin.owner, _event(stored))
        else:
            self._spawn(self._move_quietly(request_id, ActivationState.CANCELLED))
        out: dict[str, JsonValue] = {
            "status": "awaiting-approval" if requires else "starting",
            "pluginId": plugin.plugin_id,
            "packageId": k,
            "pluginRunId": attempt.run_id,
            "mode": mode,
        }
        if plugin.current is not None:
            out["currentPackageId"] = plugin.current
        out["nextPackageId"] = k
        return out

    def cancel_pending(self, plugin: Plugin) -> bool:
        record = self._record_of(plugin.plugin_id)
        if record is None:
            return False
        request_id = record.request_id
        del self._view[request_id]
        # Ended here now (a refresh before the move is stored must not show it again).
        self._ended[request_id] = dataclasses.replace(record, state=ActivationState.CANCELLED)
        request = self._mine.pop(request_id, None)
        if request is not None:
            self._cancel_attempt(plugin, request)
        self._spawn(self._move_quietly(request_id, ActivationState.CANCELLED))
        self._hub.publish(record.agent, RunResolved(request_id, "cancelled"))
        return True

    def _cancel_attempt(self, plugin: Plugin, request: _Request) -> None:
        attempt = plugin.latest
        if attempt is not None and attempt.run_id == request.run_id:
            attempt.status = "cancelled"
            attempt.error = self._diagnostic(
                plugin, attempt, "approval", "the run request was cancelled (stopped or removed)"
            )
            for half in (attempt.host, attempt.client):
                if half.status != "absent":
                    half.status = "stopped"

    # -- run-host-half ------------------------------------------------------------------------

    async def run_host_half(
        self,
        page: Page,
        *,
        request_id: str,
        plugin_id: str,
        package_id: str,
        mode: str,
        approve_future_versions: bool,
    ) -> Answer:
        if not request_id:
            return await self._panel_run(page, plugin_id, package_id, mode, approve_future_versions)
        record = self._view.get(request_id)
        if record is None or record.agent != page.agent:
            return refused(f'no pending run request "{request_id}"', "request-unknown")
        if (plugin_id, package_id, mode) != (record.plugin_id, record.package_id, record.mode):
            return refused(
                f'run request "{request_id}" is for {record.plugin_id}/'
                f'{record.package_id} mode "{record.mode}"',
                "request-mismatch",
            )
        stale = refused(f'run request "{request_id}" is stale', "request-stale")
        request = self._mine.get(request_id)
        if request is not None:
            plugin = self._runner.find(page.agent, plugin_id)
            attempt = plugin.latest if plugin is not None else None
            if plugin is None or attempt is None or attempt.run_id != request.run_id:
                return stale
            if attempt.status not in _OPEN:
                return stale
        won = False
        if record.state is ActivationState.PENDING:
            # The approval: a conditional move, so one page anywhere starts it.
            approve = Move(
                ActivationState.APPROVED,
                self._label(page),
                self._clock(),
                approve_future=approve_future_versions,
            )
            try:
                record = await self._move(request_id, approve)
                won = True
            except ActivationNotOpen as exc:
                if exc.stored is None or not exc.stored.open:
                    return stale
            except CodemodeError as exc:
                return refused(exc.message, "store-unavailable")
        outcome = await self._outcome(request_id)
        if outcome is None or not outcome.open:
            return stale
        if outcome.state is ActivationState.HOST_FAILED:
            message = _detail_of(outcome).get("message") or "the Host half failed to start"
            return refused(str(message), "host-half-failed", run_id=outcome.run_id)
        return Answer(True, run_id=outcome.run_id, started_here=won)

    def _begin_once(self, request: _Request, record: ActivationRecord) -> None:
        """A page (here or on another registry) approved this registry's request: its Host
        half starts, once."""
        if request.hosting:
            return
        request.hosting = True
        request.started_by = record.approved_by
        self._spawn(self._begin(request, record))

    async def _begin(self, request: _Request, record: ActivationRecord) -> None:
        plugin = self._runner.find(request.owner, request.plugin_id)
        attempt = plugin.latest if plugin is not None else None
        if (
            plugin is None
            or attempt is None
            or attempt.run_id != request.run_id
            or attempt.status not in _OPEN
        ):
            await self._move_quietly(request.request_id, ActivationState.CANCELLED)
            return
        if request.requires_approval:  # the grant is kept even if later steps fail
            self._runner.grant(plugin, request.package.package_id, record.approve_future)
        if attempt.status == "awaiting-approval":
            attempt.status = "starting-host"
        answer = await self._start(plugin, request.package, attempt)
        if answer.accepted:
            await self._move_quietly(request.request_id, ActivationState.HOSTING)
        else:
            detail = json.dumps({"message": answer.message})
            await self._move_quietly(request.request_id, ActivationState.HOST_FAILED, detail)

    async def _start(self, plugin: Plugin, package: Package, attempt: Attempt) -> Answer:
        task = self._runner.start_host(
            plugin, package, attempt, self._runner.hosts, client_pending=package.has_client
        )
        try:
            await asyncio.shield(task)
        except CordisError as exc:
            return refused(exc.message, "host-half-failed", run_id=attempt.run_id)
        return Answer(True, run_id=attempt.run_id, started_here=True)

    async def _panel_run(
        self, page: Page, plugin_id: str, package_id: str, mode: str, approve_future: bool
    ) -> Answer:
        """A direct panel gesture: the click grants the package; an identical active attempt
        is shared, else a new attempt starts."""
        plugin = self._runner.find(page.agent, plugin_id)
        if plugin is None:
            return refused(f'no dynamic plugin "{plugin_id}" for this agent', "plugin-missing")
        if self.has_pending(plugin_id):
            return refused(
                f'dynamic plugin "{plugin_id}" has a pending run request; answer it instead',
                "transition-in-flight",
            )
        run, latest = plugin.run, plugin.latest
        if run is not None and isinstance(run.host, RemoteHost):
            # Another registry holds the run and its attempt (the host lease): the same
            # package is that run, shared; anything else would start a second host here over
            # it, so the page is told where the plugin runs instead.
            if run.package_id == package_id:
                return Answer(True, run_id=run.run_id, started_here=False)
            return refused(
                f'dynamic plugin "{plugin_id}" runs {run.package_id} ({run.run_id}) on the '
                f"registry at {run.host.address}; stop it first (a stop from any registry "
                "retracts it there), then run or update it from this page",
                "runs-elsewhere",
            )
        if (
            run is not None
            and run.package_id == package_id
            and latest is not None
            and latest.run_id == run.run_id
            and latest.status in ("running", "waiting", "client-pending")
        ):
            return Answer(True, run_id=run.run_id, started_here=False)

        def planned() -> Package:
            if self.has_pending(plugin_id):
                raise CordisError(
                    f'dynamic plugin "{plugin_id}" has a pending run request; answer it instead',
                    "transition-in-flight",
                )
            return self._runner.plan(plugin, package_id, mode)

        try:
            package = planned()
            # A panel run is the page's own act: its host acts as the page runner's principal.
            attempt = await self._runner.new_attempt(
                plugin,
                package,
                cast(Mode, mode),
                "starting-host",
                principal=page.principal,
                recheck=planned,
            )
        except CordisError as exc:
            return refused(exc.message, exc.reason)
        if package.has_client:
            self._runner.grant(plugin, package_id, approve_future)
        self._panel_runs[attempt.run_id] = page.page_id
        answer = await self._start(plugin, package, attempt)
        if not package.has_client or not answer.accepted:  # settled already
            self._panel_runs.pop(attempt.run_id, None)
            self._inject_panel_run(plugin, attempt, "" if answer.accepted else answer.message)
        return answer

    # -- client source ------------------------------------------------------------------------

    def client_code(self, page: Page, plugin_id: str, run_id: str) -> Answer:
        """The Client half of the plugin's active run: this registry's run (or the one it
        follows), or the run of an open request whose Host half its asker started."""
        plugin = self._runner.find(page.agent, plugin_id)
        run = plugin.run if plugin is not None else None
        package_id = run.package_id if run is not None and run.run_id == run_id else None
        if package_id is None:
            record = self._record_of(plugin_id)
            if (
                record is not None
                and record.agent == page.agent
                and record.run_id == run_id
                and record.state is ActivationState.HOSTING
            ):
                package_id = record.package_id
        if plugin is None or package_id is None or package_id not in plugin.packages:
            return refused(f'run "{run_id}" is not the active run of "{plugin_id}"', "stale-run")
        package = plugin.packages[package_id]
        if package.client is None:
            return refused(f'package "{package.package_id}" has no Client half', "no-client-half")
        code = ClientCode(package.client, package.name, plugin_id, package.package_id, run_id)
        return Answer(True, run_id=run_id, client_code=code)

    # -- settlement ---------------------------------------------------------------------------

    async def settle(
        self,
        page: Page,
        *,
        request_id: str,
        run_id: str,
        outcome: Outcome,
        message: str = "",
        stack: str = "",
        client_waiting_for: tuple[str, ...] = (),
        plugin_id: str = "",
    ) -> Answer:
        """The first valid settlement claims the request, on whichever registry it is given:
        a conditional move in the store. A success is taken only once the asker started the
        Host half a page approved, so a Client half's report can never approve."""
        if not request_id:
            return self._settle_panel_run(
                page,
                plugin_id=plugin_id,
                run_id=run_id,
                outcome=outcome,
                message=message,
                stack=stack,
                client_waiting_for=client_waiting_for,
            )
        unknown = refused(f'no pending run request "{request_id}"', "request-unknown")
        record = self._view.get(request_id)
        if record is None or record.agent != page.agent:
            return unknown
        request = self._mine.get(request_id)
        plugin = self._runner.find(page.agent, record.plugin_id)
        if request is not None and plugin is None:
            return unknown
        not_active = refused(f'run "{run_id}" is not the active run of this request', "stale-run")
        if outcome == "success":
            if not run_id or run_id != record.run_id:
                return not_active
            if request is not None:
                assert plugin is not None
                if plugin.run is None or plugin.run.run_id != record.run_id:
                    return not_active
        elif run_id and run_id != record.run_id:
            return not_active
        detail = json.dumps(
            {
                "outcome": outcome,
                "message": message,
                "stack": stack,
                "waitingFor": list(client_waiting_for),
            }
        )
        settle = Move(_SETTLED[outcome], self._label(page), self._clock(), detail)
        try:
            await self._move(request_id, settle)
        except ActivationNotOpen as exc:
            if outcome == "success" and exc.stored is not None and exc.stored.open:
                return not_active  # not approved, or its Host half not started (yet)
            return unknown
        except CodemodeError as exc:
            return refused(exc.message, "store-unavailable")
        return Answer(True, run_id=record.run_id)

    def _apply(self, request: _Request, record: ActivationRecord) -> None:
        """This registry's request ended (settled by a page anywhere, cancelled, or
        interrupted): its attempt, the plugin's pointers and the agent learn it."""
        plugin = self._runner.find(request.owner, request.plugin_id)
        attempt = plugin.latest if plugin is not None else None
        if plugin is None or attempt is None or attempt.run_id != request.run_id:
            return  # the plugin moved on meanwhile
        run = plugin.run
        active = run.run_id if run is not None and run.run_id == request.run_id else None
        state = record.state
        if state in (ActivationState.CANCELLED, ActivationState.INTERRUPTED):
            self._cancel_attempt(plugin, request)
            if active is not None and record.settled_by != self._store.asker_id:
                self._retract_in_background(plugin)  # stopped through another registry
            return
        detail = _detail_of(record)
        message, stack = str(detail.get("message", "")), str(detail.get("stack", ""))
        outcome = cast(Outcome, str(detail.get("outcome", "client-half-failed")))
        p, k, mode = plugin.plugin_id, request.package.package_id, request.mode
        returned = "awaiting-approval" if request.requires_approval else "starting"
        metadata: dict[str, JsonValue] = {
            "pluginId": p,
            "packageId": k,
            "pluginRunId": attempt.run_id,
        }
        if state is ActivationState.SUCCEEDED and active is None:
            # Settled elsewhere as its host was lost here: the activation did not succeed.
            state, outcome = ActivationState.FAILED, "host-half-failed"
            message = message or "the Host half stopped before the page settled the request"
        if state is ActivationState.SUCCEEDED:
            waiting = detail.get("waitingFor", [])
            waiting_for = tuple(str(w) for w in waiting) if isinstance(waiting, list) else ()
            self._commit(plugin, attempt, waiting_for)
            text = completed_text(mode, p, k, attempt.run_id, k)
        elif state is ActivationState.REJECTED:
            attempt.status = "rejected"
            attempt.error = self._diagnostic(plugin, attempt, "approval", "the user rejected it")
            attempt.client = HalfState("stopped")
            if attempt.host.status != "absent":
                attempt.host = HalfState("stopped")
            if active is not None:
                self._retract_in_background(plugin)
            text = rejected_text(mode, p, k, attempt.run_id)
        else:
            if active is not None and request.started_by == record.settled_by:
                self._retract_in_background(plugin)
            self._fail(plugin, attempt, outcome, message, stack)
            text = failed_text(
                mode,
                p,
                k,
                attempt.run_id,
                returned=returned,
                reason=outcome,
                detail=_detail(message, stack),
                current=plugin.current,
                next_=plugin.next,
            )
        self._runner.changed(plugin)
        self._steering.steer(plugin.owner, text, metadata)

    def _settle_panel_run(
        self,
        page: Page,
        *,
        plugin_id: str,
        run_id: str,
        outcome: Outcome,
        message: str,
        stack: str,
        client_waiting_for: tuple[str, ...],
    ) -> Answer:
        plugin = self._runner.find(page.agent, plugin_id)
        run = plugin.run if plugin is not None else None
        if plugin is None or run is None or run.run_id != run_id or outcome == "rejected":
            return refused(f'run "{run_id}" is not the active run of "{plugin_id}"', "stale-run")
        attempt = plugin.latest
        if attempt is None or attempt.run_id != run_id:
            return refused(f'run "{run_id}" is not the active run of "{plugin_id}"', "stale-run")
        started_here = self._panel_runs.get(run_id) == page.page_id
        if outcome == "success":
            if attempt.status != "client-pending":
                return Answer(True, run_id=run_id)  # an attached page: already settled
            self._panel_runs.pop(run_id, None)
            self._commit(plugin, attempt, client_waiting_for)
            self._runner.changed(plugin)
            self._inject_panel_run(plugin, attempt, "")
            return Answer(True, run_id=run_id)
        if not started_here:  # a page that merely attached: the run goes on
            return Answer(True, run_id=run_id)
        self._panel_runs.pop(run_id, None)
        self._retract_in_background(plugin)
        self._fail(plugin, attempt, outcome, message, stack)
        self._runner.changed(plugin)
        self._inject_panel_run(plugin, attempt, f"{outcome}\n{_detail(message, stack)}")
        return Answer(True, run_id=run_id)

    def _commit(
        self, plugin: Plugin, attempt: Attempt, client_waiting_for: tuple[str, ...]
    ) -> None:
        run = plugin.run
        assert run is not None
        attempt.client = HalfState(
            "waiting" if client_waiting_for else "running", client_waiting_for
        )
        host_waits = attempt.host.status == "waiting"
        attempt.status = "waiting" if client_waiting_for or host_waits else "running"
        attempt.error = None
        plugin.current = run.package_id
        plugin.next = None

    def _fail(
        self, plugin: Plugin, attempt: Attempt, outcome: Outcome, message: str, stack: str
    ) -> None:
        phase = _FAILURE_PHASE.get(outcome, "client-apply")
        diagnostic = self._diagnostic(plugin, attempt, phase, message or outcome, stack)
        attempt.status = "failed"
        attempt.error = diagnostic
        if outcome == "host-half-failed":
            attempt.host = HalfState("failed", (), diagnostic)
        else:
            attempt.client = HalfState("failed", (), diagnostic)
        plugin.next = attempt.package_id  # `current` stays

    def _diagnostic(
        self, plugin: Plugin, attempt: Attempt, phase: Phase, message: str, stack: str = ""
    ) -> Diagnostic:
        return Diagnostic(
            phase, message, plugin.plugin_id, attempt.package_id, attempt.run_id, stack
        )

    def _retract_in_background(self, plugin: Plugin) -> None:
        """The answer does not wait for the plugin host's quiescence; the run is detached
        (its tools gone) before `retract` first yields."""
        self._runner.in_background(self._runner.retract(plugin))

    def _inject_panel_run(self, plugin: Plugin, attempt: Attempt, failure: str) -> None:
        text = panel_run_text(
            attempt.mode,
            plugin.plugin_id,
            attempt.package_id,
            attempt.run_id,
            failure=failure,
            current=plugin.current,
            next_=plugin.next,
        )
        self._steering.inject(
            plugin.owner,
            text,
            {
                "pluginId": plugin.plugin_id,
                "packageId": attempt.package_id,
                "pluginRunId": attempt.run_id,
            },
        )

    # -- panel stop / remove ------------------------------------------------------------------

    async def panel_stop(self, page: Page, plugin_id: str) -> Answer:
        try:
            await self._runner.stop(page.agent, plugin_id)
        except CordisError as exc:
            return refused(exc.message, exc.reason)
        self._steering.inject(page.agent, panel_stop_text(plugin_id), {"pluginId": plugin_id})
        return Answer(True)

    async def panel_remove(self, page: Page, plugin_id: str) -> Answer:
        try:
            await self._runner.undefine(page.agent, plugin_id)
        except CordisError as exc:
            return refused(exc.message, exc.reason)
        self._steering.inject(page.agent, panel_remove_text(plugin_id), {"pluginId": plugin_id})
        return Answer(True)

    # -- invoke and render failures -----------------------------------------------------------

    async def invoke(
        self, page: Page, plugin_id: str, run_id: str, method: str, args: JsonValue
    ) -> Answer:
        """Client -> Host `invoke(pluginId, runId, method, args)`."""
        plugin = self._runner.find(page.agent, plugin_id)
        run = plugin.run if plugin is not None else None
        if plugin is None or run is None:
            return refused(f'dynamic plugin "{plugin_id}" is not running', "plugin-not-running")
        if run.run_id != run_id:
            return refused(
                f'run "{run_id}" is not the active run of {plugin_id} ({run.run_id})', "stale-run"
            )
        host = run.host
        if host is None or method not in run.registrations.handlers:
            return refused(f'plugin {plugin_id} has no handler "{method}"', "method-not-found")
        try:
            value = await host.call_handler(method, args)
        except HandlerFailed as exc:
            if exc.not_found:
                return refused(exc.message, "method-not-found")
            detail = f"host.call({method!r}) failed: {_detail(exc.message, exc.stack)}"
            self._steer_failure(plugin, run_id, f"host:handler:{method}", "handler-error", detail)
            return refused(exc.message, "handler-error", stack=exc.stack)
        return Answer(True, run_id=run_id, value=value)

    async def render_failure(
        self, page: Page, plugin_id: str, run_id: str, message: str, stack: str
    ) -> Answer:
        """A page's report that the run's Client half failed to render. A run this registry
        only follows (another registry holds its host lease, and with it the attempt) is
        carried to that owner, which applies the rule below to its own run: so the owner's
        attempt fails and it steers the agent once, and this registry's mirror keeps nothing."""
        plugin = self._runner.find(page.agent, plugin_id)
        run = plugin.run if plugin is not None else None
        if plugin is None or run is None or run.run_id != run_id:
            return _stale(plugin_id, run_id)
        host = run.host
        if not isinstance(host, RemoteHost):
            return self.keep_render_failure(page.agent, plugin_id, run_id, message, stack)
        if self.owners is None:
            return refused(
                f'run "{run_id}" of "{plugin_id}" runs on the registry at {host.address}, '
                "which this registry has no peer channel to",
                "owner-unreachable",
            )
        try:
            accepted, code, text = await self.owners.render_failure(
                host.address, page.agent, plugin_id, run_id, message=message, stack=stack
            )
        except OwnerLost as exc:
            return refused(
                f'the registry running "{plugin_id}" ({host.address}) did not take the render '
                f"failure: {exc}",
                "owner-unreachable",
            )
        return Answer(True, run_id=run_id) if accepted else refused(text, code)

    def keep_render_failure(
        self, agent: str, plugin_id: str, run_id: str, message: str, stack: str
    ) -> Answer:
        """Kept on the run this registry holds (so cleared by a new run or a stop); reports
        about another agent's plugin, a stale run or a run held elsewhere are dropped."""
        plugin = self._runner.find(agent, plugin_id)
        run = plugin.run if plugin is not None else None
        if (
            plugin is None
            or run is None
            or run.run_id != run_id
            or isinstance(run.host, RemoteHost)
        ):
            return _stale(plugin_id, run_id)
        attempt = plugin.latest
        diagnostic = Diagnostic("client-render", message, plugin_id, run.package_id, run_id, stack)
        run.render_failure = diagnostic
        if (
            attempt is not None
            and attempt.run_id == run_id
            and attempt.status in ("running", "waiting")
        ):
            self._steer_failure(
                plugin,
                run_id,
                f"client:render:{message}",
                "client-render-failed",
                _detail(message, stack),
            )
            attempt.status = "failed"
            attempt.error = diagnostic
            attempt.client = HalfState("failed", (), diagnostic)
        return Answer(True, run_id=run_id)

    def _steer_failure(
        self, plugin: Plugin, run_id: str, kind: str, reason: str, detail: str
    ) -> None:
        """A post-activation failure steers once per distinct kind per run, only while the
        attempt is running or waiting."""
        attempt = plugin.latest
        if (
            attempt is None
            or attempt.run_id != run_id
            or attempt.status not in ("running", "waiting")
        ):
            return
        self._steering.steer_once(
            run_id,
            kind,
            plugin.owner,
            failed_text(
                attempt.mode,
                plugin.plugin_id,
                attempt.package_id,
                run_id,
                returned="running",
                reason=reason,
                detail=detail,
                current=plugin.current,
                next_=plugin.next,
            ),
            {"pluginId": plugin.plugin_id, "packageId": attempt.package_id, "pluginRunId": run_id},
        )


def _stale(plugin_id: str, run_id: str) -> Answer:
    return refused(f'run "{run_id}" is not the active run of "{plugin_id}"', "stale-run")


def _detail(message: str, stack: str) -> str:
    return f"{message}\n{stack}" if stack else message
