"""The one table of the languages a runtime can serve.

A runtime serves every registered backend its host can run (``LanguageBackend.unavailable``):
one pool each, one capabilities entry each. The first registered is the default language (what
a run that names none gets). Python and TypeScript are registered here; a backend registered
later (a test's, ``register``) is served by runtimes created after it.

Opt-in backends (``OPTIONAL``: Monty) are known here but registered only when a runtime's
``languages`` setting names one (``enable``), so that a runtime left at its defaults serves
exactly what it served before.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime_service.languages import monty, python, typescript
from runtime_service.languages.backend import LanguageBackend

__all__ = [
    "DEFAULT_LANGUAGE",
    "OPTIONAL",
    "backend",
    "backends",
    "default_backend",
    "enable",
    "register",
]

_TABLE: dict[str, LanguageBackend] = {}


def register(backend: LanguageBackend) -> Callable[[], None]:
    """Serve ``backend`` from runtimes created from now on; returns what unregisters it. A
    name already registered is refused (a backend replaces none)."""
    name = backend.name
    if not name or name in _TABLE:
        raise ValueError(f"language {name!r} is already registered or has no name")
    _TABLE[name] = backend

    def unregister() -> None:
        if _TABLE.get(name) is backend and name != DEFAULT_LANGUAGE:
            del _TABLE[name]

    return unregister


def enable(names: tuple[str, ...] | list[str]) -> None:
    """Register each opt-in backend ``names`` names that is not registered yet."""
    for name in names:
        optional = OPTIONAL.get(name)
        if optional is not None and name not in _TABLE:
            register(optional)


def backends() -> tuple[LanguageBackend, ...]:
    """Every registered backend, the default language's first."""
    return tuple(_TABLE.values())


def backend(name: str) -> LanguageBackend | None:
    return _TABLE.get(name)


def default_backend() -> LanguageBackend:
    return _TABLE[DEFAULT_LANGUAGE]


OPTIONAL: dict[str, LanguageBackend] = {monty.NAME: monty.BACKEND}
"""Backends served only where a runtime's ``languages`` setting names them."""

register(python.BACKEND)
register(typescript.BACKEND)
DEFAULT_LANGUAGE = python.NAME
"""The language of a run or plugin host that names none (protobuf's empty string)."""
