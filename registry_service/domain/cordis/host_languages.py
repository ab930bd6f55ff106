"""What Cordis needs to know of the program language a host half is written in.

A host half is in its owner's program language's host language: that language itself, or the
full language a subset's host halves are written in. Cordis describes that language's façade
to the model (`Builtin.listBuiltins`) and names the language in a define-time syntax refusal
(the check itself is a runtime's: `source_checks.py`), but names no language itself: the
registry's language profiles answer all three
(`registry_service/presentation/language_profiles/`), handed in when the registry is composed.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias

# One façade symbol as the model reads it: (name, signature, description).
FacadeSymbol: TypeAlias = tuple[str, str, str]
Facade: TypeAlias = tuple[FacadeSymbol, ...]


class HostLanguages(Protocol):
    """The host-half side of the registry's program languages."""

    def host_language(self, language: str) -> str:
        """The language the host halves of an agent in program language `language` are
        written in, checked in and run in."""
        ...

    def facade(self, language: str) -> Facade:
        """What a host half in `language` can reach, with its signatures in that language."""
        ...

    def title(self, language: str) -> str:
        """The language's name as the model reads it ("Python")."""
        ...
