"""The registry's program languages: one `LanguageProfile` per language, in one table.

A profile (`profile.py`) holds everything the registry renders differently per language: the
`tools:sdk` renderer, the `run_code` schema flavour, the Host-half paragraph of the `tool:cordis`
prompt, the plugin host façade as described to the model, and the title a define-time syntax
refusal names the language by (the check itself is a runtime's `CheckSource`). Every other
registry module takes what it needs from here and names no language itself.

Why the table lives in `presentation` and the domain only receives plain data: a profile holds
the SDK renderers, which are presentation (`sdk_python`, `sdk_typescript`), and refers to the
domain's prompt text; dependencies go one way, presentation → domain. So the
domain never imports a profile: the catalog is given the language names (`LANGUAGES`) and the
default, and Cordis is given `HOST_LANGUAGES` (the façade and title per language,
through the `HostLanguages` protocol it declares in `domain/cordis/host_languages.py`), both
when `registry_service/registry.py` composes the registry.

Which languages a deployment's runtimes serve is a separate question (`runtime_languages`,
`presentation/languages.py`): a profile says how a language is presented once it is served.

To add a language: a module beside `python.py` with its `PROFILE`, its SDK renderer module
(`presentation/sdk_<language>.py`), and one entry in `_ALL` below.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from registry_service.domain.cordis.host_languages import Facade
from registry_service.presentation.language_profiles import monty, python, typescript
from registry_service.presentation.language_profiles.profile import (
    LanguageProfile,
    RunCodeFlavour,
    SdkRenderer,
)

__all__ = [
    "HOST_LANGUAGES",
    "LANGUAGES",
    "NO_RUNTIME_LANGUAGE",
    "PROFILES",
    "LanguageProfile",
    "RunCodeFlavour",
    "SdkRenderer",
    "host_profile",
]

_ALL: Final = (python.PROFILE, typescript.PROFILE, monty.PROFILE)

PROFILES: Final[Mapping[str, LanguageProfile]] = MappingProxyType({p.name: p for p in _ALL})
LANGUAGES: Final = tuple(PROFILES)  # the program languages a scope may declare, in table order

# With no runtime configured, the catalog's own run_code definition and the deployment default
# language take this one, the original product's language.
NO_RUNTIME_LANGUAGE: Final = typescript.PROFILE.name
# A host half's guidance and façade for a language without a profile (a runtime language the
# deployment lists that the registry does not know): the one the product started with.
_HOST_FALLBACK: Final = python.PROFILE


def host_profile(language: str) -> LanguageProfile:
    """The profile whose Host-half guidance and façade an agent in `language` is shown."""
    return PROFILES.get(language, _HOST_FALLBACK)


class _HostLanguages:
    """`domain.cordis.host_languages.HostLanguages` answered from the table."""

    def host_language(self, language: str) -> str:
        profile = PROFILES.get(language)
        return profile.host_language or language if profile is not None else language

    def facade(self, language: str) -> Facade:
        return host_profile(language).facade

    def title(self, language: str) -> str:
        profile = PROFILES.get(language)
        return profile.title if profile is not None else language


HOST_LANGUAGES: Final = _HostLanguages()
