"""Attached MCP servers, supervised: one connection (one process, for stdio) per scope and server.

Each attachment gets a `ProviderSession` of its own, so its tools enter exactly its scope's
catalog and pass the one pipeline, like a tool provider stream's. The supervisor connects
(initialize bounded by a timeout), lists the tools, registers each on its own (a tool the
catalog cannot take is refused alone, with its reason logged and shown in the scope's
`mcp_servers[].refused_tools`), re-lists on `tools/list_changed`, and restarts a server that
died with exponential backoff. While it is down its tools stay listed and fail
PROVIDER_UNAVAILABLE at once. A caller's abort cancels the call's task, which sends the server
`notifications/cancelled`.

`McpServers` keeps the running set equal to what the catalog's scopes attach (created here or
on another registry sharing the store, restored at start) and holds each server's admission
slot until its process is gone. Deleting the scope, or closing the registry, stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from codemode_wire.errors import CodemodeError
from registry_service.domain.admission import Admission, Slot
from registry_service.domain.mcp_servers import (
    ConnectionEvents,
    McpAttachment,
    McpCallFailed,
    McpConnection,
    McpConnectionLost,
    McpConnector,
    McpPolicy,
)
from registry_service.domain.providers import (
    PROVIDER_UNAVAILABLE,
    CancellationMessage,
    InvocationMessage,
    ProviderHub,
    ProviderSession,
    ToolSpec,
)
from registry_service.domain.results import ToolResult, error_result

log = logging.getLogger(__name__)

__all__ = ["McpServerStatus", "McpServers", "McpTiming"]


@dataclass(frozen=True, slots=True)
class McpTiming:
    initialize_timeout_s: float = 10.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 30.0


@dataclass(frozen=True, slots=True)
class McpServerStatus:
    state: str  # connecting | ready | down
    last_error: str
    refused_tools: tuple[str, ...]


class _Supervisor:
    """One attached server of one scope."""

    def __init__(
        self,
        scope: str,
        attachment: McpAttachment,
        *,
        policy: McpPolicy,
        connector: McpConnector,
        providers: ProviderHub,
        timing: McpTiming,
        slot: Slot,
    ) -> None:
        self.scope = scope
        self.attachment = attachment
        self._policy = policy
        self._connector = connector
        self._providers = providers
        self._timing = timing
        self._slot = slot
        self.session: ProviderSession = providers.open(f"mcp:{attachment.label}")
        self._connection: McpConnection | None = None
        self._calls: dict[str, asyncio.Task[None]] = {}
        self._registered: dict[str, ToolSpec] = {}
        self._changed = asyncio.Event()
        self.state = "connecting"
        self.last_error = ""
        self.refused: tuple[str, ...] = ()
        self._tasks = [
            asyncio.create_task(self._run(), name=f"mcp {scope} {attachment.label}"),
            asyncio.create_task(self._pump(), name=f"mcp pump {scope} {attachment.label}"),
        ]

    def status(self) -> McpServerStatus:
        return McpServerStatus(self.state, self.last_error, self.refused)

    async def _run(self) -> None:
        delay = self._timing.backoff_initial_s
        while True:
            connection: McpConnection | None = None
            self.state = "connecting"
            try:
                spec = self._policy.resolve(self.attachment)
                events = ConnectionEvents(tools_changed=self._changed.set)
                connection = await asyncio.wait_for(
                    self._connector.connect(spec, self.attachment.label, events),
                    self._timing.initialize_timeout_s,
                )
                self._changed.clear()
                await self._list(connection)
                self._connection = connection
                self.state = "ready"
                self.last_error = ""
                delay = self._timing.backoff_initial_s
                why = await self._serve(connection)
            except TimeoutError:
                why = (
                    f"the server did not answer initialize within "
                    f"{self._timing.initialize_timeout_s:g} s"
                )
            except CodemodeError as exc:
                why = exc.message
            except McpConnectionLost as exc:
                why = str(exc)
            except Exception as exc:  # the server's fault, whatever it is: restart it
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            finally:
                self._connection = None
                self.state = "down"
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close()
            self.last_error = why
            self._fail_calls(why)
            log.warning(
                "MCP server %s of %s is down (%s); restarting in %.3g s",
                self.attachment.label,
                self.scope,
                why,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._timing.backoff_max_s)

    async def _serve(self, connection: McpConnection) -> str:
        """Until the connection ends: re-lists the tools on each `tools/list_changed`."""
        closed = asyncio.ensure_future(connection.closed())
        try:
            while True:
                changed = asyncio.ensure_future(self._changed.wait())
                done, _ = await asyncio.wait({closed, changed}, return_when=asyncio.FIRST_COMPLETED)
                if closed in done:
                    changed.cancel()
                    return closed.result()
                self._changed.clear()
                await asyncio.wait_for(self._list(connection), self._timing.initialize_timeout_s)
        finally:
            closed.cancel()

    async def _list(self, connection: McpConnection) -> None:
        specs, refused = await connection.list_tools()
        wanted = {spec.name: spec for spec in specs}
        for name, spec in list(self._registered.items()):
            if wanted.get(name) != spec:
                self.session.unregister(self.scope, name)
                del self._registered[name]
        refusals = list(refused)
        for name, spec in wanted.items():
            if name in self._registered:
                continue
            try:
                self.session.register(self.scope, [spec])
            except CodemodeError as exc:
                refusals.append(f"{name}: {exc.message}")
                continue
            self._registered[name] = spec
        for refusal in refusals:
            if refusal not in self.refused:
                log.warning(
                    "MCP server %s of %s: tool refused: %s",
                    self.attachment.label,
                    self.scope,
                    refusal,
                )
        self.refused = tuple(refusals)

    async def _pump(self) -> None:
        """The session's outbox: invocations become `tools/call`s, cancellations cancel them."""
        while True:
            message = await self.session.outbox.get()
            if isinstance(message, CancellationMessage):
                task = self._calls.pop(message.invocation_id, None)
                if task is not None:
                    task.cancel()
                continue
            if not isinstance(message, InvocationMessage):
                continue
            connection = self._connection
            if connection is None:  # down: fail at once, never wait for a restart
                self.session.resolve(message.invocation_id, self._unavailable(self.last_error))
                continue
            task = asyncio.create_task(self._call(connection, message))
            self._calls[message.invocation_id] = task

    async def _call(self, connection: McpConnection, message: InvocationMessage) -> None:
        invocation = message.invocation
        try:
            result = await connection.call(
                invocation.tool_name,
                invocation.arguments_json,
                message.timeout,
                invocation.progress,
            )
        except asyncio.CancelledError:
            return  # the caller's abort (already settled) or the server going down
        except McpCallFailed as exc:
            result = error_result(exc.message, exc.code)
        except Exception as exc:
            result = self._unavailable(str(exc) or type(exc).__name__)
        finally:
            self._calls.pop(message.invocation_id, None)
        self.session.resolve(message.invocation_id, result)

    def _unavailable(self, why: str) -> ToolResult:
        reason = f" ({why})" if why else ""
        return error_result(
            f'MCP server "{self.attachment.label}" is unavailable{reason}', PROVIDER_UNAVAILABLE
        )

    def _fail_calls(self, why: str) -> None:
        calls, self._calls = self._calls, {}
        for invocation_id, task in calls.items():
            task.cancel()
            self.session.resolve(invocation_id, self._unavailable(why))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()
        self._fail_calls("its scope is gone")
        self._providers.close(self.session)
        self._slot.release()


class McpServers:
    """The running MCP servers: one supervisor per (scope, attachment) the catalog holds."""

    def __init__(
        self,
        attached: Callable[[], Mapping[str, tuple[McpAttachment, ...]]],
        *,
        policy: McpPolicy,
        connector: McpConnector,
        providers: ProviderHub,
        admission: Admission,
        timing: McpTiming | None = None,
    ) -> None:
        self.policy = policy
        self._attached = attached
        self._connector = connector
        self._providers = providers
        self._admission = admission
        self._timing = timing or McpTiming()
        self._running: dict[tuple[str, str], _Supervisor] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False

    def admit(self, scope: str, attachments: tuple[McpAttachment, ...]) -> None:
        """Before a scope with `attachments` is stored: each resolvable, and room for them in
        the scope's and the registry's `max_mcp_servers` (raises: nothing is stored)."""
        self.policy.check(attachments)
        for slot in self._admission.mcp_servers(scope, len(attachments)):
            slot.release()  # taken for real by `sync` once the scope exists

    def sync(self) -> None:
        """Starts what the catalog attaches and is not running; stops what it no longer does
        (a deleted scope). Cheap when nothing changed: called on every catalog change."""
        if self._closed:
            return
        wanted = {
            (scope, a.label): a
            for scope, attachments in self._attached().items()
            for a in attachments
        }
        for key in [k for k in self._running if k not in wanted]:
            self._stop(self._running.pop(key))
        for (scope, label), attachment in wanted.items():
            if (scope, label) in self._running:
                continue
            try:
                [slot] = self._admission.mcp_servers(scope, 1)
            except CodemodeError as exc:
                log.error("MCP server %s of %s not started: %s", label, scope, exc.message)
                continue
            self._running[(scope, label)] = _Supervisor(
                scope,
                attachment,
                policy=self.policy,
                connector=self._connector,
                providers=self._providers,
                timing=self._timing,
                slot=slot,
            )

    def status(self, scope: str, attachment: McpAttachment) -> McpServerStatus:
        supervisor = self._running.get((scope, attachment.label))
        if supervisor is None:
            return McpServerStatus("down", "not started (see the registry log)", ())
        return supervisor.status()

    def _stop(self, supervisor: _Supervisor) -> None:
        task = asyncio.ensure_future(supervisor.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def settled(self) -> None:
        """Returns once every server being stopped is gone."""
        while self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)

    async def close(self) -> None:
        self._closed = True
        running, self._running = self._running, {}
        for supervisor in running.values():
            self._stop(supervisor)
        await self.settled()
