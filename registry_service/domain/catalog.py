"""The tool catalog: layered registrations, restrictions, guards, hooks and presentation modes.

One traversal (`view`) feeds listing, presentation and execution, so what the model is shown and
what the executor accepts cannot drift apart (reference §1.3). Every registration lives in the
layer of the scope it was made in; deleting the scope drops the layer, which revokes exactly what
it held.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from codemode_wire.errors import (
    already_exists,
    failed_precondition,
    invalid_argument,
    not_found,
)
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

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000


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


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    create_time: float


@dataclass(frozen=True, slots=True)
class Agent:
    name: str
    preset: str  # "" when unparented
    create_time: float


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
        default_language: str = "python",
        *,
        default_self_modification: bool = False,
    ) -> None:
        self.default_mode = default_mode
        self.default_self_modification = default_self_modification
        # The seven Cordis tools (installed once by the registry): visible wherever
        # self-modification is in force, as if inherited from an overlay below the global layer.
        self._cordis_tools: dict[str, ToolDefinition] = {}
        self._delete_listeners: list[Callable[[str], None]] = []
        # Not checked here: the deployment's first runtime language is the default even when
        # no flavour exists for it, and then every non-native assembly says so (§1.9).
        self.default_language = default_language
        self._run_code = run_code
        self._layers: dict[str, Layer] = {GLOBAL: Layer()}
        self._presets: dict[str, Preset] = {}
        self._agents: dict[str, Agent] = {}
        self._restriction_ids = itertools.count(1)
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

    def create_preset(
        self,
        preset_id: str,
        mode: Mode | None,
        language: str | None = None,
        self_modification: bool | None = None,
    ) -> Preset:
        check_id("preset", preset_id)
        if language is not None:
            check_language(language)
        name = f"presets/{preset_id}"
        if name in self._presets:
            raise already_exists("PRESET_EXISTS", f"preset {name!r} already exists", preset=name)
        preset = Preset(name=name, create_time=time.time())
        self._presets[name] = preset
        self._layers[name] = Layer(
            mode=mode, language=language, self_modification=self_modification
        )
        self._changed()
        return preset

    def create_agent(
        self,
        agent_id: str,
        preset: str,
        mode: Mode | None,
        language: str | None = None,
        self_modification: bool | None = None,
    ) -> Agent:
        check_id("agent", agent_id)
        if language is not None:
            check_language(language)
        name = f"agents/{agent_id}"
        if preset:
            parse_name(preset, allow=("presets",))
            self.get_preset(preset)
        if name in self._agents:
            raise already_exists("AGENT_EXISTS", f"agent {name!r} already exists", agent=name)
        agent = Agent(name=name, preset=preset, create_time=time.time())
        self._agents[name] = agent
        self._layers[name] = Layer(
            mode=mode, language=language, self_modification=self_modification
        )
        self._changed()
        return agent

    def get_preset(self, name: str) -> Preset:
        parse_name(name, allow=("presets",))
        preset = self._presets.get(name)
        if preset is None:
            raise not_found("PRESET_NOT_FOUND", f"preset {name!r} does not exist", preset=name)
        return preset

    def get_agent(self, name: str) -> Agent:
        parse_name(name, allow=("agents",))
        agent = self._agents.get(name)
        if agent is None:
            raise not_found("AGENT_NOT_FOUND", f"agent {name!r} does not exist", agent=name)
        return agent

    def list_presets(self, page_size: int, page_token: str) -> tuple[list[Preset], str]:
        page = _paginate(sorted(self._presets), page_size, page_token, "presets/")
        return [self._presets[n] for n in page.items], page.next_page_token

    def list_agents(self, page_size: int, page_token: str) -> tuple[list[Agent], str]:
        page = _paginate(sorted(self._agents), page_size, page_token, "agents/")
        return [self._agents[n] for n in page.items], page.next_page_token

    def delete_preset(self, name: str, *, force: bool = False) -> None:
        """Removes the preset and everything it declared. Its agents, if `force` allows it,
        are unparented: the deployment default applies to them again."""
        self.get_preset(name)
        users = sorted(a.name for a in self._agents.values() if a.preset == name)
        if users and not force:
            raise failed_precondition(
                "PRESET_IN_USE",
                f"preset {name!r} still has agents parented under it: {', '.join(users)} "
                "(delete with force to unparent them)",
                preset=name,
            )
        for agent in users:
            self._agents[agent] = replace(self._agents[agent], preset="")
        del self._presets[name]
        del self._layers[name]
        self._changed()
        self._deleted(name)

    def delete_agent(self, name: str) -> None:
        self.get_agent(name)
        del self._agents[name]
        del self._layers[name]
        self._changed()
        self._deleted(name)

    def require_scope(self, scope: str, *, allow_global: bool = True) -> str:
        """Validates that `scope` names an existing scope."""
        parse_scope(scope, allow_global=allow_global)
        if scope.startswith("presets/"):
            self.get_preset(scope)
        elif scope.startswith("agents/"):
            self.get_agent(scope)
        return scope

    # -- modes ---------------------------------------------------------------------------------

    def declared_mode(self, scope: str) -> Mode | None:
        return self._layers[scope].mode

    def set_mode(self, scope: str, mode: Mode) -> None:
        self.require_scope(scope, allow_global=False)
        layer = self._layers[scope]
        if layer.mode is not None:
            raise failed_precondition(
                "MODE_ALREADY_DECLARED",
                f'presentation mode "{mode.value}" conflicts with "{layer.mode.value}" already '
                "declared for this scope; one scope selects one presentation",
                scope=scope,
            )
        layer.mode = mode
        self._changed()

    # -- program languages ---------------------------------------------------------------------

    def declared_language(self, scope: str) -> str | None:
        return self._layers[scope].language

    def language_for(self, scope: str) -> str:
        """The program language in force: the nearest declaration, else the default."""
        for key in self.chain(scope):
            language = self._layers[key].language
            if language is not None:
                return language
        return self.default_language

    # -- self-modification (dynamic Cordis) -------------------------------------------------

    def declared_self_modification(self, scope: str) -> bool | None:
        return self._layers[scope].self_modification

    def self_modification_for(self, scope: str) -> bool:
        """Self-modification in force: the nearest declaration, else the deployment default."""
        for key in self.chain(scope):
            declared = self._layers[key].self_modification
            if declared is not None:
                return declared
        return self.default_self_modification

    def chain(self, scope: str) -> list[str]:
        """Scope keys nearest-first, excluding the global layer."""
        if scope.startswith("agents/"):
            agent = self._agents[scope]
            return [scope, agent.preset] if agent.preset else [scope]
        return [scope] if scope else []

    def mode_for(self, scope: str) -> Mode:
        for key in self.chain(scope):
            mode = self._layers[key].mode
            if mode is not None:
                return mode
        return self.default_mode

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

    def add_restriction(
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
        restriction_id = f"r{next(self._restriction_ids)}"
        self._layers[scope].restrictions[restriction_id] = Restriction(allow_set, deny_set)
        self._changed()
        return restriction_id

    def remove_restriction(self, scope: str, restriction_id: str) -> None:
        self.require_scope(scope, allow_global=False)
        if not restriction_id:
            raise invalid_argument(
                "MISSING_RESTRICTION_ID", "restriction_id is required", field="restriction_id"
            )
        if self._layers[scope].restrictions.pop(restriction_id, None) is None:
            raise not_found(
                "RESTRICTION_NOT_FOUND",
                f"restriction {restriction_id!r} does not exist in {scope!r}",
            )
        self._changed()

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
        """Under `code`, a model-direct call may only name run_code (reference §1.7)."""
        return not nested and name != RUN_CODE and self.mode_for(scope) is Mode.CODE

    def resolve_execution(self, name: str, scope: str, nested: bool) -> ToolDefinition | None:
        if self.collapses(name, scope, nested):
            return None
        return self.get(name, scope)


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
