"""What Cordis needs to know of the program language a host half is written in.

A host half is in its owner's program language. Cordis describes that language's façade to the
model (`Builtin.listBuiltins`) and checks a host half's syntax at define time, but names no
language itself: the registry's language profiles answer both
(`registry_service/presentation/language_profiles/`), handed in when the registry is composed.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias

# One façade symbol as the model reads it: (name, signature, description).
FacadeSymbol: TypeAlias = tuple[str, str, str]
Facade: TypeAlias = tuple[FacadeSymbol, ...]


class HostLanguages(Protocol):
    """The host-half side of the registry's program languages."""

    def facade(self, language: str) -> Facade:
        """What a host half in `language` can reach, with its signatures in that language."""
        ...

    async def check_host(self, language: str, source: str) -> None:
        """Raises `CordisError` when `source` is not a host half in `language`; a language
        without a check accepts every source (the plugin host reports what it cannot load)."""
        ...
