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
`agent/inject` records."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, cast

from codemode_common.principals import Principal
from codemode_wire.jsonvalue import JsonValue
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

Outcome = Literal["success", "rejected", "host-half-failed", "client-half-failed"]
_FAILURE_PHASE: dict[str, Phase] = {
    "host-half-failed": "host-apply",
    "client-half-failed": "client-apply",
}
_OPEN = ("awaiting-approval", "starting-host", "client-pending")


@dataclass(slots=True)
class _Request:
    request_id: str
    owner: str
    plugin_id: str
    package: Package
    run_id: str
    mode: Mode
    requires_approval: bool
    hosting: bool = False  # a page has run (or is running) the Host half for it
    started_by: int | None = None  # the page that started it (its failure may retract)

    def event(self) -> RunRequested:
        return RunRequested(
            request_id=self.request_id,
            agent=self.owner,
            plugin_id=self.plugin_id,
            package_id=self.package.package_id,
            run_id=self.run_id,
            mode=self.mode,
            name=self.package.name,
            purpose=self.package.purpose,
            requires_approval=self.requires_approval,
            has_host=self.package.has_host,
            source=ReviewSource.of(self.package.host, self.package.client),
        )


class ClientRuns:
    """Implements the runner's `ClientActivation` seam and the page runners' verbs."""

    def __init__(self, runner: CordisRunner, hub: PageHub, steering: Steering) -> None:
        self._runner = runner
        self._hub = hub
        self._steering = steering
        self._requests: dict[str, _Request] = {}
        self._panel_runs: dict[str, int] = {}  # run id -> the page whose gesture started it
        hub.add_pending_source(self._pending_for)
        runner.client_activation = self

    def _pending_for(self, agent: str) -> list[PageEvent]:
        return [r.event() for r in self._requests.values() if r.owner == agent]

    def _request_of(self, plugin_id: str) -> _Request | None:
        return next((r for r in self._requests.values() if r.plugin_id == plugin_id), None)

    # -- the runner's seam --------------------------------------------------------------------

    def has_pending(self, plugin_id: str) -> bool:
        return self._request_of(plugin_id) is not None

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
        self._requests[request.request_id] = request
        self._hub.publish(plugin.owner, request.event())
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
        request = self._request_of(plugin.plugin_id)
        if request is None:
            return False
        del self._requests[request.request_id]
        attempt = plugin.latest
        if attempt is not None and attempt.run_id == request.run_id:
            attempt.status = "cancelled"
            attempt.error = self._diagnostic(
                plugin, attempt, "approval", "the run request was cancelled (stopped or removed)"
            )
            for half in (attempt.host, attempt.client):
                if half.status != "absent":
                    half.status = "stopped"
        self._hub.publish(plugin.owner, RunResolved(request.request_id, "cancelled"))
        return True

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
        request = self._requests.get(request_id)
        if request is None or request.owner != page.agent:
            return refused(f'no pending run request "{request_id}"', "request-unknown")
        if (plugin_id, package_id, mode) != (
            request.plugin_id,
            request.package.package_id,
            request.mode,
        ):
            return refused(
                f'run request "{request_id}" is for {request.plugin_id}/'
                f'{request.package.package_id} mode "{request.mode}"',
                "request-mismatch",
            )
        plugin = self._runner.find(page.agent, plugin_id)
        attempt = plugin.latest if plugin is not None else None
        if plugin is None or attempt is None or attempt.run_id != request.run_id:
            return refused(f'run request "{request_id}" is stale', "request-stale")
        if attempt.status not in _OPEN:
            return refused(f'run request "{request_id}" is stale', "request-stale")
        if request.requires_approval:  # the grant is kept even if later steps fail
            self._runner.grant(plugin, package_id, approve_future_versions)
        if attempt.status == "awaiting-approval":
            attempt.status = "starting-host"
        if request.hosting:  # another page started it: share its start
            return await self._shared(plugin, request.run_id)
        request.hosting = True
        request.started_by = page.page_id
        return await self._start(plugin, request.package, attempt)

    async def _start(self, plugin: Plugin, package: Package, attempt: Attempt) -> Answer:
        task = self._runner.start_host(
            plugin, package, attempt, self._runner.hosts, client_pending=package.has_client
        )
        try:
            await asyncio.shield(task)
        except CordisError as exc:
            return refused(exc.message, "host-half-failed", run_id=attempt.run_id)
        return Answer(True, run_id=attempt.run_id, started_here=True)

    async def _shared(self, plugin: Plugin, run_id: str) -> Answer:
        task = self._runner.starting_task(plugin.plugin_id)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        run = plugin.run
        if run is None or run.run_id != run_id:
            error = plugin.latest.error if plugin.latest is not None else None
            message = error.message if error is not None else "the Host half is not running"
            return refused(message, "host-half-failed", run_id=run_id)
        return Answer(True, run_id=run_id, started_here=False)

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
        plugin = self._runner.find(page.agent, plugin_id)
        run = plugin.run if plugin is not None else None
        if plugin is None or run is None or run.run_id != run_id:
            return refused(f'run "{run_id}" is not the active run of "{plugin_id}"', "stale-run")
        package = plugin.packages[run.package_id]
        if package.client is None:
            return refused(f'package "{package.package_id}" has no Client half', "no-client-half")
        code = ClientCode(package.client, package.name, plugin_id, package.package_id, run_id)
        return Answer(True, run_id=run_id, client_code=code)

    # -- settlement ---------------------------------------------------------------------------

    def settle(
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
        request = self._requests.get(request_id)
        if request is None or request.owner != page.agent:
            return refused(f'no pending run request "{request_id}"', "request-unknown")
        plugin = self._runner.find(page.agent, request.plugin_id)
        if plugin is None:
            return refused(f'no pending run request "{request_id}"', "request-unknown")
        run = plugin.run
        active = run.run_id if run is not None and run.run_id == request.run_id else None
        if outcome == "success" and (not run_id or run_id != active):
            return refused(f'run "{run_id}" is not the active run of this request', "stale-run")
        if outcome != "success" and run_id and run_id != active:
            return refused(f'run "{run_id}" is not the active run of this request', "stale-run")
        del self._requests[request_id]  # claimed: the first valid answer wins
        attempt = plugin.latest
        assert attempt is not None and attempt.run_id == request.run_id
        p, k, mode = plugin.plugin_id, request.package.package_id, request.mode
        returned = "awaiting-approval" if request.requires_approval else "starting"
        metadata: dict[str, JsonValue] = {
            "pluginId": p,
            "packageId": k,
            "pluginRunId": attempt.run_id,
        }
        if outcome == "success":
            self._commit(plugin, attempt, client_waiting_for)
            text = completed_text(mode, p, k, attempt.run_id, k)
            resolution = "approved"
        elif outcome == "rejected":
            attempt.status = "rejected"
            attempt.error = self._diagnostic(plugin, attempt, "approval", "the user rejected it")
            attempt.client = HalfState("stopped")
            if attempt.host.status != "absent":
                attempt.host = HalfState("stopped")
            if active is not None:
                self._retract_in_background(plugin)
            text = rejected_text(mode, p, k, attempt.run_id)
            resolution = "rejected"
        else:
            if active is not None and request.started_by == page.page_id:
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
            resolution = "failed"
        self._runner.changed(plugin)
        if not request.requires_approval:
            resolution = "completed"
        self._hub.publish(page.agent, RunResolved(request_id, resolution))
        self._steering.steer(plugin.owner, text, metadata)
        return Answer(True, run_id=attempt.run_id)

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

    def render_failure(
        self, page: Page, plugin_id: str, run_id: str, message: str, stack: str
    ) -> Answer:
        """Kept on the run (so cleared by a new run or a stop); reports about another agent's
        plugin or a stale run are dropped."""
        plugin = self._runner.find(page.agent, plugin_id)
        run = plugin.run if plugin is not None else None
        if plugin is None or run is None or run.run_id != run_id:
            return refused(f'run "{run_id}" is not the active run of "{plugin_id}"', "stale-run")
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


def _detail(message: str, stack: str) -> str:
    return f"{message}\n{stack}" if stack else message
