"""The tool catalog: layered registrations, restrictions, guards, hooks and presentation modes.

One traversal (`view`) feeds listing, presentation and execution, so what the model is shown and
what the executor accepts cannot drift apart. Every registration lives in the
layer of the scope it was made in; deleting the scope drops the layer, which revokes exactly what
it held.

Presets, agents, their declarations and restrictions are durable: every change is emitted as
change records through the catalog's port (`catalog_changes.CatalogPort`) and written before the
catalog changes itself, so a failed write leaves it as it was and answers the call with the
store's error. Tools and hooks are not stored (their providers and plugins bring them back).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from codemode_wire.errors import (
    CodemodeError,
    already_exists,
    failed_precondition,
    invalid_argument,
    not_found,
)
from registry_service.domain.catalog_changes import (
    CatalogChange,
    CatalogConflict,
    CatalogPort,
    CatalogSnapshot,
    DeleteHistory,
    DeleteRestriction,
    DeleteScope,
    InMemory,
    PutRestriction,
    PutScope,
    RestrictionRow,
    ScopeRow,
)
from registry_service.domain.mcp_attachments import McpAttachment
from registry_service.domain.policy import Guard, PolicyHooks
from registry_service.domain.scopes import (
    GLOBAL,
    Mode,
    check_id,
    check_language,
    parse_name,
    parse_scope,
)
from registry_service.domain.tools import RUN_CODE, ToolDefinition, validate_definition

log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000


def new_agent_id() -> str:
    """A random 128-bit id: never reused, across restarts and deletes, with no counter to keep."""
    return uuid.uuid4().hex


def new_restriction_id() -> str:
    """`r` and 64 random bits: a removed restriction's id is not handed out again (a client
    holding it cannot remove another restriction by mistake), with no counter to keep."""
    return f"r{uuid.uuid4().hex[:16]}"


_T = TypeVar("_T")
_CONFLICT_ATTEMPTS = 3  # a scope changed elsewhere between reload and write, twice in a row


@dataclass(frozen=True, slots=True)
class Restriction:
    allow: frozenset[str] | None
    deny: frozenset[str] | None

    def admits(self, name: str) -> bool:
        return (self.allow is None or name in self.allow) and (
            self.deny is None or name not in self.deny
        )


@dataclass
class Layer:
    tools: dict[str, ToolDefinition] = field(default_factory=dict)
    restrictions: dict[str, Restriction] = field(default_factory=dict)
    hooks: PolicyHooks = field(default_factory=PolicyHooks)
    mode: Mode | None = None
    language: str | None = None
    self_modification: bool | None = None  # None: not declared in this scope
    mcp_servers: tuple[McpAttachment, ...] = ()


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    create_time: float


@dataclass(frozen=True, slots=True)
class Agent:
    name: str
    preset: str  # "" when unparented
    create_time: float
    agent_id: str  # the stable identity that keys the agent's history (never reused)


@dataclass(frozen=True, slots=True)
class View:
    """What one scope sees, computed in one traversal."""

    scope: str
    mode: Mode
    language: str  # the program language in force (nearest declaration, else the default)
    visible: dict[str, ToolDefinition]  # run_code last when the mode is not native
    # Where each visible tool is registered (the layer it came from; run_code: global).
    registered_in: dict[str, str]
    known_names: tuple[str, ...]  # pre-restriction names (inherited + own)
    restrictable_names: frozenset[str]  # inherited names only
    # Dynamic Cordis in force (nearest declaration, else the deployment default): the seven
    # cordis tools are then visible like inherited tools, and the prompt has `tool:cordis`.
    self_modification: bool = False


@dataclass(frozen=True, slots=True)
class Page:
    items: list[str]
    next_page_token: str


class Catalog:
    def __init__(
        self,
        default_mode: Mode,
        run_code: ToolDefinition,
        default_language: str = "",
        *,
        languages: Collection[str] = (),
        default_self_modification: bool = False,
        store: CatalogPort | None = None,
        delete_history_with_agent: bool = False,
    ) -> None:
        """`default_language`: the program language of scopes that declare none ("": none, so
        presentation takes the deployment's first runtime language); `languages`: the program
        languages a scope may declare (the registry's language profiles; none: no scope may
        declare one); `store` writes every change before the catalog makes it (none: memory
        only); `delete_history_with_agent` deletes an agent's history with it (else it stays
        readable by the agent's id)."""
        self.default_mode = default_mode
        self._store: CatalogPort = store or InMemory()
        self._delete_history_with_agent = delete_history_with_agent
        # One change at a time: a change is checked, written, then made, with no other change
        # in between (the write may wait on the store).
        self._writing = asyncio.Lock()
        # Scopes declared by the settings, as declared (merged over the stored ones by
        # `restore`), and ids of history kept under names before agents had ids.
        self._declared: dict[str, ScopeRow] = {}
        self.default_self_modification = default_self_modification
        # The seven Cordis tools (installed once by the registry): visible wherever
        # self-modification is in force, as if inherited from an overlay below the global layer.
        self._cordis_tools: dict[str, ToolDefinition] = {}
        self._delete_listeners: list[Callable[[str], None]] = []
        # Not checked here: the deployment's first runtime language is the default even when
        # no flavour exists for it, and then every non-native assembly says so.
        self.default_language = default_language
        self._languages = tuple(languages)
        self._run_code = run_code
        self._layers: dict[str, Layer] = {GLOBAL: Layer()}
        self._presets: dict[str, Preset] = {}
        self._agents: dict[str, Agent] = {}
        # Why the stored presets and agents could not be read at start (None: they were): a
        # name not known here may still be stored, so it is not answered as not found.
        self._unread: CodemodeError | None = None
        # The scopes that attach MCP servers (`mcp_supervisor.McpServers` runs them).
        self._mcp: dict[str, tuple[McpAttachment, ...]] = {}
        self._listeners: list[Callable[[], None]] = []
        # Bumped on every change that can alter any scope's view: a cheap cache key.
        self.version = 0
        self._views: dict[str, View] = {}

    # -- change notification ---------------------------------------------------------------

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def on_delete(self, listener: Callable[[str], None]) -> None:
        """`listener(scope)` runs after a preset or agent (and its layer) is deleted."""
        self._delete_listeners.append(listener)

    def _deleted(self, scope: str) -> None:
        for listener in self._delete_listeners:
            listener(scope)

    def install_cordis_tools(self, definitions: Iterable[ToolDefinition]) -> None:
        for defn in definitions:
            validate_definition(defn)
            self._cordis_tools[defn.name] = defn
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._views.clear()
        for listener in self._listeners:
            listener()

    # -- resources -----------------------------------------------------------------------------

    async def _write(self, changes: Sequence[CatalogChange]) -> None:
        await self._store.apply(changes)

    async def _change(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """Runs `attempt` (check, write, then make the change) under the change lock. When
        the store finds that another registry sharing it changed the scope first (this one
        had not heard yet), the scope is reloaded and `attempt` runs again on what is there
        now: its checks then answer as they would have (the name exists, the agent is gone),
        or the change applies to the scope as it now is."""
        async with self._writing:
            for _ in range(_CONFLICT_ATTEMPTS - 1):
                try:
                    return await attempt()
                except CatalogConflict as conflict:
                    await self._reload([conflict.scope])
            return await attempt()

    def _new_preset(
        self,
        preset_id: str,
        mode: Mode | None,
        language: str | None,
        self_mod: bool | None,
        *,
        mcp: tuple[McpAttachment, ...] = (),
    ) -> ScopeRow:
        """The row of a preset that may be created now (raises when it may not)."""
        check_id("preset", preset_id)
        if language is not None:
            check_language(language, self._languages)
        name = f"presets/{preset_id}"
        if name in self._presets:
            raise already_exists("PRESET_EXISTS", f"preset {name!r} already exists", preset=name)
        return ScopeRow(name, time.time(), mode, language, self_mod, mcp_servers=mcp)

    def _new_agent(
        self,
        agent_id: str,
        preset: str,
        mode: Mode | None,
        language: str | None,
        self_mod: bool | None,
        *,
        mcp: tuple[McpAttachment, ...] = (),
    ) -> ScopeRow:
        """The row of an agent that may be created now, with a new id (raises when it may not)."""
        check_id("agent", agent_id)
        if language is not None:
            check_language(language, self._languages)
        name = f"agents/{agent_id}"
        if preset:
            parse_name(preset, allow=("presets",))
            self.get_preset(preset)
        if name in self._agents:
            raise already_exists("AGENT_EXISTS", f"agent {name!r} already exists", agent=name)
        return ScopeRow(
            name, time.time(), mode, language, self_mod, preset, new_agent_id(), mcp_servers=mcp
        )

    def _put(self, row: ScopeRow) -> None:
        """Makes the scope `row` describes (a new layer), or updates it in place (its tools,
        restrictions and hooks stay)."""
        if row.is_agent:
            self._agents[row.name] = Agent(row.name, row.preset, row.create_time, row.agent_id)
        else:
            self._presets[row.name] = Preset(row.name, row.create_time)
        layer = self._layers.setdefault(row.name, Layer())
        layer.mode = row.mode
        layer.language = row.language
        layer.self_modification = row.self_modification
        layer.mcp_servers = row.mcp_servers
        if row.mcp_servers:
            self._mcp[row.name] = row.mcp_servers
        else:
            self._mcp.pop(row.name, None)

    def row(self, name: str) -> ScopeRow:
        """The stored form of an existing preset or agent."""
        layer = self._layers[name]
        agent = self._agents.get(name)
        return ScopeRow(
            name=name,
            create_time=agent.create_time if agent else self._presets[name].create_time,
            mode=layer.mode,
            language=layer.language,
            self_modification=layer.self_modification,
            preset=agent.preset if agent else "",
            agent_id=agent.agent_id if agent else "",
            mcp_servers=layer.mcp_servers,
        )

    async def create_preset(
        self,
        preset_id: str,
        mode: Mode | None,
        language: str | None = None,
        self_modification: bool | None = None,
        *,
        mcp_servers: tuple[McpAttachment, ...] = (),
    ) -> Preset:
        async def attempt() -> Preset:
            row = self._new_preset(preset_id, mode, language, self_modification, mcp=mcp_servers)
            await self._write([PutScope(row, create=True)])
            self._put(row)
            self._changed()
            return self._presets[row.name]

        return await self._change(attempt)

    async def create_agent(
        self,
        agent_id: str,
        preset: str,
        mode: Mode | None,
        language: str | None = None,
        self_modification: bool | None = None,
        *,
        mcp_servers: tuple[McpAttachment, ...] = (),
    ) -> Agent:
        async def attempt() -> Agent:
            row = self._new_agent(
                agent_id, preset, mode, language, self_modification, mcp=mcp_servers
            )
            await self._write([PutScope(row, create=True)])
            self._put(row)
            self._changed()
            return self._agents[row.name]

        return await self._change(attempt)

    # -- settings-declared scopes and the stored catalog ---------------------------------------

    def declare_preset(
        self,
        preset_id: str,
        mode: Mode | None,
        language: str | None = None,
        self_modification: bool | None = None,
        *,
        mcp_servers: tuple[McpAttachment, ...] = (),
    ) -> Preset:
        """A preset the settings declare: made now, in memory (`restore` merges it with the
        stored one and stores the result)."""
        row = self._new_preset(preset_id, mode, language, self_modification, mcp=mcp_servers)
        self._declared[row.name] = row
        self._put(row)
        self._changed()
        return self._presets[row.name]

    def declare_agent(
        self,
        agent_id: str,
        preset: str,
        mode: Mode | None,
        language: str | None = None,
        self_modification: bool | None = None,
        *,
        mcp_servers: tuple[McpAttachment, ...] = (),
    ) -> Agent:
        """An agent the settings declare: made now, in memory, as `declare_preset`."""
        row = self._new_agent(agent_id, preset, mode, language, self_modification, mcp=mcp_servers)
        self._declared[row.name] = row
        self._put(row)
        self._changed()
        return self._agents[row.name]

    async def restore(self, snapshot: CatalogSnapshot) -> None:
        """At start, before any call: adds the stored presets, agents and restrictions.

        A scope the settings also declare keeps its stored identity (agent id, creation time,
        restrictions); the settings win for what they declare: the parent preset always, the
        mode, language and self-modification when they give one (else the stored declaration,
        e.g. a mode set over the API, stays). A settings-declared agent that is not stored
        takes over the history kept under its name before agents had ids. What the merge
        changed is stored in one transaction."""
        async with self._writing:
            writes: list[CatalogChange] = []
            stored = {row.name for row in snapshot.scopes}
            for row in snapshot.scopes:
                declared = self._declared.get(row.name)
                merged = row if declared is None else _merge(row, declared)
                if merged.preset and merged.preset not in self._presets:
                    log.error("catalog: %s names a missing preset %s", row.name, merged.preset)
                    merged = replace(merged, preset="")
                if merged != row:
                    writes.append(PutScope(merged))
                self._put(merged)
            for name in self._declared:
                if name in stored:
                    continue
                row = self.row(name)
                legacy = snapshot.legacy_agents.get(name)
                if legacy:
                    row = replace(row, agent_id=legacy)
                    self._put(row)
                writes.append(PutScope(row, create=True))
            for restriction in snapshot.restrictions:
                layer = self._layers.get(restriction.scope)
                if layer is None:
                    log.error("catalog: restriction %s of a missing scope", restriction)
                    continue
                allow = None if restriction.allow is None else frozenset(restriction.allow)
                deny = None if restriction.deny is None else frozenset(restriction.deny)
                layer.restrictions[restriction.restriction_id] = Restriction(allow, deny)
            self._changed()
            if writes:
                await self._write(writes)

    async def refresh(self, names: Collection[str] | None) -> None:
        """Makes the scopes named (None: every scope) what the store holds now: what another
        registry sharing the store changed. A scope gone from the store is deleted here as if
        deleted here (its layer, and the tools registered into it, go; delete listeners run);
        an agent stored under a new id was deleted and re-created there, so its old layer goes
        first. Read and made under the change lock: no change of this registry interleaves,
        and what is read is at least as new as this registry's own last change."""
        async with self._writing:
            await self._reload(names)
            if names is None:
                self._unread = None  # everything stored is known now

    def unreadable(self, error: CodemodeError) -> None:
        """The store could not be read at start (`error`): until a reload of everything works,
        a preset or agent this catalog does not know is answered with the store's error, not
        as not found (it may exist; HISTORY_CORRUPT for a damaged database)."""
        self._unread = error

    def _missing(self, kind: str, reason: str, name: str) -> CodemodeError:
        """The error for a preset or agent `name` this catalog does not know."""
        unread = self._unread
        if unread is not None:
            message = f"{kind} {name!r} cannot be looked up: {unread.message}"
            return CodemodeError(unread.status, unread.reason, message, {kind: name})
        return not_found(reason, f"{kind} {name!r} does not exist", **{kind: name})

    async def hear_of(self, scope: str) -> None:
        """A preset or agent this registry does not know may have been made on another one a
        moment ago (its notification still on the way): it is read from the store once, so
        that a provider registering into an agent just created elsewhere is not refused.
        A store that fails leaves the catalog as it is (the caller then finds no scope)."""
        if scope.startswith(("agents/", "presets/")) and scope not in self._layers:
            with contextlib.suppress(CodemodeError):
                await self.refresh([scope])

    async def _reload(self, names: Collection[str] | None) -> None:
        """`refresh` under the change lock. A stored agent's preset this registry has not
        heard of yet (made while it was not listening) is read along with it."""
        snapshot = await self._store.load_scopes(names)
        if names is not None:
            unknown = {row.preset for row in snapshot.scopes if row.preset} - {
                *self._presets,
                *names,
            }
            if unknown:
                names = {*names, *unknown}
                snapshot = await self._store.load_scopes(names)
        self._reconcile(snapshot, names)

    def _reconcile(self, snapshot: CatalogSnapshot, names: Collection[str] | None) -> None:
        stored = {row.name: row for row in snapshot.scopes}
        if names is None:
            # Settings-declared scopes the store lacks (their write at start failed) stay:
            # the settings declare them on every replica.
            local = {*self._presets, *self._agents} - self._declared.keys()
            names = {*stored, *local}
        restrictions: dict[str, dict[str, Restriction]] = {name: {} for name in names}
        for r in snapshot.restrictions:
            if r.scope in restrictions:
                allow = None if r.allow is None else frozenset(r.allow)
                deny = None if r.deny is None else frozenset(r.deny)
                restrictions[r.scope][r.restriction_id] = Restriction(allow, deny)
        gone: list[str] = []
        changed = False
        # Presets before agents (an agent may name a preset made in the same change); agents'
        # deletions before presets'.
        for name in sorted(names, key=lambda n: (n.startswith("agents/"), n)):
            row = stored.get(name)
            if row is None:
                continue
            current = self._agents.get(name)
            if current is not None and current.agent_id != row.agent_id:
                self._drop(name)  # deleted and re-created there: a new identity
                gone.append(name)
            if row.preset and row.preset not in self._presets:
                log.error("catalog: %s names a missing preset %s", name, row.preset)
                row = replace(row, preset="")
            layer = self._layers.get(name)
            if layer is not None and self.row(name) == row:
                if layer.restrictions == restrictions[name]:
                    continue
            else:
                self._put(row)
            self._layers[name].restrictions = restrictions[name]
            changed = True
        for name in sorted(names, key=lambda n: (not n.startswith("agents/"), n)):
            if name not in stored and (name in self._agents or name in self._presets):
                self._drop(name)
                gone.append(name)
        if changed or gone:
            self._changed()
        for name in gone:
            self._deleted(name)

    def _drop(self, name: str) -> None:
        """Removes a scope and its layer; a preset's agents here are unparented (the change
        that deleted it elsewhere unparented them in the store too)."""
        del self._layers[name]
        self._mcp.pop(name, None)
        if self._agents.pop(name, None) is None:
            del self._presets[name]
            for agent in [a for a in self._agents.values() if a.preset == name]:
                self._agents[agent.name] = replace(agent, preset="")

    def get_preset(self, name: str) -> Preset:
        parse_name(name, allow=("presets",))
        preset = self._presets.get(name)
        if preset is None:
            raise self._missing("preset", "PRESET_NOT_FOUND", name)
        return preset

    def get_agent(self, name: str) -> Agent:
        parse_name(name, allow=("agents",))
        agent = self._agents.get(name)
        if agent is None:
            raise self._missing("agent", "AGENT_NOT_FOUND", name)
        return agent

    def list_presets(self, page_size: int, page_token: str) -> tuple[list[Preset], str]:
        page = _paginate(sorted(self._presets), page_size, page_token, "presets/")
        return [self._presets[n] for n in page.items], page.next_page_token

    def list_agents(self, page_size: int, page_token: str) -> tuple[list[Agent], str]:
        page = _paginate(sorted(self._agents), page_size, page_token, "agents/")
        return [self._agents[n] for n in page.items], page.next_page_token

    async def delete_preset(self, name: str, *, force: bool = False) -> None:
        """Removes the preset and everything it declared. Its agents, if `force` allows it,
        are unparented: the deployment default applies to them again."""

        async def attempt() -> None:
            self.get_preset(name)
            users = sorted(a.name for a in self._agents.values() if a.preset == name)
            if users and not force:
                raise failed_precondition(
                    "PRESET_IN_USE",
                    f"preset {name!r} still has agents parented under it: {', '.join(users)} "
                    "(delete with force to unparent them)",
                    preset=name,
                )
            unparented = [replace(self.row(agent), preset="") for agent in users]
            await self._write([*map(PutScope, unparented), DeleteScope(name)])
            for row in unparented:
                self._put(row)
            del self._presets[name]
            del self._layers[name]
            self._mcp.pop(name, None)
            self._changed()

        await self._change(attempt)
        self._deleted(name)

    async def delete_agent(self, name: str) -> None:
        """Removes the agent and everything it declared. Its history stays, readable by its
        id, unless the catalog deletes histories with their agents."""

        async def attempt() -> Agent:
            agent = self.get_agent(name)
            changes: list[CatalogChange] = [DeleteScope(name, agent.agent_id)]
            if self._delete_history_with_agent:
                changes.append(DeleteHistory(agent.agent_id))
            await self._write(changes)
            del self._agents[name]
            del self._layers[name]
            self._mcp.pop(name, None)
            self._changed()
            return agent

        agent = await self._change(attempt)
        if not self._delete_history_with_agent:
            log.info("agent %s deleted; its history stays under agent_id %s", name, agent.agent_id)
        self._deleted(name)

    def history_key(self, agent: str, agent_id: str) -> str:
        """The agent id whose history a request reads: `agent_id` when given (an operator
        reading a deleted agent's history; it must match `agent` when both are), else the id
        of the existing agent `agent`."""
        if agent_id and not agent:
            return agent_id
        current = self.get_agent(agent).agent_id
        if agent_id and agent_id != current:
            raise invalid_argument(
                "AGENT_ID_MISMATCH",
                f"agent_id {agent_id!r} is not the id of {agent!r} (leave agent empty to read "
                "a deleted agent's history by its id)",
                field="agent_id",
            )
        return current

    def require_scope(self, scope: str, *, allow_global: bool = True) -> str:
        """Validates that `scope` names an existing scope."""
        parse_scope(scope, allow_global=allow_global)
        if scope.startswith("presets/"):
            self.get_preset(scope)
        elif scope.startswith("agents/"):
            self.get_agent(scope)
        return scope

    # -- MCP servers ---------------------------------------------------------------------------

    def declared_mcp_servers(self, scope: str) -> tuple[McpAttachment, ...]:
        return self._layers[scope].mcp_servers

    def mcp_attachments(self) -> dict[str, tuple[McpAttachment, ...]]:
        """Every scope that attaches MCP servers, and what it attaches."""
        return self._mcp

    # -- modes ---------------------------------------------------------------------------------

    def declared_mode(self, scope: str) -> Mode | None:
        return self._layers[scope].mode

    async def set_mode(self, scope: str, mode: Mode) -> None:
        await self._change(lambda: self._set_mode(scope, mode))

    async def _set_mode(self, scope: str, mode: Mode) -> None:
        self.require_scope(scope, allow_global=False)
        layer = self._layers[scope]
        if layer.mode is not None:
            raise failed_precondition(
                "MODE_ALREADY_DECLARED",
                f'presentation mode "{mode.value}" conflicts with "{layer.mode.value}" already '
                "declared for this scope; one scope selects one presentation",
                scope=scope,
            )
        await self._write([PutScope(replace(self.row(scope), mode=mode))])
        layer.mode = mode
        self._changed()

    # -- program languages ---------------------------------------------------------------------

    def declared_language(self, scope: str) -> str | None:
        return self._layers[scope].language

    def language_for(self, scope: str) -> str:
        """The program language in force: the nearest declaration, else the default."""
        return self._nearest(scope, lambda layer: layer.language, self.default_language)

    # -- self-modification (dynamic Cordis) -------------------------------------------------

    def declared_self_modification(self, scope: str) -> bool | None:
        return self._layers[scope].self_modification

    def self_modification_for(self, scope: str) -> bool:
        """Self-modification in force: the nearest declaration, else the deployment default."""
        return self._nearest(
            scope, lambda layer: layer.self_modification, self.default_self_modification
        )

    def chain(self, scope: str) -> list[str]:
        """Scope keys nearest-first, excluding the global layer."""
        if scope.startswith("agents/"):
            agent = self._agents[scope]
            return [scope, agent.preset] if agent.preset else [scope]
        return [scope] if scope else []

    def mode_for(self, scope: str) -> Mode:
        return self._nearest(scope, lambda layer: layer.mode, self.default_mode)

    def _nearest(self, scope: str, declared: Callable[[Layer], _T | None], default: _T) -> _T:
        """What the nearest scope of `scope`'s chain (agent, preset, global) declares."""
        for key in self.chain(scope):
            value = declared(self._layers[key])
            if value is not None:
                return value
        return default

    # -- registrations -------------------------------------------------------------------------

    def register(self, scope: str, definitions: Iterable[ToolDefinition]) -> list[ToolDefinition]:
        """Registers tools into a scope atomically: all of them, or none with a clear error."""
        self.require_scope(scope)
        batch = list(definitions)
        layer = self._layers[scope]
        seen: set[str] = set()
        for defn in batch:
            validate_definition(defn)
            if defn.name in layer.tools or defn.name in seen:
                if defn.name in seen:
                    message = f'tool "{defn.name}" is named twice in this registration'
                else:
                    hint = (
                        " (for a per-agent variant, register it into that agent's scope instead)"
                        if scope == GLOBAL
                        else " in this scope"
                    )
                    message = f'tool "{defn.name}" is already registered{hint}'
                raise already_exists(
                    "TOOL_ALREADY_REGISTERED", message, tool=defn.name, scope=scope
                )
            seen.add(defn.name)
        for defn in batch:
            layer.tools[defn.name] = defn
        self._changed()
        return batch

    def unregister(self, scope: str, defn: ToolDefinition) -> bool:
        """Removes exactly this registration (a later one under the same name survives)."""
        layer = self._layers.get(scope)
        if layer is None or layer.tools.get(defn.name) is not defn:
            return False
        del layer.tools[defn.name]
        self._changed()
        return True

    async def add_restriction(
        self, scope: str, allow: Iterable[str] | None, deny: Iterable[str] | None
    ) -> str:
        return await self._change(lambda: self._add_restriction(scope, allow, deny))

    async def _add_restriction(
        self, scope: str, allow: Iterable[str] | None, deny: Iterable[str] | None
    ) -> str:
        self.require_scope(scope, allow_global=False)
        allow_set = frozenset(allow) if allow is not None else None
        deny_set = frozenset(deny) if deny is not None else None
        if allow_set is None and deny_set is None:
            raise invalid_argument(
                "EMPTY_RESTRICTION", "a restriction with neither allow nor deny is a no-op"
            )
        named = (allow_set or frozenset()) | (deny_set or frozenset())
        if RUN_CODE in named:
            raise invalid_argument(
                "RESERVED_TOOL_NAME",
                'a restriction cannot name the reserved Code Mode transport "run_code"; '
                "restrict end-capability tools instead",
            )
        restrictable = self.view(scope).restrictable_names
        unknown = sorted(named - restrictable)
        if unknown:
            known = ", ".join(f'"{n}"' for n in sorted(restrictable)) or "(none)"
            listed = ", ".join(f'"{n}"' for n in unknown)
            raise invalid_argument(
                "UNKNOWN_RESTRICTION_TARGET",
                f"restriction names unknown inherited tool(s) {listed}; known inherited "
                f"tools: {known}",
            )
        restriction_id = new_restriction_id()
        await self._write(
            [
                PutRestriction(
                    RestrictionRow(scope, restriction_id, _sorted(allow_set), _sorted(deny_set))
                )
            ]
        )
        self._layers[scope].restrictions[restriction_id] = Restriction(allow_set, deny_set)
        self._changed()
        return restriction_id

    async def remove_restriction(self, scope: str, restriction_id: str) -> None:
        async def attempt() -> None:
            self.require_scope(scope, allow_global=False)
            if not restriction_id:
                raise invalid_argument(
                    "MISSING_RESTRICTION_ID", "restriction_id is required", field="restriction_id"
                )
            if restriction_id not in self._layers[scope].restrictions:
                raise not_found(
                    "RESTRICTION_NOT_FOUND",
                    f"restriction {restriction_id!r} does not exist in {scope!r}",
                )
            await self._write([DeleteRestriction(scope, restriction_id)])
            del self._layers[scope].restrictions[restriction_id]
            self._changed()

        await self._change(attempt)

    # -- policy hooks --------------------------------------------------------------------------

    def hooks(self, scope: str) -> PolicyHooks:
        """The hook set of one scope's layer (register into it to scope a hook)."""
        self.require_scope(scope)
        return self._layers[scope].hooks

    def chain_hooks(self, agent: str | None) -> list[PolicyHooks]:
        """Hook sets that observe a call by `agent`: global first, then farthest → nearest."""
        keys = [GLOBAL, *reversed(self.chain(agent))] if agent else [GLOBAL]
        return [self._layers[k].hooks for k in keys if k in self._layers]

    def guards(self, agent: str | None) -> list[Guard]:
        return [g for hooks in self.chain_hooks(agent) for g in hooks.guards]

    # -- the view ------------------------------------------------------------------------------

    def view(self, scope: str) -> View:
        """The scope's view; cached until the next change (every call resolves through it)."""
        cached = self._views.get(scope)
        if cached is None:
            cached = self._views[scope] = self._compute_view(scope)
        return cached

    def _compute_view(self, scope: str) -> View:
        chain = self.chain(scope)
        own_key = chain[0] if chain else GLOBAL
        inherited: dict[str, ToolDefinition] = {}
        origin: dict[str, str] = {}
        self_modification = self.self_modification_for(scope)
        if self_modification:
            inherited.update(self._cordis_tools)
        for key in [GLOBAL, *reversed(chain)]:
            if key == own_key and key != GLOBAL:
                continue
            inherited.update(self._layers[key].tools)
            origin.update(dict.fromkeys(self._layers[key].tools, key))
        restrictions = [r for key in chain for r in self._layers[key].restrictions.values()]
        own = self._layers[own_key].tools if own_key != GLOBAL else {}
        visible = {
            name: defn
            for name, defn in inherited.items()
            if name not in own and all(r.admits(name) for r in restrictions)
        }
        visible.update(own)
        origin.update(dict.fromkeys(own, own_key))
        mode = self.mode_for(scope)
        if mode is not Mode.NATIVE:
            visible[RUN_CODE] = self._run_code
        return View(
            scope=scope,
            mode=mode,
            language=self.language_for(scope),
            visible=visible,
            registered_in={name: origin.get(name, GLOBAL) for name in visible},
            known_names=tuple(dict.fromkeys([*inherited, *own])),
            restrictable_names=frozenset(inherited),
            self_modification=self_modification,
        )

    def get(self, name: str, scope: str) -> ToolDefinition | None:
        return self.view(scope).visible.get(name)

    def collapses(self, name: str, scope: str, nested: bool) -> bool:
        """Under `code`, a model-direct call may only name run_code."""
        return not nested and name != RUN_CODE and self.mode_for(scope) is Mode.CODE

    def resolve_execution(self, name: str, scope: str, nested: bool) -> ToolDefinition | None:
        if self.collapses(name, scope, nested):
            return None
        return self.get(name, scope)


def _merge(stored: ScopeRow, declared: ScopeRow) -> ScopeRow:
    """A settings-declared scope over its stored row (see `Catalog.restore`)."""
    return replace(
        stored,
        preset=declared.preset,
        mode=declared.mode if declared.mode is not None else stored.mode,
        language=declared.language if declared.language is not None else stored.language,
        self_modification=(
            declared.self_modification
            if declared.self_modification is not None
            else stored.self_modification
        ),
        mcp_servers=declared.mcp_servers or stored.mcp_servers,
    )


def _sorted(names: frozenset[str] | None) -> tuple[str, ...] | None:
    return None if names is None else tuple(sorted(names))


def _paginate(names: list[str], page_size: int, page_token: str, collection: str) -> Page:
    """A page of `names` after the token's name. A token only continues a listing of the
    collection that issued it (another one's would silently restart from the top)."""
    if page_size < 0:
        raise invalid_argument("INVALID_PAGE_SIZE", "page_size must not be negative")
    size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    after = ""
    if page_token:
        try:
            after = base64.urlsafe_b64decode(page_token.encode()).decode()
        except (ValueError, UnicodeDecodeError):
            after = ""
        if not after.startswith(collection):
            raise invalid_argument("INVALID_PAGE_TOKEN", "page_token is not a valid page token")
    start = bisect.bisect_right(names, after) if after else 0
    items = names[start : start + size]
    more = start + size < len(names)
    token = base64.urlsafe_b64encode(items[-1].encode()).decode() if more and items else ""
    return Page(items=items, next_page_token=token)
