"""Telling the agent what it could not see in a tool result (docs/cordis.md).

Cordis wakes the owning agent (`agent.steer`) and adds context for its next step
(`agent.inject`). Codemode has no agent loop of its own: both become durable history records of
the owner (`agent/steer`, `agent/inject`), which `WatchHistory` delivers to the backend that
runs the loop. Steering is for outcomes that arrive after `cordis_run` returned and for
failures after an activation succeeded; each distinct kind of failure steers once per run, so a
crash looping through several symptoms (its tool calls failing, its stream ending) wakes the
agent once.

`inject` carries a person's panel actions on a page runner (a manual run's outcome, a stop, a
remove): context for the next step rather than a reason to wake up."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from codemode_wire.errors import CodemodeError
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain import records
from registry_service.domain.records import AGENT_INJECT, AGENT_STEER, Record

log = logging.getLogger(__name__)

SOURCE = "cordis-host-runner"  # the source named in every steering record
INSPECT_DIRECTION = (
    "Inspect the failed Package, correct it on the same Plugin when needed, and retry the "
    "activation autonomously."
)
# The kinds of post-activation failure a run steers about (once each).
HOST_LOST = "host-lost"
PANEL = "the plugin panel"

Submit = Callable[[Record], "asyncio.Future[Record]"]


def completed_text(mode: str, plugin_id: str, package_id: str, run_id: str, current: str) -> str:
    return (
        f"Cordis {mode} {plugin_id}/{package_id} ({run_id}) completed successfully. "
        f"currentPackageId is {current}. Continue using the running Plugin."
    )


def rejected_text(mode: str, plugin_id: str, package_id: str, run_id: str) -> str:
    return (
        f"The user rejected Cordis {mode} {plugin_id}/{package_id} ({run_id}). Do not request "
        "the same activation again unless the user asks."
    )


def panel_run_text(
    mode: str,
    plugin_id: str,
    package_id: str,
    run_id: str,
    *,
    failure: str = "",
    current: str | None,
    next_: str | None,
) -> str:
    """A run the person started from the panel (`failure`: its reason and detail, if any)."""
    head = f"The user ran Cordis {mode} {plugin_id}/{package_id} ({run_id}) from {PANEL}"
    if not failure:
        return f"{head}; it completed successfully. currentPackageId is {current}."
    return (
        f"{head}; it failed: {failure}\n"
        f"currentPackageId: {current or 'none'}\nnextPackageId: {next_ or 'none'}"
    )


def panel_stop_text(plugin_id: str) -> str:
    return (
        f"The user stopped Cordis Plugin {plugin_id} from {PANEL}; its definition and "
        "versions remain."
    )


def panel_remove_text(plugin_id: str) -> str:
    return f"The user removed Cordis Plugin {plugin_id} and all of its Packages from {PANEL}."


def failed_text(
    mode: str,
    plugin_id: str,
    package_id: str,
    run_id: str,
    *,
    returned: str,
    reason: str,
    detail: str,
    current: str | None,
    next_: str | None,
) -> str:
    """A technical failure: `returned` is what `cordis_run` answered (`running` when the run
    failed after its activation had succeeded), `reason` a short kind, `detail` the message
    (and stack)."""
    return (
        f"Cordis {mode} {plugin_id}/{package_id} ({run_id}) failed after cordis_run returned "
        f"{returned}: {reason}\n{detail}\n"
        f"currentPackageId: {current or 'none'}\nnextPackageId: {next_ or 'none'}\n"
        f"{INSPECT_DIRECTION}"
    )


def taken_over_text(
    plugin_id: str,
    package_id: str,
    run_id: str,
    lost_run_id: str,
    lost_address: str,
    *,
    client_half: bool = False,
) -> str:
    """A survivor reactivated the current package of a plugin whose registry was lost
    (`client_half`: only its Host half; the Client half waits for a page)."""
    client = (
        " Its Host half runs; its Client half waits (client-pending) for a page attached to "
        "this agent to load it again."
        if client_half
        else ""
    )
    return (
        f"Cordis plugin {plugin_id} ({lost_run_id}) ran on a registry that was lost "
        f"({lost_address}); its current package {package_id} was reactivated on another "
        f"registry as {run_id}.{client} Calls that were in flight when it was lost failed with "
        "ABORTED and were not retried: repeat them if they are still needed."
    )


def take_over_failed_text(
    plugin_id: str, package_id: str, run_id: str, lost_address: str, detail: str
) -> str:
    return (
        f"Cordis plugin {plugin_id} ran on a registry that was lost ({lost_address}); "
        f"reactivating its current package {package_id} on another registry ({run_id}) "
        f"failed: {detail}\ncurrentPackageId: {package_id}\n{INSPECT_DIRECTION}"
    )


class Steering:
    """Writes `agent/steer` and `agent/inject` records through the history store's `submit`
    (called from the event loop, also from synchronous host callbacks: nothing waits)."""

    def __init__(
        self, submit: Submit | None = None, agent_id_of: Callable[[str], str] | None = None
    ) -> None:
        """`agent_id_of(owner)`: the owner agent's stable id, the key of its history (none:
        records are keyed by the owner's name, for tests without a catalog)."""
        self._submit = submit
        self._agent_id_of = agent_id_of or (lambda owner: owner)
        self._once: set[tuple[str, str]] = set()  # (run id, kind) already steered
        self._writing: set[asyncio.Future[Record]] = set()

    def steer(self, owner: str, text: str, metadata: dict[str, JsonValue]) -> None:
        self._write(AGENT_STEER, owner, text, metadata, SOURCE)

    def steer_once(
        self, run_id: str, kind: str, owner: str, text: str, metadata: dict[str, JsonValue]
    ) -> bool:
        """Steers unless this run already steered about `kind`; True when it wrote."""
        if (run_id, kind) in self._once:
            return False
        self._once.add((run_id, kind))
        self.steer(owner, text, metadata)
        return True

    def inject(
        self,
        owner: str,
        text: str,
        metadata: dict[str, JsonValue] | None = None,
        source: str = SOURCE,
    ) -> None:
        """Context for the owner's next step (a panel action): the page runner's seam."""
        self._write(AGENT_INJECT, owner, text, metadata or {}, source)

    def _write(
        self, kind: str, owner: str, text: str, metadata: dict[str, JsonValue], source: str
    ) -> None:
        if self._submit is None:
            log.info("cordis %s for %s (no history): %s", kind, owner, text)
            return
        try:
            agent_id = self._agent_id_of(owner)
        except CodemodeError:  # the agent was deleted meanwhile: it has no history to wake
            log.info("cordis %s for %s (deleted): %s", kind, owner, text)
            return
        record = records.agent_message(
            kind, agent=owner, agent_id=agent_id, source=source, text=text, metadata=metadata
        )
        future = self._submit(record)
        self._writing.add(future)
        future.add_done_callback(self._written)

    def _written(self, future: asyncio.Future[Record]) -> None:
        self._writing.discard(future)
        if future.cancelled():
            return
        exc = future.exception()
        if isinstance(exc, CodemodeError):  # the store says why; the agent misses one message
            log.error("cordis: a steering record was not written: %s", exc.message)
        elif exc is not None:
            log.error("cordis: a steering record was not written", exc_info=exc)

    async def flush(self) -> None:
        """Waits for the records submitted so far (before the store closes)."""
        if self._writing:
            await asyncio.gather(*self._writing, return_exceptions=True)
