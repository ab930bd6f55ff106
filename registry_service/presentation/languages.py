"""Which runtime language a non-native presentation renders for.

The languages served are what the connected runtimes report (`GetCapabilities`), asked by the
runtime client; `runtime_languages`, when set, restricts them (and orders them: the first is
the default). A registry with no runtime to ask (no `runtime_targets`, or a runtime port that
reports nothing) takes `runtime_languages` as given, `["python"]` when unset; an empty list
means no runtime. Native presentation needs no runtime and never consults the language.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from codemode_wire.errors import CodemodeError, failed_precondition
from registry_service.domain.scopes import Mode
from registry_service.presentation.language_profiles import LANGUAGES, NO_RUNTIME_LANGUAGE, PROFILES

KNOWN_LANGUAGES: Final = tuple(sorted(PROFILES))
KNOWN_ORDER: Final = LANGUAGES
"""Every language with a profile, the default first."""


# What a registry with no runtime to ask serves when `runtime_languages` is unset.
UNASKED_DEFAULT: Final = LANGUAGES[:1]


@dataclass(frozen=True, slots=True)
class ServedLanguages:
    """The languages a presentation may render for and a run may use, default first."""

    languages: tuple[str, ...]
    restriction: tuple[str, ...] | None = None
    """`runtime_languages` when set."""
    asked: bool = False
    """Whether the languages came from the runtimes (False: configured only)."""

    @classmethod
    def configured(cls, languages: Sequence[str]) -> ServedLanguages:
        return cls(tuple(languages), tuple(languages))


@runtime_checkable
class LanguageSource(Protocol):
    """A runtime port that says which languages its runtimes serve (the gRPC one asks them)."""

    def served_languages(self) -> tuple[str, ...] | None:
        """What the runtimes last reported, union over them; None: none has answered yet."""
        ...

    async def learn_languages(self) -> None:
        """Ask the runtimes now (bounded by the start timeout); never raises."""
        ...


class RuntimeLanguages:
    """The served languages of a deployment: the runtimes' report under the restriction."""

    def __init__(
        self, restriction: Sequence[str] | None, source: LanguageSource | None = None
    ) -> None:
        self._restriction = None if restriction is None else tuple(restriction)
        self._source = source

    def snapshot(self) -> ServedLanguages:
        if self._source is None:
            configured = UNASKED_DEFAULT if self._restriction is None else self._restriction
            return ServedLanguages.configured(configured)
        reported = self._source.served_languages()
        if reported is None:
            # No runtime has answered (none reachable yet): the language is not what is wrong,
            # so nothing is refused for it here; a run then reports the outage (UNAVAILABLE).
            unknown = KNOWN_ORDER if self._restriction is None else self._restriction
            return ServedLanguages(unknown, self._restriction)
        if self._restriction is not None:
            reported = tuple(name for name in self._restriction if name in reported)
        return ServedLanguages(reported, self._restriction, asked=True)

    async def ensure_known(self) -> None:
        """Before a presentation or a run: ask the runtimes when none has answered yet."""
        if self._source is not None and self._source.served_languages() is None:
            await self._source.learn_languages()


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def no_runtime(mode: Mode) -> CodemodeError:
    return failed_precondition(
        "CODE_RUNTIME_UNAVAILABLE",
        f'mode "{mode.value}" requires a code runtime — configure runtime_languages or set the '
        'mode to "native"',
        mode=mode.value,
    )


def resolve_language(mode: Mode, served: ServedLanguages | Sequence[str], requested: str) -> str:
    """The language to render a non-native presentation for: `requested`, else the first one.

    Raises FAILED_PRECONDITION naming the mode and the language when there is no runtime, when
    `runtime_languages` excludes the language, when no connected runtime serves it (naming the
    ones served), or when no renderer exists for it.
    """
    if not isinstance(served, ServedLanguages):
        served = ServedLanguages.configured(served)
    languages = served.languages
    if not languages and not served.asked:
        raise no_runtime(mode)
    language = requested or (languages[0] if languages else "")
    restriction = served.restriction
    if restriction is not None and language not in restriction:
        raise failed_precondition(
            "RUNTIME_LANGUAGE_NOT_CONFIGURED",
            f'mode "{mode.value}": runtime language "{language}" is not configured '
            f"(configured: {_quoted(restriction)})",
            mode=mode.value,
            language=language,
        )
    if language not in languages:
        raise failed_precondition(
            "RUNTIME_LANGUAGE_NOT_SERVED",
            f'mode "{mode.value}": runtime language "{language}" is not served by any '
            f"connected code runtime (served: {_quoted(languages) or 'none'})",
            mode=mode.value,
            language=language,
        )
    if language not in PROFILES:
        raise failed_precondition(
            "UNKNOWN_RUNTIME_LANGUAGE",
            f'mode "{mode.value}": no SDK renderer registered for runtime language "{language}" '
            f"(known: {_quoted(KNOWN_LANGUAGES)})",
            mode=mode.value,
            language=language,
        )
    return language


def catalog_language(configured: Sequence[str]) -> str:
    """The flavour of the catalog's run_code definition: the first language when it is known.

    Never fails, so a misconfigured runtime cannot stop the registry from starting; every
    non-native assembly still fails loud through `resolve_language`.
    """
    if configured and configured[0] in PROFILES:
        return configured[0]
    return NO_RUNTIME_LANGUAGE
