"""Which runtime language a non-native presentation renders for.

Until the runtime service reports its capabilities, the languages are configured
(`runtime_languages`); an empty list means no runtime. Native presentation needs no runtime and
never consults the language.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from codemode_wire.errors import CodemodeError, failed_precondition
from registry_service.domain.scopes import Mode
from registry_service.presentation.language_profiles import NO_RUNTIME_LANGUAGE, PROFILES

KNOWN_LANGUAGES: Final = tuple(sorted(PROFILES))


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def no_runtime(mode: Mode) -> CodemodeError:
    return failed_precondition(
        "CODE_RUNTIME_UNAVAILABLE",
        f'mode "{mode.value}" requires a code runtime — configure runtime_languages or set the '
        'mode to "native"',
        mode=mode.value,
    )


def resolve_language(mode: Mode, configured: Sequence[str], requested: str) -> str:
    """The language to render a non-native presentation for: `requested`, else the first one.

    Raises FAILED_PRECONDITION naming the mode and the language when there is no runtime, when
    the runtime does not serve the requested language, or when no renderer exists for it.
    """
    if not configured:
        raise no_runtime(mode)
    language = requested or configured[0]
    if language not in configured:
        raise failed_precondition(
            "RUNTIME_LANGUAGE_NOT_CONFIGURED",
            f'mode "{mode.value}": runtime language "{language}" is not configured '
            f"(configured: {_quoted(configured)})",
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
