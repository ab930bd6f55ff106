"""What the model is shown for one scope: wire schemas, system-prompt sections and the SDK text.

Everything is derived from the catalog's single `view` of the scope, so
the advertisement and the executor cannot drift apart. Rules:

- Wire schemas: `native` → every visible tool; `code` → only `run_code`; `both` → every visible
  tool, then `run_code`. Order: names listed in `tool_order` first (in that order), then the rest
  by name (UTF-16 code units, as the SDK sorts), `run_code` last unless `tool_order` places it.
- Prompt sections `(id, order, text)`: `tools:code-only` (99, only under `code`), one
  `tool:<name>` per visible tool with guidance (120), `tools:sdk` (150, empty when native), plus
  the configured deployment sections. The assemble step then removes every `tool:*` section under
  `code` (the model must not be told to call tools it cannot reach directly), drops
  empty sections and sorts by (order, `tool_order` position of a `tool:*` section, id).
- A `tool_order` entry outside the scope's known names fails assembly.
- A caller is shown only the tools it may call (`domain.tool_access`): given its `ToolAccess`,
  every rule above runs over the scope's view without the others.
- Results are cached per (catalog version, scope, language, the caller's permissions there):
  any registry change bumps the version, so invalidation is automatic. SDK text is
  additionally cached per (language, exact tool definitions), so an unchanged tool set yields
  the very same string after unrelated changes, for every scope that sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from codemode_wire import jsonvalue
from codemode_wire.errors import failed_precondition
from codemode_wire.jsonvalue import JsonValue
from registry_service.domain.catalog import Catalog, View
from registry_service.domain.cordis import prompt as cordis_prompt
from registry_service.domain.scopes import GLOBAL, Mode
from registry_service.domain.sections import Section
from registry_service.domain.tool_access import ToolAccess
from registry_service.domain.tools import RUN_CODE, ToolDefinition
from registry_service.presentation._sdk_common import utf16_sort_key
from registry_service.presentation.language_profiles import PROFILES, host_profile
from registry_service.presentation.languages import ServedLanguages, resolve_language
from registry_service.presentation.lru import Lru
from registry_service.presentation.run_code_schema import run_code_tool_schema
from registry_service.presentation.sdk_model import SdkTool

# `Section` is the domain's (policy prompt hooks take it too), re-exported here.
__all__ = ["Assembler", "PresentationConfig", "Section", "SystemPrompt", "check_config"]

CODE_ONLY_ID: Final = "tools:code-only"
SDK_ID: Final = "tools:sdk"
GUIDANCE_PREFIX: Final = "tool:"
CODE_ONLY_ORDER: Final = 99
GUIDANCE_ORDER: Final = 120  # inside the 100-199 per-tool band, before the SDK
SDK_ORDER: Final = 150
SECTION_SEPARATOR: Final = "\n\n"  # one blank line between sections in the joined text
CODE_ONLY_TEXT: Final = (
    "`run_code` is the only tool you can call directly — a tool call naming any other tool "
    "fails. Reach every tool the SDK below declares from inside a `run_code` program."
)
# Bounded: a 500-tool SDK is ~1 MB of text. Rebuilding a scope whose tool set is unchanged only
# costs a view and a join (the text cache still hits), so the per-scope caches can stay small.
DEFAULT_CACHE_SIZE: Final = 128
DEFAULT_SDK_CACHE_SIZE: Final = 64


@dataclass(frozen=True, slots=True)
class PresentationConfig:
    """Deployment presentation settings (validated on construction)."""

    runtime_languages: tuple[str, ...] = ("python",)
    prompt_sections: tuple[Section, ...] = ()
    tool_order: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_config(self.runtime_languages, self.prompt_sections, self.tool_order)


def check_config(
    languages: Sequence[str], sections: Sequence[Section], tool_order: Sequence[str]
) -> None:
    """Raises ValueError naming the first bad setting."""
    for label, names in (("runtime_languages", languages), ("tool_order", tool_order)):
        if any(not name for name in names):
            raise ValueError(f"{label} entries must be non-empty")
        if len(set(names)) != len(names):
            raise ValueError(f"{label} lists a name twice")
    seen: set[str] = set()
    for section in sections:
        if not section.id:
            raise ValueError("prompt_sections: every section needs a non-empty id")
        if section.id in (CODE_ONLY_ID, SDK_ID) or section.id.startswith(GUIDANCE_PREFIX):
            raise ValueError(
                f'prompt_sections: id "{section.id}" is reserved (tools:code-only, tools:sdk '
                "and tool:<name> are rendered by the registry)"
            )
        if section.id in seen:
            raise ValueError(f'prompt_sections: id "{section.id}" appears twice')
        seen.add(section.id)


@dataclass(frozen=True, slots=True)
class WireSchema:
    name: str
    description: str
    parameters: JsonValue
    parameters_json: str


@dataclass(frozen=True, slots=True)
class WireSchemas:
    mode: Mode
    language: str  # "" when native (no language is consulted)
    schemas: tuple[WireSchema, ...]


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    mode: Mode
    language: str
    sections: tuple[Section, ...]  # non-empty, in order
    text: str


@dataclass(frozen=True, slots=True)
class Sdk:
    mode: Mode
    language: str
    text: str  # "" when native


def assemble(
    sections: Iterable[Section], mode: Mode, tool_order: Sequence[str] = ()
) -> list[Section]:
    """The assemble step: code-mode guidance filtering, empty-section removal, ordering."""
    rank = {name: index for index, name in enumerate(tool_order)}

    def key(section: Section) -> tuple[int, int, bytes]:
        tool = section.id[len(GUIDANCE_PREFIX) :] if _is_guidance(section) else None
        position = rank.get(tool, len(rank)) if tool is not None else len(rank)
        return section.order, position, utf16_sort_key(section.id)

    kept = [
        Section(s.id, s.order, s.text.rstrip())
        for s in sections
        if not (mode is Mode.CODE and _is_guidance(s))
    ]
    return sorted((s for s in kept if s.text), key=key)


def _is_guidance(section: Section) -> bool:
    return section.id.startswith(GUIDANCE_PREFIX)


def ordered_names(names: Iterable[str], tool_order: Sequence[str]) -> list[str]:
    """`tool_order` names first, then by name; run_code last unless `tool_order` places it."""
    rank = {name: index for index, name in enumerate(tool_order)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n == RUN_CODE, utf16_sort_key(n)))


T = TypeVar("T")
_Key = tuple[int, str, str, frozenset[object] | None]


class Assembler:
    def __init__(
        self,
        catalog: Catalog,
        config: PresentationConfig,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        sdk_cache_size: int = DEFAULT_SDK_CACHE_SIZE,
        served: Callable[[], ServedLanguages] | None = None,
    ) -> None:
        """`served`: the languages served right now (default: `config.runtime_languages`)."""
        self._catalog = catalog
        self.config = config
        configured = ServedLanguages.configured(config.runtime_languages)
        self._served = served or (lambda: configured)
        self._last_served: ServedLanguages | None = None
        self._wire: Lru[_Key, WireSchemas] = Lru(cache_size)
        self._prompts: Lru[_Key, SystemPrompt] = Lru(cache_size)
        self._sdks: Lru[_Key, Sdk] = Lru(cache_size)
        # (language, identities of the rendered definitions) → (definitions, text). Holding the
        # definitions keeps their ids from being reused while the entry lives.
        self._texts: Lru[tuple[str, frozenset[int]], tuple[tuple[ToolDefinition, ...], str]] = Lru(
            sdk_cache_size
        )
        self.renders = 0  # SDK renders performed (observability for tests and benchmarks)

    # -- public API ------------------------------------------------------------------------

    # `access`: what the caller may call there (None: every tool, as with authorization off).

    def wire_schemas(
        self, scope: str, language: str = "", access: ToolAccess | None = None
    ) -> WireSchemas:
        return self._cached(self._wire, scope, language, access, self._build_wire)

    def system_prompt(
        self, scope: str, language: str = "", access: ToolAccess | None = None
    ) -> SystemPrompt:
        return self._cached(self._prompts, scope, language, access, self._build_prompt)

    def sdk(self, scope: str, language: str = "", access: ToolAccess | None = None) -> Sdk:
        return self._cached(self._sdks, scope, language, access, self._build_sdk)

    def code_language(self, scope: str) -> str:
        """The language `run_code` runs in for `scope` ("" when it is effectively native);
        FAILED_PRECONDITION naming the mode and the language when no runtime serves it."""
        self._catalog.require_scope(scope)
        return self._language(self._catalog.view(scope), "")

    # -- building --------------------------------------------------------------------------

    def _cached(
        self,
        cache: Lru[_Key, T],
        scope: str,
        language: str,
        access: ToolAccess | None,
        build: Callable[[View, str], T],
    ) -> T:
        self._catalog.require_scope(scope)
        served = self._served()
        if served != self._last_served:  # what the runtimes serve changed: nothing cached holds
            self._last_served = served
            for stale in (self._wire, self._prompts, self._sdks):
                stale.clear()
        key = (self._catalog.version, scope, language, None if access is None else access.key)
        hit = cache.get(key)
        if hit is None:
            view = self._catalog.view(scope)
            hit = cache.put(key, build(view if access is None else access.restrict(view), language))
        return hit

    def _language(self, view: View, requested: str) -> str:
        """The language to render for: the one asked for, else the scope's own."""
        if view.mode is Mode.NATIVE:
            return ""
        return resolve_language(view.mode, self._served(), requested or view.language)

    def _build_wire(self, view: View, requested: str) -> WireSchemas:
        language = self._language(view, requested)
        self._check_tool_order(view)
        schemas: list[WireSchema] = []
        names = [RUN_CODE] if view.mode is Mode.CODE else list(view.visible)
        for name in ordered_names(names, self.config.tool_order):
            if name == RUN_CODE:
                flavour = run_code_tool_schema(language)
                schemas.append(_wire(name, flavour["description"], flavour["parameters"]))
            else:
                defn = view.visible[name]
                schemas.append(_wire(name, defn.description, defn.input_schema))
        return WireSchemas(view.mode, language, tuple(schemas))

    def _build_sdk(self, view: View, requested: str) -> Sdk:
        language = self._language(view, requested)
        return Sdk(view.mode, language, self._sdk_text(view, language) if language else "")

    def _build_prompt(self, view: View, requested: str) -> SystemPrompt:
        language = self._language(view, requested)
        self._check_tool_order(view)
        sections = [
            *self.config.prompt_sections,
            Section(
                CODE_ONLY_ID, CODE_ONLY_ORDER, CODE_ONLY_TEXT if view.mode is Mode.CODE else ""
            ),
            *(
                Section(f"{GUIDANCE_PREFIX}{name}", GUIDANCE_ORDER, defn.guidance)
                for name, defn in view.visible.items()
                if name != RUN_CODE
            ),
            Section(SDK_ID, SDK_ORDER, self._sdk_text(view, language) if language else ""),
            Section(
                cordis_prompt.SECTION_ID,
                cordis_prompt.SECTION_ORDER,
                # Its host halves are in the agent's program language (also in native mode).
                cordis_prompt.prompt(
                    host_profile(self._catalog.language_for(view.scope)).cordis_host_half
                )
                if view.self_modification
                else "",
            ),
        ]
        assembled = assemble(sections, view.mode, self.config.tool_order)
        for hooks in self._catalog.chain_hooks(view.scope or None):
            for hook in hooks.prompt:
                assembled = list(hook(view.scope, assembled))
        final = tuple(s for s in assembled if s.text)
        text = SECTION_SEPARATOR.join(section.text for section in final)
        return SystemPrompt(view.mode, language, final, text)

    def _sdk_text(self, view: View, language: str) -> str:
        tools = tuple(defn for name, defn in view.visible.items() if name != RUN_CODE)
        key = (language, frozenset(id(defn) for defn in tools))
        hit = self._texts.get(key)
        if hit is not None:
            return hit[1]
        rows = [SdkTool(d.name, d.description, d.input_schema, d.output_schema) for d in tools]
        text = PROFILES[language].render_sdk(rows)
        self.renders += 1
        self._texts.put(key, (tools, text))
        return text

    def _check_tool_order(self, view: View) -> None:
        order = self.config.tool_order
        if not order:
            return
        if view.mode is Mode.CODE:
            known: tuple[str, ...] = (RUN_CODE,)
        elif view.mode is Mode.BOTH:
            known = (*view.known_names, RUN_CODE)
        else:
            known = view.known_names
        known_set = set(known)
        unknown = [name for name in order if name not in known_set]
        if unknown:
            where = f'scope "{view.scope}"' if view.scope != GLOBAL else "the global scope"
            listed = ", ".join(f'"{n}"' for n in unknown)
            known_list = ", ".join(f'"{n}"' for n in sorted(known, key=utf16_sort_key))
            raise failed_precondition(
                "TOOL_ORDER_UNKNOWN_TOOL",
                f'mode "{view.mode.value}": tool_order lists tool(s) unknown to {where}: '
                f"{listed}; known tools: {known_list or '(none)'}",
                mode=view.mode.value,
                scope=view.scope,
            )


def _wire(name: str, description: str, parameters: JsonValue) -> WireSchema:
    return WireSchema(name, description, parameters, jsonvalue.dumps(parameters))
